"""The algorithm-comparison lab: every chosen algorithm x family x seed, RL from one shared SFT start on one generated
task, measured on held-out questions (never trained on) before and after, with a sign-flipped control.

    python recipes/lab/compare.py                                            # d1 and its control on tiny LLaDA, 3 seeds
    python recipes/lab/compare.py --algos all --families llada sdar --seeds 0 1 2 --output-dir outputs/lab
    python recipes/lab/compare.py --algos d1 d1:paper coupled-grpo coupled-grpo:paper --rollouts 40

For each (family, algorithm[:profile]) it reports, mean and standard error over seeds: the held-out reward at T = 1
(``--samples`` completions for each of ``--questions`` questions) before and after, its gain in standard errors, greedy
accuracy before and after, seconds and model forward passes (rollout and training) per optimiser step, and peak
memory during training (resident set on CPU, allocator peak on CUDA).
``NAME:control`` is NAME trained on the negated reward (every advantage flips sign): its reward must fall.
``NAME:paper`` uses the paper's hyper-parameters where they differ from the reference implementation's: the
``algo_config`` and ``rollout`` sections of ``recipes/llada/NAME_math_paper.yaml`` (d1, coupled-grpo, cj-grpo, wd1,
gdpo, agrpo, d2, tracerl, igpo, dmpo). ``NAME:lab`` uses the algorithm's own settings from ``LAB_PROFILES`` (a
learning rate; dmpo's mean baseline) where the shared ones do not make it learn. ``NAME:value`` runs it with its
value model (tracerl). ``NAME:ahead`` decodes each rollout one cycle ahead of training (``--rollout-mode ahead``).
``NAME:fast`` decodes its rollouts with ``dare.sampling.FAST_DECODING``, the fastest decoding that kept its
quality. ``NAME:kl`` adds a KL term to the start (beta 0.04, d1's paper value; the tiny MMaDA's answer breaks
without it on ``task:shapes``).
Variants combine: ``tracerl:value:control``. The generation length comes from the task's
reference answers (a shorter ``--gen-length`` is refused), and a start where fewer than 10 % of the held-out
questions' groups (``--samples`` completions at T = 1) have rewards that differ stops the lab before any RL runs.
Writes ``<output-dir>/comparison.md``, ``comparison.json`` and ``comparison.png``; each finished run keeps its numbers
in its folder's ``result.json``, so an interrupted or extended lab (more seeds, more algorithms) only runs what is new;
``--finished-only`` tabulates what a folder holds so far (each row with the seeds that finished) and runs nothing.
"""

import json
import math
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import tyro
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train_rl  # noqa: E402
import train_sft  # noqa: E402
from dare.algos import get_algorithm, known  # noqa: E402
from dare.data.tasks import write_task  # noqa: E402
from dare.eval.lab import held_out, mean_se, mistake_pairs, paired  # noqa: E402
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


