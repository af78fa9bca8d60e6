"""Rollouts as RL draws them (G completions per prompt, prompt-major), before and now in one run: "before" is the
family's sampler (``dare/sampling/block.py`` or ``masked.py``) as of ``--before`` (a git revision, loaded from git),
"now" the working tree's. Block families: a group's prompt blocks are now prefilled once and a row that stopped
leaves the batch and its cache (before: every row prefilled its prompt, finished rows rode along until the last
stopped). Masked families with a threshold: a row whose block is done now sits out the block's remaining forwards.
Columns: wall seconds (best of ``--repeats``, one thread), row-positions fed to the model per completion (rows x
positions over every call), forwards, and the share of completions identical to before's (same seed: the sampling
draws are the whole batch's either way, so 100 % is expected where the steps run are the same).

    python train_sft.py --config recipes/standin/sdar.yaml       # a trained stand-in that stops (~15 min), then:
    python bench/bench_rollout.py --model outputs/standin-sdar
    python bench/bench_rollout.py --model outputs/standin-sdar --threshold 0.9
    python bench/bench_rollout.py --model tiny:sdar --gen-length 32   # random weights: no row stops (a smoke run)
    python train_sft.py --config recipes/standin/llada.yaml      # the LLaDA stand-in (~8 min), then:
    python bench/bench_rollout.py --model outputs/standin-llada --threshold 0.9 --cache dual
"""

import argparse
import importlib
import inspect
import subprocess
import sys
import time
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(Path(__file__).resolve().parent), str(ROOT)]
from _common import FedCounter  # noqa: E402

from dare.data.tasks import make_task  # noqa: E402
from dare.models import load_pretrained  # noqa: E402
from dare.sampling import SamplingConfig, generate  # noqa: E402

BEFORE = "c8eb8f1"  # the last commit before rows left the batches and groups shared their prefill


def sampler_at(revision: str, name: str):
    """``generate_<name>`` of ``dare/sampling/<name>.py`` at a git revision, importable beside the current package."""
    source = subprocess.run(["git", "show", f"{revision}:dare/sampling/{name}.py"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    module = types.ModuleType(f"dare.sampling.{name}_before")
    module.__package__ = "dare.sampling"
    exec(compile(source, f"{name}.py@{revision}", "exec"), module.__dict__)
    sampler = getattr(module, f"generate_{name}")
    taken = len(inspect.signature(sampler).parameters)  # arguments added since (fixed_shapes) keep their defaults
    return lambda *args: sampler(*args[:taken])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny:sdar", help="a model folder or tiny:<family> (not DiffusionGemma)")
    p.add_argument("--task", default="cycle", help="generated task whose held-out questions are the prompts")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--generations", type=int, default=8, help="completions per prompt (one batch of all)")
    p.add_argument("--gen-length", type=int, default=256)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--threshold", type=float, default=None, help="dynamic unmasking (default: static, 1 per step)")
    p.add_argument("--cache", default=None, help="default: block (block families), none (masked families)")
    p.add_argument("--block-length", type=int, default=32, help="masked families' semi-autoregressive block")
    p.add_argument("--before", default=BEFORE, help="git revision of the 'before' sampler")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok, family = load_pretrained(args.model, dtype=torch.float32)
    if family.noise == "uniform":
        raise SystemExit(f"error: {args.model} is a {family.name} model; this bench decodes masked and block families")
    kind = "block" if family.is_block_diffusion else "masked"
    model.eval()
    tok.padding_side = "left"
    rows = make_task(args.task, args.prompts, 0, "test")
    messages = [[{"role": "user", "content": r["prompt"][-1]["content"]}] for r in rows for _ in
                range(args.generations)]
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, padding=True, return_dict=True,
                                  return_tensors="pt", tokenizer_kwargs={"padding_side": "left"})
    extra = {} if kind == "block" else dict(block_length=args.block_length, steps=args.gen_length)
    cfg = SamplingConfig(gen_length=args.gen_length, temperature=args.temperature, threshold=args.threshold,
                         cache=args.cache or ("block" if kind == "block" else "none"), **extra)
    print(f"{args.model} ({family.name}, block {family.block_size or args.block_length}): {args.prompts} prompts x "
          f"{args.generations} completions of {args.gen_length} tokens, T = {args.temperature}, threshold "
          f"{args.threshold}, cache {cfg.cache}, {args.threads} thread(s)\n")
    print("| sampler | s | row-positions fed / completion | forwards | completion tokens (mean) | identical to "
          "before |\n|---|---|---|---|---|---|")
    module = importlib.import_module(f"dare.sampling.{kind}")
    results, first, now = [], None, getattr(module, f"generate_{kind}")
    for name, sampler in ((f"before ({args.before})", sampler_at(args.before, kind)), ("now", now)):
        setattr(module, f"generate_{kind}", sampler)  # generate() imports it from the module at every call
        fed, best = FedCounter(model), float("inf")
        try:
            for _ in range(args.repeats):
                fed.row_positions = 0
                start = time.perf_counter()
                out = generate(model, family, enc["input_ids"], enc["attention_mask"], cfg,
                               torch.Generator().manual_seed(0))
                best = min(best, time.perf_counter() - start)
        finally:
            fed.handle.remove()
            setattr(module, f"generate_{kind}", now)
        first = out.sequences if first is None else first
        same = float((out.sequences == first).all(-1).double().mean())
        per_row = fed.row_positions / len(out.sequences)
        results.append(dict(seconds=best, fed=per_row, nfe=out.nfe, identical=same))
        print(f"| {name} | {best:.2f} | {per_row:.0f} | {out.nfe} | {float(out.lengths.double().mean()):.1f} | "
              f"{same:.0%} |", flush=True)
    return results


if __name__ == "__main__":
    main()
