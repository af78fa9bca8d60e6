"""The offline quickstart: a tiny diffusion LM learns single-digit sums by SFT, then improves with RL; evaluated
before and after, with a table and a PNG of the reward curve and the accuracies. No GPU, no downloads.

    python recipes/quickstart/run.py                              # tiny LLaDA, d1, ~3 minutes on 2 CPU cores
    python recipes/quickstart/run.py --family sdar --algo ebpo    # any registered algorithm, on a family it supports
    python recipes/quickstart/run.py --sft-steps 100 --rl-steps 4 --output-dir outputs/qs-smoke   # a smoke run

Stages (each a real script's main, each writing under --output-dir): data (generated train/test splits) -> SFT
(train_sft.py) -> evaluate (evaluate.py --bench) -> RL (train_rl.py --algo) -> evaluate -> summary.md, curve.png.
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import tyro

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train_rl  # noqa: E402
import train_sft  # noqa: E402
from dare.data.tasks import write_task  # noqa: E402
from dare.engines import HFEngine  # noqa: E402
from dare.eval.harness import evaluate_benchmarks  # noqa: E402
from dare.eval.report import compare  # noqa: E402
from dare.models import load_pretrained  # noqa: E402
from dare.sampling import SamplingConfig  # noqa: E402


@dataclass
class Args:
    family: str = "llada"  # llada | dream | sdar | sdar_moe | llada2 (a tiny random model of that family)
    algo: str = "d1"  # any registered algorithm (python -m dare.algos)
    task: str = "addition"  # a generated task (dare/data/tasks.py)
    sft_steps: int = 600  # until the model answers some of the held-out prompts
    rl_steps: int = 60  # rollout batches of 16 prompts x 8 completions (offline algorithms: steps of 16 pairs)
    test_prompts: int = 200
    output_dir: str = "outputs/quickstart"


def accuracy(model: str, folder: Path, args: Args) -> dict:
    """What ``evaluate.py --bench task:<task>`` reports, on the generated test split (greedy)."""
    network, tokenizer, family = load_pretrained(model)
    engine = HFEngine(network.eval(), tokenizer, family, max_batch_size=256)
    bench = f"task:{args.task}"
    return evaluate_benchmarks(engine, [bench], SamplingConfig(gen_length=12), folder, limit=args.test_prompts,
                               model_name=model, overwrite=True)[bench]  # the model was just (re)trained


def plot(history: list[dict], before: float, after: float, path: Path, title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [h["step"] for h in history if "reward" in h]
    rewards = [h["reward"] for h in history if "reward" in h]
    smooth = [sum(rewards[max(0, i - 9):i + 1]) / len(rewards[max(0, i - 9):i + 1]) for i in range(len(rewards))]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), gridspec_kw={"width_ratios": [3, 1]})
    left.plot(steps, rewards, lw=0.8, alpha=0.4, label="training reward")
    left.plot(steps, smooth, lw=2, label="moving average (10)")
    left.set_xlabel("optimiser step")
    left.set_ylabel("mean reward")
    left.legend()
    right.bar(["after SFT", "after RL"], [before, after], color=["#999", "#2a7"])
    right.set_ylabel("held-out accuracy")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(args: Args) -> dict:
    out = Path(args.output_dir)
    train = write_task(args.task, str(out / "data" / "train.jsonl"), 4000, 0, "train")

    sft = train_sft.Args(model=f"tiny:{args.family}", output_dir=str(out / "sft"), max_steps=args.sft_steps,
                         learning_rate=3e-3, warmup_steps=0.0, lr_scheduler_type="constant",
                         per_device_train_batch_size=16, logging_steps=50, save_steps=10 ** 6)
    sft.data.path, sft.data.prompt_key, sft.data.response_key = train, "prompt", "extra_info.solution"
    sft.data.max_length, sft.data.pad_to = 64, "longest"
    train_sft.main(sft)
    before = accuracy(str(out / "sft"), out / "eval-sft", args)

    rl = train_rl.args_class(args.algo)(model=str(out / "sft"), output_dir=str(out / "rl"),
                                        prompts_per_step=16, num_generations=8, micro_batch_size=128,
                                        learning_rate=3e-4, logging_steps=1, log_completions=2)
    mu = getattr(rl.algo_config, "cycle", 1)  # optimiser steps per rollout batch
    rl.max_steps, rl.save_steps = args.rl_steps * mu, args.rl_steps * mu
    rl.data.path = train
    rl.rollout.gen_length, rl.rollout.temperature = 12, 1.0
    if getattr(type(rl.algo_config), "offline", False):  # VRPO: generated (right, wrong answer) pairs of the task
        rl.preference.path, rl.preference.limit, rl.micro_batch_size = f"task:{args.task}", 4000, 32
    history = train_rl.main(rl).state.log_history
    after = accuracy(str(out / "rl"), out / "eval-rl", args)

    table = compare([str(out / "eval-sft" / "report.json"), str(out / "eval-rl" / "report.json")])
    plot(history, before["accuracy"], after["accuracy"], out / "curve.png",
         f"tiny {args.family}: SFT then {args.algo} on {args.task}")
    unit = "steps of 16 preference pairs" if getattr(type(rl.algo_config), "offline", False) else "rollouts"
    summary = (f"## Quickstart: tiny {args.family}, SFT {args.sft_steps} steps, {args.algo} {args.rl_steps} "
               f"{unit}, task {args.task}\n\n| stage | held-out accuracy ({args.test_prompts} prompts, greedy) |\n"
               f"|---|---|\n| after SFT | {before['accuracy']:.3f} |\n| after RL | {after['accuracy']:.3f} |\n\n"
               f"{table}\nreward curve and accuracies: {out / 'curve.png'}\n")
    (out / "summary.md").write_text(summary)
    (out / "summary.json").write_text(json.dumps({"before": before, "after": after}, indent=2))
    print(summary)
    return {"before": before["accuracy"], "after": after["accuracy"]}


if __name__ == "__main__":
    main(tyro.cli(Args))
