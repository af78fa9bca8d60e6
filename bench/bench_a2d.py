"""A2D learns: a causal LM converted by ``dare.convert`` is fine-tuned as a diffusion LM (the lab's SFT start recipe:
constant lr 3e-3, batch 16, the task's train split) and its held-out reward before and after is paired over the same
questions (T = 1, 8 completions each; greedy beside it).

    python bench/bench_a2d.py                                   # tiny:qwen2 -> dream and tiny:qwen3 -> sdar on sum4
    python bench/bench_a2d.py --sources tiny:qwen2 --steps 1500 --task addition --output-dir outputs/a2d-bench

Writes ``a2d.md`` and ``a2d.json`` in the output folder; a finished conversion or SFT there is reused.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import train_sft  # noqa: E402
from dare.convert import convert  # noqa: E402
from dare.data.tasks import write_task  # noqa: E402
from dare.eval.lab import held_out, mean_se, paired  # noqa: E402

TARGET = {"tiny:qwen2": "dream", "tiny:llama": "dream", "tiny:qwen3": "sdar"}


def sft(model: str, task: str, folder: Path, steps: int) -> str:
    """The lab's SFT start recipe on ``model``."""
    train = write_task(task, str(folder.parent / "data" / "train.jsonl"), 4000, 0, "train")
    a = train_sft.Args(model=model, output_dir=str(folder), max_steps=steps, learning_rate=3e-3, warmup_steps=0.0,
                       lr_scheduler_type="constant", per_device_train_batch_size=16, logging_steps=100,
                       save_steps=10 ** 6, overwrite_output_dir=True)
    a.data.path, a.data.prompt_key, a.data.response_key = train, "prompt", "extra_info.solution"
    a.data.max_length, a.data.pad_to = 64, "longest"
    train_sft.main(a)
    return str(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sources", nargs="+", default=["tiny:qwen2", "tiny:qwen3"], choices=sorted(TARGET))
    parser.add_argument("--task", default="sum4")
    parser.add_argument("--steps", type=int, default=1500, help="SFT steps")
    parser.add_argument("--questions", type=int, default=800, help="held-out questions")
    parser.add_argument("--gen-length", type=int, default=12)
    parser.add_argument("--output-dir", default="outputs/a2d-bench")
    args = parser.parse_args()
    out, rows = Path(args.output_dir), []
    for source in args.sources:
        t0, name = time.perf_counter(), source.removeprefix("tiny:")
        converted, tuned = out / f"{name}-converted", out / f"{name}-sft"
        if not (converted / "model.safetensors").exists():
            convert(source, str(converted), to=TARGET[source])
        if not (tuned / "model.safetensors").exists():
            sft(str(converted), args.task, tuned, args.steps)
        before, after = (held_out(str(m), args.task, args.questions, gen_length=args.gen_length)
                         for m in (converted, tuned))
        change = paired(before["reward_q"], after["reward_q"])
        row = {"source": source, "target": TARGET[source], "reward_before": mean_se(before["reward_q"]),
               "reward_after": mean_se(after["reward_q"]), "gain": change["gain"], "se": change["se"],
               "z": change["z"], "greedy_before": mean_se(before["greedy_q"])[0],
               "greedy_after": mean_se(after["greedy_q"])[0], "seconds": time.perf_counter() - t0}
        rows.append(row)
        print(json.dumps(row), flush=True)
    lines = [f"## A2D on {args.task}: {args.steps} SFT steps, {args.questions} held-out questions x 8 (T = 1)", "",
             "| source | becomes | T=1 reward before | after | gain (SE) | gain / SE | greedy before | after | s |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['source']} | {r['target']} | {r['reward_before'][0]:.3f} | {r['reward_after'][0]:.3f} ± "
              f"{r['reward_after'][1]:.3f} | {r['gain']:+.3f} ({r['se']:.3f}) | {r['z']:+.1f} | "
              f"{r['greedy_before']:.3f} | {r['greedy_after']:.3f} | {r['seconds']:.0f} |" for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / "a2d.md").write_text("\n".join(lines) + "\n")
    (out / "a2d.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
