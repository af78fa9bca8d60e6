"""The lab's algorithm specs (``NAME[:variant]...``, ``recipes/lab/compare.py``): the variants and the settings each
changes, and the algorithms' own lab settings (``LAB_PROFILES``)."""

import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dare.algos import get_algorithm, known  # noqa: E402
from dare.sampling import fast_decoding  # noqa: E402

# NAME:lab: an algorithm's own settings where the shared ones (lr 1e-3) do not make it learn, each found by a
# learning-rate sweep on seeds that are never reported (7; the lab reports 0-2; docs/lab.md)
LAB_PROFILES = {
    # the wave-4 LLaDA start (0.176), seed 7, held-out gain: 1e-3 +0.087, 3e-4 +0.091, 1e-4 +0.059
    "bgpo": {"learning_rate": 3e-4},
    "espo": {"learning_rate": 3e-4},  # the same start, seed 7: 1e-3 +0.099, 3e-4 +0.111, 1e-4 +0.073
    # LLaDA's start of wave 3 (0.164), seed 7: 1e-4 +7.6 SE, 3e-5 +5.8 SE (seeds 0-1 at 1e-3 and 2 of 3 at 3e-4
    # collapse to 0); an older start, seed 1: 1e-3 -0.013, 3e-4 +0.088 (11 SE), collapse at 3e-3
    "spg": {"learning_rate": 1e-4},
    # the wave-3 LLaDA start (0.164) at 1e-3: seeds 0 and 2 +9.8 / +10.1 SE, seed 1 collapses (-17.3 SE); seed 7 at
    # 3e-4: +7.0 SE
    "coupled-grpo": {"learning_rate": 3e-4},
    "cj-grpo": {"learning_rate": 3e-4},  # the same start at 1e-3: seed 0 +13.2 SE, seed 1 -6.7 SE
    # the LLaDA start of stop 65 (0.197), seed 0: 1e-3 +1.1 SE (without the accuracy filter it rises, then collapses:
    # -11.7 SE; its gradient norms reach 0.8, d1's 0.08), 3e-4 +14.4 SE
    "unigrpo": {"learning_rate": 3e-4},
    "ebpo": {"learning_rate": 1e-4},  # SDAR seed 0 at 1e-3 collapses after ~70 rollouts; at 1e-4 +0.140 (18 SE)
    "gdpo": {"learning_rate": 3e-4},  # the same start, seed 7: 1e-3 +0.059, 3e-4 +0.090, 1e-4 +0.072
    # seed 7, training reward over 60 rollouts: the negative-sample baseline collapses at 1e-4 to 1e-3 (alpha 0.1 and
    # 1, either tilt: 0.18 -> 0.05-0.11; held-out at 1e-4 -3.1 SE); the mean baseline holds and rises at 1e-3 (0.197
    # -> 0.223), dips at 3e-3 and collapses at 1e-2
    "dmpo": {"algo_config": {"baseline": "mean"}},
    # offline (its learning rate is the offline one), per family, from the wave-3 starts. SDAR, seed 7: 3e-4 -7.3 SE,
    # 3e-5 +6.9 SE (1e-4, seeds 0-2: -1.2 SE). LLaDA keeps 1e-4 (seeds 0-2: +2.1 SE): 3e-4, +3.0 SE on seed 7, gave
    # -0.3 / -0.5 / -5.8 SE on seeds 0-2
    "vrpo": {"families": {"sdar": {"learning_rate": 3e-5}}},
}
VARIANTS = ("control", "paper", "lab", "value", "ahead", "fast", "kl")
KL_BETA = 0.04  # NAME:kl: d1's paper value (the lab's algorithms otherwise run without a KL term, as their code does)


def split_spec(spec: str) -> tuple[str, list[str]]:
    """``NAME[:variant]...`` as the name and its variants (e.g. ``tracerl:value:control``)."""
    name, *variants = spec.split(":")
    return name, variants