@dataclass
class Lab:
    """RL from one SFT start, many algorithms, held-out before/after (see the module docstring)."""

    # NAME, NAME:paper, NAME:lab, NAME:value, NAME:ahead, NAME:fast, NAME:control, combined as NAME:v1:v2; all = every
    # algorithm
    # and d1:control
    algos: list[str] = field(default_factory=lambda: ["d1", "d1:control"])
    families: list[str] = field(default_factory=lambda: ["llada"])  # tiny random models of these families
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # RL seeds per algorithm (one shared SFT start)
    task: str = "sum4"  # a generated task with disjoint train/test questions (dare/data/tasks.py)
    sft_steps: int | None = None  # SFT of the shared start (None: 1500; diffusion_gemma at most 10000, SFT_STEPS)
    # stop that SFT at the first training loss (mean of 100 steps) below this (None: SFT_STOP_AT_LOSS,
    # diffusion_gemma 0.26; others never)
    sft_stop_at_loss: float | None = None
    sft_lr: float = 3e-3  # SFT learning rate (constant)
    rollouts: int = 90  # rollout batches per RL run (offline algorithms: optimiser steps of prompts_per_step pairs)
    # for NAME:control runs (unlearning is fast; None: 30 at lr 1e-3, proportionally more at a lower rate, at most
    # rollouts)
    control_rollouts: int | None = None
    prompts_per_step: int = 16  # prompts per rollout batch
    num_generations: int = 8  # completions per prompt (the group)
    # RL learning rate (constant, no warm-up; None: the task's, TASK_LEARNING_RATE, else 1e-3)
    learning_rate: float | None = None
    offline_learning_rate: float = 1e-4  # for offline preference optimisation (VRPO falls at 1e-3)
    prompt_masking: float | None = 0.0  # p_prompt of the algorithms that mask prompt tokens (None: their defaults)
    num_iterations: int | None = 1  # passes over each rollout batch for all (None: defaults, espo 8, d-treerpo 12)
    gen_length: int | None = None  # completion tokens in RL and the held-out measure (None: from the task's answers)
    questions: int = 800  # held-out questions
    samples: int = 8  # T = 1 completions per held-out question
    threads: int = 1  # torch threads (1: the same numbers on any core count)
    output_dir: str = "outputs/lab"  # shared start, runs (each reused when rerun) and comparison.{md,json,png}
    # run RL from a start whose groups carry almost no signal (rewards all equal in most groups): a smoke test only
    allow_no_signal: bool = False
    finished_only: bool = False  # tabulate the runs of output_dir that finished (seeds with a result.json); run none

    def __post_init__(self):
        if self.learning_rate is None:
            self.learning_rate = TASK_LEARNING_RATE.get(self.task, 1e-3)
        if self.control_rollouts is None:  # the same distance at a lower rate takes proportionally more steps
            self.control_rollouts = min(self.rollouts, round(30 * 1e-3 / self.learning_rate))
        needed = answer_length(self.task, self.families)
        if self.gen_length is None:
            self.gen_length = needed
        elif self.gen_length < needed:
            raise SystemExit(f"gen_length {self.gen_length} is shorter than {self.task}'s reference answers, which "
                             f"need {needed} tokens (the longest answer and its stop token): no completion could reach "
                             f"its answer and RL would have no signal; use --gen-length {needed} or more")


# SFT steps where a tiny model answers a fifth to a third of sum4's held-out questions at T = 1 (the rest: 1500).
# Tiny DiffusionGemma (uniform noise) sits on a loss plateau near 0.39 and falls off it at a step that depends on the
# seed and the CPU (before 2000 steps for SFT seeds 1 and 3, near 2700 and 4300 for 42 and 2): after 3000 steps its
# held-out reward was 0.04 to 0.76, and RL from a start on the plateau collapses. Its SFT stops instead at the first
# training loss below 0.26 (starts 0.55-0.60 for seeds 42, 2 and 5), 10000 steps at most.
SFT_STEPS = {"diffusion_gemma": 10000}
# the RL rate of a task where 1e-3 does not learn (bench/results/cpu-2026-12-06/lab52, LLaDA, d1, seed 0): sudoku at
# 1e-3 collapses to no answers after ~40 rollouts (0.234 -> 0.000, -28.2 SE); at 3e-4 +3.2 SE (0.234 -> 0.259)
TASK_LEARNING_RATE = {"sudoku": 3e-4}
SFT_STOP_AT_LOSS = {"diffusion_gemma": 0.26}
# families whose lab start also learns the EOS run after the answer (their own recipe leaves it as padding): a tiny
# LLaDA-V from scratch never learns what follows its stop, fills the canvas's tail with answer pieces, and d1 at 1e-3
# then breaks the answer within a step ("The answer isboxedboxed{1}."; bench/results/cpu-2026-12-07/shapes-lab.md).
# A LLaDA-V checkpoint learnt the fill as LLaDA-Instruct.
EOS_TAIL = {"llada_v"}


def row_length(task: str, family: str, rows: int = 4000) -> int:
    """Tokens of the longest SFT row (chat-templated question and reference answer) of the lab's training rows, a
    picture counted as the placeholders it takes (beside its ``<image>`` text's tokens: a bound)."""
    from dare.data.images import IMAGE, load_image
    from dare.data.tasks import make_task
    from dare.models import pictures
    from dare.models.loading import load_config

    config, tokenizer, _ = load_config(f"tiny:{family}")
    reader = pictures(config)

    def placeholders(row):
        seen = [load_image(b) for b in row.get("images") or ()]
        if seen and reader is None:
            raise SystemExit(f"task {task} asks about pictures: tiny:{family} reads none (tiny:llada_v and tiny:mmada "
                             "do)")
        return reader.prompt_length(tokenizer, IMAGE * len(seen), seen) if seen else 0

    return max(len(tokenizer.apply_chat_template(r["prompt"] + [{"role": "assistant", "content": r["extra_info"][
        "solution"]}], tokenize=True, return_dict=False)) + placeholders(r) for r in make_task(task, rows, 0, "train"))


