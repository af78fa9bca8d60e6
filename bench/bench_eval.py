"""Evaluation speed on a tiny model: samples/s and tokens/s of evaluate.py's built-in path for decoding variants
(no cache, KV cache, cache + parallel decoding), and of the OpenCompass model class on the same prompts when the
optional extra is installed (same engine underneath: the difference is OpenCompass's per-call overhead and its
batching).

    python bench/bench_eval.py                      # tiny LLaDA, 64 generated addition prompts, 32 tokens
    python bench/bench_eval.py --family sdar --prompts 128 --gen-length 64

Each variant runs once untimed (warm-up) and once timed in the same process, one thread.
"""

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dare.engines import HFEngine  # noqa: E402
from dare.eval import benchmarks, harness  # noqa: E402
from dare.models import load_pretrained  # noqa: E402
from dare.rewards.routing import RewardRouter  # noqa: E402
from dare.sampling import SamplingConfig  # noqa: E402


def variants(block: bool, gen_length: int) -> dict:
    if block:
        return {"no cache": dict(cache="none"), "block cache": dict(cache="block"),
                "block cache + 4 tok/step": dict(cache="block", steps=1)}
    return {"no cache": dict(cache="none", block_length=min(32, gen_length)),
            "prefix cache": dict(cache="prefix", block_length=min(32, gen_length)),
            "dual cache + 4 tok/step": dict(cache="dual", block_length=min(32, gen_length), steps=gen_length // 4)}


def built_in(engine, rows, config, batch) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        decoded = harness.run_benchmark(engine, "bench", rows, list(range(len(rows))), 1, config,
                                        RewardRouter(["auto"]), Path(tmp), batch_size=batch, progress=False)
        seconds = time.perf_counter() - start
    return seconds, decoded["tokens"]


def through_opencompass(path, rows, config, batch):
    from dare.eval.opencompass import DARECompassModel
    model = DARECompassModel(path=path, sampling={k: v for k, v in vars(config).items() if k != "gen_length"})
    prompts = [r["prompt"][-1]["content"] for r in rows]
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(prompts), batch):
        tokens += sum(model.get_token_len(t) for t in model.generate(prompts[i:i + batch], config.gen_length))
    return time.perf_counter() - start, tokens


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="llada")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--gen-length", type=int, default=32)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        from dare.models import save_tiny
        path = save_tiny(args.family, f"{tmp}/model")
        model, tok, fam = load_pretrained(path)
        engine = HFEngine(model.eval(), tok, fam, max_batch_size=args.batch)
        rows = benchmarks.load_benchmark("task:addition", limit=args.prompts)
        try:
            import opencompass  # noqa: F401
            paths = ["built-in", "opencompass"]
        except ImportError:
            paths = ["built-in"]
            print("(opencompass is not installed: its rows are skipped)")
        print(f"{args.prompts} prompts, {args.gen_length} tokens, batch {args.batch}, tiny {args.family}\n")
        print("| path | decoding | samples/s | tokens/s | seconds |")
        print("|---|---|---|---|---|")
        for name, knobs in variants(fam.is_block_diffusion, args.gen_length).items():
            config = replace(SamplingConfig(gen_length=args.gen_length), **knobs)
            for which in paths:
                run = built_in if which == "built-in" else through_opencompass
                target = engine if which == "built-in" else path
                run(target, rows[:args.batch], config, args.batch)  # warm-up
                seconds, tokens = run(target, rows, config, args.batch)
                print(f"| {which} | {name} | {len(rows) / seconds:.1f} | {tokens / seconds:.0f} | {seconds:.2f} |",
                      flush=True)


if __name__ == "__main__":
    main()
