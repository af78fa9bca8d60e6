"""One RL step (d1) on tiny families, split into rollout / reward / train seconds, with rollout tokens/s, for the hf
engine's decoding variants: no cache and one token per step (the plain baseline), KV cache (Fast-dLLM prefix or
dual cache for masked families, the block cache for block families), cache + parallel decoding (4 tokens per
step; or a confidence threshold), the dual cache with dInfer's vicinity refresh + threshold, and ``fast``
(``dare.sampling.FAST_DECODING``: its own thresholds, 0.7 masked and 0.9 block, not ``--threshold``).

    python bench/bench_rl.py                                  # llada + sdar, 8 prompts x 8 completions, 64 tokens
    python bench/bench_rl.py --families llada dream sdar llada2 --gen-length 128 --hidden 256
    python bench/bench_rl.py --model outputs/quickstart/sft   # a trained model (thresholds then commit in parallel)
    python bench/bench_rl.py --model outputs/standin-llada --task cycle --prompts 4 --generations 4 --gen-length 128
    python bench/bench_rl.py --model outputs/standin-llada outputs/standin-sdar --task cycle --prompts 4 \
        --generations 4 --gen-length 128 --variants plain fast  # docs/benchmarks.md: the rollout share, before/after
    python bench/bench_rl.py --families llada --variants cache --modes sync ahead --threads 1   # decode ahead

Each (family, variant) trains ``--warmup + --steps`` steps of train_rl.py in a forked child on generated
arithmetic prompts (the math reward); the table shows medians over the timed steps. ``step s`` = rollout + reward
+ old-log-prob pass + train (forward/backward of every micro-batch); the optimiser step is inside ``train s``.
``rollout share`` = rollout s / step s. ``wall s`` is the step's measured wall time (everything, ``time/cycle``);
``wait s`` the trainer's wait for a rollout decoded ahead (``--modes ahead``: the next batch decodes on a copy of the
policy in a background thread while this one trains, so with a core free for it ``wall s`` drops toward the larger
of rollout and train).
Random tiny models are never confident, so threshold decoding commits one token per step there (use ``--model``).
"""

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from _common import hidden_override, in_child

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # train_rl.py lives in the repository root
import train_rl  # noqa: E402
from dare.data.tasks import write_task
from dare.models import save_tiny
from dare.sampling import FAST_DECODING

# name -> (rollout knobs of masked families, of block families (None: not for them)); "per_step": tokens per step,
# threshold True: --threshold
VARIANTS = {
    "plain": (dict(cache="none"), dict(cache="none")),
    "cache": (dict(cache="prefix"), dict(cache="block")),
    "dual cache": (dict(cache="dual"), None),
    "cache + 4 tok/step": (dict(cache="prefix", per_step=4), dict(cache="block", per_step=4)),
    "cache + threshold": (dict(cache="prefix", threshold=True), dict(cache="block", threshold=True)),
    "dual + threshold": (dict(cache="dual", threshold=True), None),
    "dual + vicinity 16 + threshold": (dict(cache="dual", vicinity=16, threshold=True), None),
    "fast": (FAST_DECODING["masked"], FAST_DECODING["block"]),
}
KEYS = ("time/rollout", "time/reward", "time/old_ref_logp", "time/train", "rollout/tokens_per_s", "rollout/nfe",
        "time/cycle", "time/rollout_wait")


def run(args, model, block, variant, mode, data, queue):
    torch.set_num_threads(args.threads)
    knobs = dict(VARIANTS[variant][bool(block)])
    per_step = knobs.pop("per_step", 1)
    if knobs.get("threshold") is True:
        knobs["threshold"] = args.threshold
    with tempfile.TemporaryDirectory() as out:
        a = train_rl.args_class("d1")(model=model, output_dir=out, max_steps=args.warmup + args.steps,
                                      prompts_per_step=args.prompts, num_generations=args.generations,
                                      micro_batch_size=args.micro_batch, save_steps=10 ** 6, learning_rate=1e-5,
                                      logging_steps=1, log_completions=0,
                                      rollout_batch_size=args.prompts * args.generations, rollout_mode=mode)
        a.data.path = data
        a.rollout.gen_length, a.rollout.temperature = args.gen_length, 1.0
        a.rollout.block_length = None if block else min(32, args.gen_length)
        a.rollout.steps = (args.gen_length if not block else block) // per_step
        for knob, value in knobs.items():
            setattr(a.rollout, knob, value)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            logs = [h for h in train_rl.main(a).state.log_history if "loss" in h][args.warmup:]
    queue.put({k: statistics.median(float(h.get(k, 0.0)) for h in logs) for k in KEYS})


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=["llada", "sdar"])
    p.add_argument("--model", nargs="+", default=None, help="model folders instead of the tiny random families")
    p.add_argument("--hidden", type=int, default=0, help="wider tiny models (0: the preset width)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="NAME",
                   help=f"decoding variants to time (default all: {', '.join(VARIANTS)})")
    p.add_argument("--threshold", type=float, default=0.9, help="confidence threshold of the threshold variants")
    p.add_argument("--modes", nargs="+", default=["sync"], choices=["sync", "ahead"],
                   help="rollout modes (train_rl.py --rollout-mode): sync, and ahead (the next batch decodes in the "
                        "background while this one trains)")
    p.add_argument("--task", default="arithmetic", help="generated task of the prompts (a --model's own: e.g. cycle "
                                                          "for the stand-ins of recipes/standin)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = write_task(args.task, f"{tmp}/train.jsonl", 256)
        models = {m: m for m in args.model} if args.model else {
            f: save_tiny(f, f"{tmp}/{f}", **hidden_override(f, args.hidden)) for f in args.families}
        print(f"d1 step: {args.prompts} prompts x {args.generations} completions, {args.gen_length} tokens, "
              f"micro-batch {args.micro_batch}, threshold {args.threshold:g}, median of {args.steps} steps, "
              f"{args.threads} thread(s)\n")
        print("| model | decoding | mode | rollout s | reward s | old logp s | train s | step s | wall s | wait s | "
              "rollout tok/s | NFE | rollout share |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, model in models.items():
            from dare.models import load_pretrained
            block = load_pretrained(model)[2].block_size
            for variant, kinds in VARIANTS.items():
                if kinds[bool(block)] is None or variant not in args.variants:
                    continue
                for mode in args.modes:
                    r = in_child(run, args, model, block, variant, mode, data)
                    step = r["time/rollout"] + r["time/reward"] + r["time/old_ref_logp"] + r["time/train"]
                    print(f"| {name} | {variant} | {mode} | {r['time/rollout']:.3f} | {r['time/reward']:.3f} | "
                          f"{r['time/old_ref_logp']:.3f} | {r['time/train']:.3f} | {step:.3f} | "
                          f"{r['time/cycle']:.3f} | {r['time/rollout_wait']:.3f} | {r['rollout/tokens_per_s']:.0f} | "
                          f"{r['rollout/nfe']:.0f} | {r['time/rollout'] / step:.0%} |", flush=True)


if __name__ == "__main__":
    main()
