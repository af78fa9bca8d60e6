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
gdpo, agrpo, d2, tracerl, igpo, dmpo). ``NAME:lab`` uses the algorithm's own settings from ``LAB_PROFILES``
(``lab_profiles.py``: a learning rate; dmpo's mean baseline) where the shared ones do not make it learn.
``NAME:value`` runs it with its value model (tracerl). ``NAME:ahead`` decodes each rollout one cycle ahead of
training (``--rollout-mode ahead``). ``NAME:fast`` decodes its rollouts with ``dare.sampling.FAST_DECODING``, the
fastest decoding that kept its quality. ``NAME:kl`` adds a KL term to the start (beta 0.04, d1's paper value; the
tiny MMaDA's answer breaks without it on ``task:shapes``).
Variants combine: ``tracerl:value:control``. The generation length comes from the task's
reference answers (a shorter ``--gen-length`` is refused), and a start where fewer than 10 % of the held-out
questions' groups (``--samples`` completions at T = 1) have rewards that differ stops the lab before any RL runs.
Writes ``<output-dir>/comparison.md``, ``comparison.json`` and ``comparison.png``; each finished run keeps its numbers
in its folder's ``result.json``, so an interrupted or extended lab (more seeds, more algorithms) only runs what is new;
``--finished-only`` tabulates what a folder holds so far (each row with the seeds that finished) and runs nothing.
Beside this script: the specs and what they change (``lab_profiles.py``), the shared SFT starts and their checks
(``lab_starts.py``), the measures, table and plot (``lab_report.py``).
"""

import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from lab_profiles import expand, profile, set_nested, split_spec, supported  # noqa: E402
from lab_report import ForwardCounter, PeakMemory, plot, summarise, table  # noqa: E402
from lab_starts import NOT_LEARNABLE, answer_length, check_signal, measure, sft_start, start_measure  # noqa: E402

import train_rl  # noqa: E402
from dare.config import parse, run  # noqa: E402
from dare.data.tasks import write_task  # noqa: E402
from dare.eval.lab import mistake_pairs, paired  # noqa: E402


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


# the RL rate of a task where 1e-3 does not learn (bench/results/cpu-2026-12-06/lab52, LLaDA, d1, seed 0): sudoku at
# 1e-3 collapses to no answers after ~40 rollouts (0.234 -> 0.000, -28.2 SE); at 3e-4 +3.2 SE (0.234 -> 0.259)
TASK_LEARNING_RATE = {"sudoku": 3e-4}


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
    run(main, lambda: parse(Lab))
