"""Does RL teach a drawing model to draw what it is asked? A random tiny MMaDA on the drawing task (task:colours):
its held-out drawings scored by the colours reward before and after RL, paired per drawing (the same held-out
question and sample seed), and a control that trains on the negated reward.

    python bench/draw_learns.py --algos maskgrpo d1 --steps 60 --output-dir outputs/draw-lab

No SFT start: the reward is a share of pixels, so a random model's drawings already score between 0 and 1 and a group's
drawings differ. Prints one table row per run (mean held-out reward before -> after, the paired change with its
standard error); each run's folder keeps its model and ``result.json`` (a rerun reuses it).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def held_out(model_dir: str, questions: int, samples: int, steps: int) -> list[float]:
    """The colours reward of ``samples`` drawings of each of ``questions`` held-out rows (T = 1, seeded per row)."""
    import torch

    from dare.data.images import pictured_prompt
    from dare.data.tasks import make_task
    from dare.engines import HFEngine
    from dare.eval.benchmarks import prompt_rows_from
    from dare.models import Family, load_pretrained
    from dare.rewards import get_reward
    from dare.sampling import SamplingConfig

    model, tokenizer, _ = load_pretrained(model_dir)
    engine = HFEngine(model.eval(), tokenizer, Family.from_pretrained(model.config, tokenizer), max_batch_size=64)
    rows = prompt_rows_from(make_task("colours", questions, seed=0, split="test"))
    reward, scores = get_reward("colours"), []
    config = SamplingConfig(steps=steps, temperature=1.0)
    with torch.no_grad():
        for i, row in enumerate(rows):
            rollout = engine.generate([pictured_prompt(row)], samples, config, seed=1000 + i)
            scores += [reward(text, row["ground_truth"]).score for text in rollout.texts]
    return scores


def train(start: str, out: Path, algo: str, args, control: bool) -> None:
    import train_rl
    from dare.data.tasks import write_task

    data = write_task("colours", str(out.parent / "colours-train.parquet"), 2000, 0, "train")
    run = train_rl.args_class(algo)(model=start, output_dir=str(out), max_steps=args.steps, save_steps=args.steps,
                                    prompts_per_step=args.prompts, num_generations=args.generations,
                                    micro_batch_size=args.prompts * args.generations, learning_rate=args.lr,
                                    warmup_steps=0.0, lr_scheduler_type="constant", seed=0,
                                    rewards=["colours:-1" if control else "colours"], logging_steps=10)
    run.data.path, run.rollout.temperature, run.rollout.steps = data, 1.0, args.draw_steps
    if algo == "maskgrpo":  # MaskGRPO's drawing settings, fewer inner iterations
        run.algo_config.remasking, run.algo_config.num_iterations = "random", 2
        run.save_steps = args.steps - args.steps % 2
    train_rl.main(run)


def paired(before: list[float], after: list[float]) -> tuple[float, float]:
    diffs = [b - a for a, b in zip(before, after, strict=True)]
    return statistics.fmean(diffs), statistics.stdev(diffs) / len(diffs) ** 0.5


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["maskgrpo"], help="each also runs as NAME:control")
    parser.add_argument("--steps", type=int, default=60, help="RL steps (rollout batches)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--generations", type=int, default=8, help="drawings per prompt (the group)")
    parser.add_argument("--lr", type=float, default=3e-3, help="RL learning rate (constant)")
    parser.add_argument("--draw-steps", type=int, default=4, help="MaskGIT steps per drawing")
    parser.add_argument("--questions", type=int, default=64, help="held-out rows")
    parser.add_argument("--samples", type=int, default=4, help="drawings per held-out row")
    parser.add_argument("--output-dir", default="outputs/draw-lab")
    args = parser.parse_args(argv)
    import torch

    from dare.models import save_tiny

    torch.set_num_threads(1)
    out = Path(args.output_dir)
    start = out / "start"
    if not (start / "model.safetensors").exists():
        save_tiny("mmada", start)
    cached = start / "held_out.json"
    if not cached.exists():
        cached.write_text(json.dumps(held_out(str(start), args.questions, args.samples, args.draw_steps)))
    before = json.loads(cached.read_text())
    print(f"start: held-out colours reward {statistics.fmean(before):.3f} over {len(before)} drawings")
    print("| run | held-out reward | change (paired) |\n|---|---|---|")
    for algo in args.algos:
        for control in (False, True):
            name = f"{algo}:control" if control else algo
            folder = out / name.replace(":", "-")
            result = folder / "result.json"
            if not result.exists():
                train(str(start), folder, algo, args, control)
                result.write_text(json.dumps(held_out(str(folder), args.questions, args.samples, args.draw_steps)))
            after = json.loads(result.read_text())
            change, se = paired(before, after)
            print(f"| {name} | {statistics.fmean(before):.3f} -> {statistics.fmean(after):.3f} | {change:+.3f} ± "
                  f"{se:.3f} ({change / se:+.1f} SE) |", flush=True)


if __name__ == "__main__":
    main()