def profile(spec: str, family: str | None = None) -> dict:
    """The settings a spec's variants change: ``paper``: the ``algo_config`` and ``rollout`` sections of
    ``recipes/llada/<name>_math_paper.yaml`` (the paper's values where DARE's recipe follows the reference
    implementation); ``lab``: the algorithm's entry in ``LAB_PROFILES`` (its own settings, found by a sweep; those
    under ``families`` for ``family`` only);
    ``value``: its value model on (``value.model: policy``, its AdamW at the lab's learning rate); ``ahead``: each
    rollout decoded one cycle ahead of training (``train_rl.py --rollout-mode ahead``); ``fast``: ``FAST_DECODING``
    for the family's kind."""
    name, variants = split_spec(spec)
    out = {}
    for variant in variants:
        if variant == "lab":
            if name not in LAB_PROFILES:
                raise SystemExit(f"no lab profile for {name}: LAB_PROFILES has {sorted(LAB_PROFILES)}")
            entry = LAB_PROFILES[name]
            found = {k: v for k, v in entry.items() if k != "families"} | entry.get("families", {}).get(family, {})
        elif variant == "paper":
            path = ROOT / "recipes" / "llada" / f"{name}_math_paper.yaml"
            if not path.exists():
                raise SystemExit(f"no paper profile for {name}: {path} does not exist")
            values = yaml.safe_load(path.read_text())
            found = {k: values.get(k) or {} for k in ("algo_config", "rollout")}
        elif variant == "ahead":
            found = {"rollout_mode": "ahead"}
        elif variant == "fast":
            found = {"rollout": fast_rollout(family)}
        elif variant == "kl":
            algorithm = get_algorithm(name)
            if "beta" not in algorithm.__dataclass_fields__ or algorithm.trainer == "preference":
                raise SystemExit(f"{name} has no KL term to the start (a preference method's beta is its temperature)")
            found = {"algo_config": {"beta": KL_BETA}}
        elif variant == "value":
            if "value" not in get_algorithm(name).__dataclass_fields__:
                raise SystemExit(f"{name} has no value model (no value field)")
            # its own AdamW at the lab's policy rate (TraceRL's code: 5e-6, five times its policy's 1e-6)
            found = {"algo_config": {"value": {"model": "policy"}}}  # its learning rate: rl_args
        else:
            continue
        for section, values in found.items():
            out[section] = {**out.get(section, {}), **values} if isinstance(values, dict) else values
    return out


def fast_rollout(family: str | None) -> dict:
    """``dare.sampling.FAST_DECODING`` for ``family`` (None: no family yet, nothing to check)."""
    if family is None:
        return {}
    from dare.models.loading import load_config

    try:
        return fast_decoding(load_config(f"tiny:{family}")[2])
    except ValueError as e:
        raise SystemExit(str(e)) from None


def set_nested(target, values: dict) -> None:
    """``values`` (nested dicts for nested sections) set on the dataclass ``target``."""
    for knob, value in values.items():
        if isinstance(value, dict):
            set_nested(getattr(target, knob), value)
        else:
            setattr(target, knob, value)


def expand(algos: list[str]) -> list[str]:
    algos = list(dict.fromkeys(s for a in algos for s in (known() + ["d1:control"] if a == "all" else [a])))
    unknown = [a for a in algos if split_spec(a)[0] not in known() or not set(split_spec(a)[1]) <= set(VARIANTS)]
    if unknown:
        raise SystemExit(f"unknown algorithm or variant {unknown}; algorithms: {known()}, variants (combined as "
                         "NAME:v1:v2): NAME:paper (where recipes/llada/NAME_math_paper.yaml exists), NAME:lab "
                         "(LAB_PROFILES in recipes/lab/lab_profiles.py), NAME:value (its value model), NAME:ahead "
                         "(rollouts decoded one cycle ahead of training), NAME:fast (dare.sampling.FAST_DECODING), "
                         f"NAME:kl (a KL term to the start, beta {KL_BETA}) and NAME:control")
    for spec in algos:
        profile(spec)  # a missing paper profile fails before anything runs
    return algos


def supported(spec: str, family: str) -> bool:
    return get_algorithm(split_spec(spec)[0]).supports(family)
