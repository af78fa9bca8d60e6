"""Forward+backward time and peak memory of every tiny family: sdpa vs eager, with and without gradient
checkpointing, on the family's own training input (block families: the doubled ``[x_t ‖ x_0]`` layout).

    python bench/bench_models.py                      # batch 4, sequence 512, all families
    python bench/bench_models.py --seq 1024 --families sdar llada2 --hidden 256

Each configuration runs in a forked child. Peak MiB = the most memory held by live tensors during one more step
(``LivePeak`` in ``bench/_common.py``: the CPU profiler's allocator events, ``torch.cuda.max_memory_allocated`` on a
GPU), above what the model held before it: memory freed to the allocator cannot count, so checkpointing shows its
saving. The timed steps run without the profiler.
"""

import argparse
import statistics
import time

import torch
from _common import LivePeak, hidden_override, in_child

from dare.models import FAMILIES, Family, tiny


def step(fam, model, x):
    xt = x.masked_fill(torch.rand(x.shape, device=x.device) < 0.5, fam.mask_id)
    lg = fam.logits(model, xt, clean_ids=x if fam.block_size else None)
    loss = torch.nn.functional.cross_entropy(lg.flatten(0, 1).float(), x.flatten())
    loss.backward()


def run(args, family, attn, ckpt, queue):
    torch.manual_seed(0)
    model, tok = tiny(family, **hidden_override(family, args.hidden))
    model.config._attn_implementation = attn
    model.to(args.device).train()
    if ckpt:
        model.activation_checkpointing_enable({"use_reentrant": False})
    fam = Family.from_pretrained(model.config, tok)
    x = torch.randint(20, len(tok), (args.batch, args.seq), device=args.device)
    step(fam, model, x)  # warm-up
    times = []
    for _ in range(args.repeats):
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        step(fam, model, x)
        if args.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    model.zero_grad(set_to_none=True)
    with LivePeak(args.device) as peak:
        step(fam, model, x)
    params = sum(p.numel() for p in model.parameters())
    queue.put((statistics.median(times), peak.mib, params))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    p.add_argument("--seq", type=int, default=512, help="tokens per sequence (default 512)")
    p.add_argument("--hidden", type=int, default=0, help="override the tiny hidden size (0 = tiny default)")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per configuration, median reported")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    print(f"batch {args.batch} x seq {args.seq}, device {args.device}, torch threads {torch.get_num_threads()}")
    print("| family | params | attention | grad ckpt | fwd+bwd ms | tokens/s | live peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for family in args.families:
        for attn in ("sdpa", "eager"):
            for ckpt in (False, True):
                seconds, peak, params = in_child(run, args, family, attn, ckpt)
                tps = args.batch * args.seq / seconds
                print(f"| {family} | {params / 1e6:.2f}M | {attn} | {'on' if ckpt else 'off'} | "
                      f"{seconds * 1e3:.1f} | {tps:,.0f} | {peak:.1f} |", flush=True)


if __name__ == "__main__":
    main()
