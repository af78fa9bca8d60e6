"""RL algorithms, one file each, registered by name with ``@register("name")``.

``base.Algorithm`` is plain GRPO on a per-token likelihood estimate; an algorithm file subclasses it and changes
only what differs (estimator, advantage, loss, what the rollout records, defaults). Every module in this package is
imported on first lookup, so adding an algorithm is one new file here and one recipe — no edit elsewhere.
"""

from ..registry import Registry
from ..sampling import SamplingConfig

ALGORITHMS = Registry("algorithm", __name__)
register = ALGORITHMS.register
known = ALGORITHMS.known


def get_algorithm(name: str) -> type:
    """The algorithm class registered as ``name`` (a dataclass of its knobs)."""
    return ALGORITHMS.lookup(name)


def matrix(families: tuple[str, ...] | None = None) -> str:
    """The algorithm x family support table (markdown), from the registry: ``python -m dare.algos``. The estimator
    is the one each algorithm plans for a short rollout of a tiny model of its first family (default families:
    ``catalogue.FAMILY_ORDER``)."""
    from ..models.family import CAUSAL_CONTEXT, UNIFORM
    from ..models.loading import load_config  # here, not at the top: --help imports this package
    from .base import CAUSAL_WHY, NOISE_WHY
    from .catalogue import FAMILY_ORDER

    families = families or FAMILY_ORDER

    rows = ["| algorithm | " + " | ".join(families) + " | estimator | advantage | loss on | sglang rollouts |",
            "|---|" + "---|" * (len(families) + 4)]
    for name in known():
        algo = ALGORITHMS[name]()
        cells = ["yes" if algo.supports(f) else "—" for f in families]
        family = load_config(f"tiny:{next(f for f in families if cells[families.index(f)] == 'yes')}")[2]
        sampling = algo.rollout_sampling(family, SamplingConfig(gen_length=8)) if algo.trainer == "rl" else None
        estimator = type(algo.estimator(family, sampling)).__name__
        engine = ("— (hf only)" if algo.needs_sampler else "yes (step records)" if algo.needs_steps else "yes") \
            if algo.trainer == "rl" else "— (offline)"
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {estimator} | {algo.advantage} | {algo.loss_mask} | "
                    f"{engine} |")
    reasons = [f"- {name} —: {ALGORITHMS[name].why_not}" for name in known()
               if ALGORITHMS[name].families is not None and set(families) - set(ALGORITHMS[name].families)]
    blocked = [f for f in families if f in UNIFORM
               and not all("uniform" in ALGORITHMS[name].noises for name in known())]
    reasons += [f"- {f} —: {NOISE_WHY}" for f in blocked]
    reasons += [f"- {f} — (the algorithms that replay steps or need the masked sampler's canvases): {CAUSAL_WHY}"
                for f in families if f in CAUSAL_CONTEXT]
    return "\n".join(rows + ([""] + reasons if reasons else [])) + "\n"
