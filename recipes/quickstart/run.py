"""The offline quickstart: a tiny diffusion LM learns to sum four digits by SFT, then improves with RL; measured
before and after on held-out questions it never trained on, with a table and a PNG. No GPU, no downloads.

    python recipes/quickstart/run.py                              # tiny LLaDA, d1, ~3 minutes on 2 CPU cores
    python recipes/quickstart/run.py --family sdar                # block diffusion; --algo NAME: any algorithm
    python recipes/quickstart/run.py --family diffusion_gemma     # uniform noise (d1, wd1, gdpo), ~15 minutes
    python recipes/quickstart/run.py --sft-steps 100 --rl-steps 4 --output-dir outputs/qs-smoke   # a smoke run
    python recipes/quickstart/run.py --family llada_v --task shapes   # pictures: tiny LLaDA-V counts shapes, ~8 min

Stages (each a real script's main, each writing under --output-dir): data (generated train split; the held-out
questions are disjoint from it) -> SFT (train_sft.py) -> measure -> RL (train_rl.py --algo) -> measure ->
summary.md, summary.json, curve.png. The measure is the held-out reward at T = 1 (``--samples`` completions for each of
``--questions`` questions) and greedy accuracy; the change is paired over the same questions, with its standard error.
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train_rl  # noqa: E402
from dare.config import parse, run  # noqa: E402
from dare.eval.lab import mean_se, paired  # noqa: E402

sys.path.insert(0, str(ROOT / "recipes" / "lab"))
import compare as lab  # noqa: E402
import lab_starts  # noqa: E402


@dataclass
class Args:
    """The offline quickstart: a tiny diffusion LM learns sums by SFT, then RL raises its held-out reward; measured
    before and after, a table and a PNG (the module docstring has the commands)."""

    # llada | dream | sdar | sdar_moe | llada2 | diffusion_gemma | nemotron_diffusion | llada_v | mmada (a tiny random
    # model of it; llada_v and mmada read the pictures of --task shapes)
    family: str = "llada"
    # any registered algorithm (python -m dare.algos), with the lab's variants (recipes/lab/compare.py), e.g. d1:kl (a
    # KL term to the start: what tiny MMaDA needs on shapes, at --learning-rate 3e-4)
    algo: str = "d1"
    task: str = "sum4"  # a generated task (dare/data/tasks.py)
    # SFT steps, until the model answers a fifth to a third of the held-out questions (None: the lab's SFT_STEPS,
    # 1500; diffusion_gemma at most 10000, stopped by --sft-stop-at-loss)
    sft_steps: int | None = None
    # stop SFT at the first training loss (mean of 100 steps) below this (None: the lab's SFT_STOP_AT_LOSS,
    # diffusion_gemma 0.26: its loss leaves a plateau at a step that differs between CPUs; others never)
    sft_stop_at_loss: float | None = None
    rl_steps: int = 90  # rollout batches of 16 prompts x 8 completions (offline algorithms: steps of 16 pairs)
    learning_rate: float | None = None  # RL, constant (None: the task's, the lab's TASK_LEARNING_RATE, else 1e-3)
    offline_learning_rate: float = 1e-4  # offline preference optimisation (vrpo), on the SFT model's own mistakes
    prompt_masking: float = 0.0  # p_prompt where prompt tokens are masked (d1, spg: 0.15; docs/lab.md)
    num_iterations: int | None = 1  # passes over each rollout batch (None: the algorithm's, espo 8, d-treerpo 12)
    questions: int = 800  # held-out questions
    samples: int = 8  # T = 1 completions per held-out question
    threads: int = 1  # torch threads (1: the same numbers on any core count)
    output_dir: str = "outputs/quickstart"


def plot(history: list[dict], before: dict, after: dict, path: Path, title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [h["step"] for h in history if "reward" in h]
    rewards = [h["reward"] for h in history if "reward" in h]
    smooth = [sum(rewards[max(0, i - 9):i + 1]) / len(rewards[max(0, i - 9):i + 1]) for i in range(len(rewards))]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), gridspec_kw={"width_ratios": [3, 2]})
    left.plot(steps, rewards, lw=0.8, alpha=0.4, label="training reward (T = 1)")
    left.plot(steps, smooth, lw=2, label="moving average (10)")
    left.set_xlabel("optimiser step")
    left.set_ylabel("mean reward")
    left.legend()
    for i, (name, stage) in enumerate((("after SFT", before), ("after RL", after))):
        values = [mean_se(stage["reward_q"]), mean_se(stage["greedy_q"])]
        bars = right.bar([j + 0.4 * i for j in range(2)], [m for m, _ in values], 0.4, yerr=[e for _, e in values],
                         capsize=3, label=name, color=["#999", "#2a7"][i])
        right.bar_label(bars, fmt="%.2f", fontsize="small")
    right.set_xticks([0.2, 1.2], ["held-out reward\nT = 1", "held-out\ngreedy accuracy"])
    right.legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(args: Args) -> dict:
    torch.set_num_threads(args.threads)
    out = Path(args.output_dir)
    settings = lab.Lab(families=[args.family], task=args.task, sft_steps=args.sft_steps,
                       sft_stop_at_loss=args.sft_stop_at_loss, rollouts=args.rl_steps,
                       learning_rate=args.learning_rate, offline_learning_rate=args.offline_learning_rate,
                       prompt_masking=args.prompt_masking, num_iterations=args.num_iterations,
                       questions=args.questions, samples=args.samples)
    start = lab_starts.sft(args.family, settings, out / "sft")  # the comparison lab's SFT and RL settings
    before = lab.measure(start, settings)
    rl = lab.rl_args(args.algo, start, str(out / "rl"), 42, settings, args.family)
    rl.log_completions = 2
    offline = rl.algo_config.trainer == "preference"
    history = train_rl.main(rl).state.log_history
    after = lab.measure(str(out / "rl"), settings)

    rows, numbers = [], {}
    for key, label in (("reward_q", f"held-out reward, T = 1 ({args.questions} questions x {args.samples})"),
                       ("greedy_q", "held-out greedy accuracy")):
        (b, b_se), (a, a_se), change = mean_se(before[key]), mean_se(after[key]), paired(before[key], after[key])
        numbers[key[:-2]] = {"before": b, "after": a, **change}
        rows.append(f"| {label} | {b:.3f} ± {b_se:.3f} | {a:.3f} ± {a_se:.3f} | {change['gain']:+.3f} ± "
                    f"{change['se']:.3f} ({change['z']:+.1f} SE) |")
    plot(history, before, after, out / "curve.png", f"tiny {args.family}: SFT then {args.algo} on {args.task}")
    unit = "steps of 16 preference pairs" if offline else "rollouts of 16 x 8"
    steps = json.loads((Path(start) / "sft.json").read_text())["steps"]
    summary = (f"## Quickstart: tiny {args.family}, SFT {steps} steps, {args.algo} {args.rl_steps} {unit}, "
               f"task {args.task}\n\n| held-out measure | after SFT | after {args.algo} | change (paired) |\n"
               f"|---|---|---|---|\n" + "\n".join(rows) + f"\n\nreward curve and measures: {out / 'curve.png'}\n")
    (out / "summary.md").write_text(summary)
    (out / "summary.json").write_text(json.dumps({"args": vars(args), **numbers}, indent=2))
    print(summary)
    return numbers


if __name__ == "__main__":
    run(main, lambda: parse(Args))