def answer_length(task: str, families: list[str], rows: int = 4000) -> int:
    """Completion tokens the task's longest reference answer needs in the lab's training rows (with its stop token),
    by the families' tokenizers, rounded up to a multiple of 4 (the tiny block families' block)."""
    from dare.data.tasks import make_task
    from dare.models.loading import load_config

    answers = [r["extra_info"]["solution"] for r in make_task(task, rows, 0, "train")]
    longest = max(len(ids) for family in families
                  for ids in load_config(f"tiny:{family}")[1](answers, add_special_tokens=False)["input_ids"])
    return -(-(longest + 1) // 4) * 4


def measure(model_dir: str, lab: Lab) -> dict:
    return held_out(model_dir, lab.task, lab.questions, lab.samples, lab.gen_length)


def start_measure(start: str, family: str, lab: Lab) -> dict:
    """The start's held-out measure, printed and kept beside it (``held_out.json``, per question): a rerun of the
    lab in the same folder (the same settings: ``lab.json``) reuses it."""
    path = Path(start) / "held_out.json"
    if not path.exists():
        path.write_text(json.dumps(measure(start, lab)))
    before = json.loads(path.read_text())
    (reward, se), greedy = mean_se(before["reward_q"]), statistics.fmean(before["greedy_q"])
    mixed = f", with right and wrong answers {statistics.fmean(before['right_wrong_q']):.1%}" \
        if "right_wrong_q" in before else ""  # measures kept by an older lab lack it
    print(f"{family} start on held-out {lab.task}: T=1 reward {reward:.3f} ± {se:.3f}, greedy {greedy:.3f}, groups "
          f"with signal {statistics.fmean(before['spread_q']):.1%}{mixed}", flush=True)
    return before


def sft(family: str, lab: Lab, folder: Path) -> str:
    """SFT of a tiny random model of ``family`` on the task's train split (``folder.parent/data``): the RL start."""
    train = write_task(lab.task, str(folder.parent / "data" / "train.jsonl"), 4000, 0, "train")
    a = train_sft.Args(model=f"tiny:{family}", output_dir=str(folder), max_steps=sft_steps(family, lab),
                       learning_rate=lab.sft_lr, warmup_steps=0.0, lr_scheduler_type="constant",
                       per_device_train_batch_size=16, logging_steps=100, save_steps=10 ** 6,
                       stop_at_loss=sft_stop_at_loss(family, lab), overwrite_output_dir=True)  # a killed run anew
    a.data.path, a.data.prompt_key, a.data.response_key = train, "prompt", "extra_info.solution"
    a.data.max_length, a.data.pad_to = max(64, row_length(lab.task, family) + 8), "longest"
    a.data.eos_tail = True if family in EOS_TAIL else None
    steps = train_sft.main(a).state.global_step
    (folder / "sft.json").write_text(json.dumps({"steps": steps, "stop_at_loss": a.stop_at_loss}))
    return str(folder)


def sft_steps(family: str, lab: Lab) -> int:
    return lab.sft_steps if lab.sft_steps is not None else SFT_STEPS.get(family, 1500)


def sft_stop_at_loss(family: str, lab: Lab) -> float:
    return lab.sft_stop_at_loss if lab.sft_stop_at_loss is not None else SFT_STOP_AT_LOSS.get(family, 0.0)


def sft_start(family: str, lab: Lab, out: Path) -> str:
    """The lab's shared start of ``family``, trained once per output folder."""
    folder = out / f"sft-{family}"
    return str(folder) if (folder / "model.safetensors").exists() else sft(family, lab, folder)


def rl_args(spec: str, start: str, out: str, seed: int, lab: Lab, family: str | None = None):
    """train_rl.py's arguments for ``NAME[:variant]...`` from ``start`` (a model of ``family``: its lab profile)."""
    name, variants = split_spec(spec)
    control = "control" in variants
    a = train_rl.args_class(name)(model=start, output_dir=out, seed=seed, prompts_per_step=lab.prompts_per_step,
                                  num_generations=lab.num_generations, micro_batch_size=128,
                                  learning_rate=lab.learning_rate, warmup_steps=0.0, lr_scheduler_type="constant",
                                  logging_steps=1, log_completions=0, overwrite_output_dir=True)
    if lab.prompt_masking is not None and hasattr(a.algo_config, "p_prompt"):
        a.algo_config.p_prompt = lab.prompt_masking
    if lab.num_iterations is not None and hasattr(a.algo_config, "num_iterations"):
        a.algo_config.num_iterations = lab.num_iterations
    if a.algo_config.trainer == "preference":
        a.learning_rate = lab.offline_learning_rate
    for section, values in profile(spec, family).items():
        if not isinstance(values, dict):  # a top-level setting (learning_rate, rollout_mode)
            setattr(a, section, values)
            continue
        set_nested(getattr(a, section), values)
    cycle = getattr(a.algo_config, "cycle", 1)  # optimiser steps per rollout batch
    a.max_steps = a.save_steps = (lab.control_rollouts if control else lab.rollouts) * cycle
    a.data.path = write_task(lab.task, str(Path(out).parent / "data" / "train.jsonl"), 4000, 0, "train")
    a.rollout.gen_length, a.rollout.temperature = lab.gen_length, 1.0
    if "value" in variants:  # its own AdamW at the policy's rate (TraceRL's code: 5e-6, five times its policy's)
        a.algo_config.value.learning_rate = a.learning_rate
    if control:
        a.rewards = ["auto:-1"]
    # VRPO's pairs: (reference answer, the start's own wrong answer); its control swaps them
    if a.algo_config.trainer == "preference":
        pairs = lab.rollouts * lab.prompts_per_step
        a.preference.path = mistakes(start, lab, Path(out).parent / "data", pairs)
        a.preference.limit, a.micro_batch_size, a.preference.swap = pairs, 32, control
    return a


def mistakes(start: str, lab: Lab, folder: Path, n: int) -> str:
    """The offline algorithms' training pairs, made once per start: ``dare.eval.lab.mistake_pairs``."""
    path = folder / f"mistakes-{Path(start).name.replace(':', '-')}-{n}.jsonl"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = mistake_pairs(start, lab.task, n, lab.gen_length)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


class ForwardCounter:
    """Counts model forward passes (every forward embeds its input once: calls of any ``nn.Embedding``)."""

    def __enter__(self):
        self.count = 0

        def hook(module, inputs, output):
            self.count += isinstance(module, torch.nn.Embedding)
        self.handle = torch.nn.modules.module.register_module_forward_hook(hook)
        return self

    def __exit__(self, *exc):
        self.handle.remove()


class PeakMemory:
    """Peak memory while inside: CUDA's allocator peak, or on CPU the process's resident set, sampled every 20 ms."""

    def __enter__(self):
        self.mb, self.done = 0.0, threading.Event()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        else:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def _sample(self):
        page_mb = os.sysconf("SC_PAGE_SIZE") / 2 ** 20
        while not self.done.wait(0.02):
            with open("/proc/self/statm") as f:
                self.mb = max(self.mb, int(f.read().split()[1]) * page_mb)

    def __exit__(self, *exc):
        self.done.set()
        if torch.cuda.is_available():
            self.mb = torch.cuda.max_memory_allocated() / 2 ** 20
        else:
            self.thread.join()


def run_folder(out: Path, family: str, spec: str, seed: int) -> Path:
    return out / f"{family}-{spec.replace(':', '-')}-seed{seed}"


def run_one(spec: str, family: str, seed: int, start: str, before: dict, lab: Lab, out: Path) -> dict:
    """One RL run and its measures; kept in ``<run folder>/result.json``, which a rerun of the lab reuses."""
    folder = run_folder(out, family, spec, seed)
    if (folder / "result.json").exists():
        return json.loads((folder / "result.json").read_text())
    args = rl_args(spec, start, str(folder), seed, lab, family)
    t0 = time.perf_counter()
    with ForwardCounter() as forwards, PeakMemory() as memory:
        history = train_rl.main(args).state.log_history
    seconds = time.perf_counter() - t0
    after = measure(str(folder), lab)
    steps = max(len([h for h in history if "loss" in h]), 1)
    result = {**{f"{key}_{stage}": statistics.fmean(values[f"{key}_q"]) for key in ("reward", "greedy")
                 for stage, values in (("before", before), ("after", after))},
              **{f"reward_{k}": v for k, v in paired(before["reward_q"], after["reward_q"]).items()},
              "seconds_per_step": seconds / steps, "forwards_per_step": forwards.count / steps,
              "peak_memory_mb": memory.mb}
    (folder / "result.json").write_text(json.dumps(result, indent=2))
    return result


def supported(spec: str, family: str) -> bool:
    return get_algorithm(split_spec(spec)[0]).supports(family)


def expand(algos: list[str]) -> list[str]:
    algos = list(dict.fromkeys(s for a in algos for s in (known() + ["d1:control"] if a == "all" else [a])))
    unknown = [a for a in algos if split_spec(a)[0] not in known() or not set(split_spec(a)[1]) <= set(VARIANTS)]
    if unknown:
        raise SystemExit(f"unknown algorithm or variant {unknown}; algorithms: {known()}, variants (combined as "
                         "NAME:v1:v2): NAME:paper (where recipes/llada/NAME_math_paper.yaml exists), NAME:lab "
                         "(LAB_PROFILES in this script), NAME:value (its value model), NAME:ahead (rollouts decoded "
                         "one cycle ahead of training), NAME:fast (dare.sampling.FAST_DECODING), "
                         f"NAME:kl (a KL term to the start, beta {KL_BETA}) and NAME:control")
    for spec in algos:
        profile(spec)  # a missing paper profile fails before anything runs
    return algos


def summarise(runs: list[dict]) -> dict:
    """Mean and standard error over seeds of every number. The gain's standard error is the seed-to-seed one, but
    never below one run's measurement noise over sqrt(seeds) (with one seed, or seeds that agree by chance)."""
    keys = [k for k in runs[0] if runs[0][k] is not None]
    out = {k: mean_se([r[k] for r in runs]) for k in keys}
    gains = [r["reward_after"] - r["reward_before"] for r in runs]
    gain, se = mean_se(gains)
    within = max(r["reward_se"] for r in runs)  # one run's paired standard error (the noise of one measurement)
    out["gain"] = (gain, max(se, within / math.sqrt(len(runs))))
    out["z"] = gain / out["gain"][1] if out["gain"][1] else 0.0
    out["seeds"] = len(runs)
    return out


def table(results: dict) -> str:
    lines = ["| family | algorithm | seeds | T=1 reward before | after | gain (SE) | gain / SE | greedy before | "
             "after | s / step | forwards / step | peak MB |", "|---" * 12 + "|"]
    for (family, spec), s in results.items():
        def f(k, d=3, s=s):
            m, e = s.get(k, (None, None))
            return "—" if m is None else f"{m:.{d}f} ± {e:.{d}f}"
        lines.append(f"| {family} | {spec} | {s['seeds']} | {f('reward_before')} | {f('reward_after')} | "
                     f"{s['gain'][0]:+.3f} ({s['gain'][1]:.3f}) | {s['z']:+.1f} | {f('greedy_before')} | "
                     f"{f('greedy_after')} | {f('seconds_per_step', 2)} | {f('forwards_per_step', 1)} | "
                     f"{s['peak_memory_mb'][0]:.0f} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = [f"{f} {a}" for f, a in results]
    fig, ax = plt.subplots(figsize=(max(5, 0.7 * len(names)), 4.5))
    for i, key in enumerate(("reward_before", "reward_after")):
        ax.bar([j + 0.4 * i for j in range(len(names))], [s[key][0] for s in results.values()], 0.4,
               yerr=[s[key][1] for s in results.values()], label=key.replace("reward_", "T=1 reward "), capsize=2)
    ax.set_xticks([j + 0.2 for j in range(len(names))], names, fontsize="small", rotation=35, ha="right")
    ax.set_ylabel("held-out reward (T = 1)")
    ax.legend(loc="upper left", bbox_to_anchor=(1, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


SIGNAL_FLOOR = 0.1  # the least share of the start's groups with differing rewards the lab spends RL on
# tasks the lab's tiny models do not learn, with what was measured (bench/results/cpu-2026-12-06/lab52, LLaDA, seed 0):
# refused before the SFT start unless --allow-no-signal
NOT_LEARNABLE = {
    "arithmetic": "a tiny model's SFT start answers under 5 % of the held-out questions (0.039 at T = 1 after 1500 "
                  "steps, 0.047 after 4000; 20-22 % of its groups with a signal) and d1 from it does not learn "
                  "(-0.9 SE; from the 4000-step start -6.0 SE, its control -0.6 SE)",
    "countdown": "a tiny model's SFT start solves none of the held-out puzzles (0.091 at T = 1, the format score; 0 % "
                 "of 200 questions' groups of 8 hold a right answer): its groups spread on format only, and RL has no "
                 "right answer to reinforce",
    "cycle": "a tiny model's SFT start (1500 steps) answers 1.2 % of 200 held-out questions at T = 1 (greedy 0.5 %) "
             "and only 5 % of their groups of 8 hold a right and a wrong answer, under the lab's 10 % floor: RL would "
             "get a gradient from almost none",
}


def check_signal(before: dict, family: str, lab: Lab) -> None:
    """Stop before the RL budget is spent when too few of the SFT start's groups carry a signal: the held-out
    questions' ``samples`` completions at T = 1 (the lab's groups when ``samples`` equals ``num_generations``) whose
    rewards differ. A group whose completions all score alike (a start that always fails, always succeeds, or earns
    one format-only score: countdown's 0.093 for every completion) has every advantage 0: RL learns nothing from it."""
    reward, share = statistics.fmean(before["reward_q"]), statistics.fmean(before["spread_q"])
    if share < SIGNAL_FLOOR and not lab.allow_no_signal:
        raise SystemExit(f"the SFT start of {family} on held-out {lab.task}: only {share:.1%} of its groups "
                         f"({lab.samples} completions of a question at T = 1) have rewards that differ (mean reward "
                         f"{reward:.3f}; the lab needs {SIGNAL_FLOOR:.0%}): RL would get no gradient from the rest. "
                         f"Train the start longer or shorter (--sft-steps {sft_steps(family, lab)} now), give it a "
                         "longer --gen-length or a denser reward, choose another task, or --allow-no-signal for a "
                         "smoke test")


# what a finished run's numbers depend on besides its algorithm, family and seed
SETTINGS = ("task", "sft_steps", "sft_stop_at_loss", "sft_lr", "rollouts", "control_rollouts", "prompts_per_step",
            "num_generations", "learning_rate", "offline_learning_rate", "prompt_masking", "num_iterations",
            "gen_length", "questions", "samples")


def check_settings(lab: Lab, out: Path):
    """A folder's finished runs are reused only under the settings that produced them (``lab.json``)."""
    path, mine = out / "lab.json", {k: getattr(lab, k) for k in SETTINGS}
    if path.exists():
        theirs = json.loads(path.read_text())
        changed = [f"{k}: {theirs.get(k)} there, {v} now" for k, v in mine.items() if theirs.get(k) != v]
        if changed:
            raise SystemExit(f"{out} holds runs made with other settings ({'; '.join(changed)}): choose another "
                             "--output-dir")
    else:
        path.write_text(json.dumps(mine, indent=2))


def main(lab: Lab) -> dict:
    if lab.task in NOT_LEARNABLE and not lab.allow_no_signal and not lab.finished_only:
        raise SystemExit(f"the lab does not learn {lab.task} at the tiny scale: {NOT_LEARNABLE[lab.task]}. Choose "
                         "another task, or --allow-no-signal to run it anyway (a smoke test)")
    torch.set_num_threads(lab.threads)
    out = Path(lab.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(lab, out)
    results, raw, t0 = {}, {}, time.perf_counter()
    for family in lab.families:
        if not lab.finished_only:
            start = sft_start(family, lab, out)
            before = start_measure(start, family, lab)
            check_signal(before, family, lab)
        for spec in expand(lab.algos):
            if not supported(spec, family):
                continue
            if lab.finished_only:
                found = [run_folder(out, family, spec, seed) / "result.json" for seed in lab.seeds]
                runs = [json.loads(path.read_text()) for path in found if path.exists()]
                if not runs:
                    continue
            else:
                runs = [run_one(spec, family, seed, start, before, lab, out) for seed in lab.seeds]
            raw[f"{family}/{spec}"], results[(family, spec)] = runs, summarise(runs)
            print(table({(family, spec): results[(family, spec)]}).splitlines()[-1], flush=True)
    text = (f"## {lab.task}: {lab.questions} held-out questions x {lab.samples} samples (T = 1), {lab.rollouts} "
            f"rollouts of {lab.prompts_per_step} x {lab.num_generations}, seeds {lab.seeds}, "
            f"{time.perf_counter() - t0:.0f} s\n\n{table(results)}")
    (out / "comparison.md").write_text(text)
    (out / "comparison.json").write_text(json.dumps({"lab": vars(lab), "runs": raw}, indent=2))
    if results:
        plot(results, out / "comparison.png")
    print(text)
    return results


if __name__ == "__main__":
    main(tyro.cli(Lab))
