"""Ulysses sequence parallelism (``dare/parallel.py``): live-tensor peak memory and time per process of one forward +
backward on a long sequence, SP=1 (one process, the whole sequence) vs SP=2 (two gloo processes, half each).

    python bench/bench_sequence_parallel.py                                  # tiny LLaDA, hidden 256, L 1024..4096
    python bench/bench_sequence_parallel.py --family sdar --layout doubled --lengths 1024 2048

The loss is the mean cross-entropy of every position against the clean tokens (all positions masked, as at t = 1),
so the whole sequence's activations are live at the backward. Each configuration runs in fresh processes (SP=1 in a
forked child, SP=2 as two spawned ranks); the peak is ``LivePeak`` (``bench/_common.py``: the CPU profiler's
allocator events, ``torch.cuda.max_memory_allocated`` on a GPU), the larger of the two ranks for SP=2. What SP cannot
split: the weights and their gradients (every rank holds the whole model) and the additive 4-D mask of the full
sequence (``[B, 1, L, L]``, or ``2L`` for the ``[x_t || x_0]`` layout) that ``ulysses_sdpa`` attends with.
"""

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import LivePeak, hidden_override, in_child

from dare.models import Family, tiny


def batch(args, model, family):
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(10, min(model.config.vocab_size, 200), (args.batch, args.length), generator=g)
    noisy = torch.full_like(clean, family.mask_id)
    return noisy, clean


def build(args):
    torch.manual_seed(0)
    model, tokenizer = tiny(args.family, **hidden_override(args.family, args.hidden), **args.overrides)
    model.train()
    return model, Family.from_pretrained(model.config, tokenizer)


def step(args, model, family, sp=None):
    """Forward + backward; (seconds, live peak MiB)."""
    noisy, clean = batch(args, model, family)
    kw = {"clean_ids": clean} if args.layout == "doubled" else {}
    start = time.perf_counter()
    with LivePeak() as peak:
        if sp is None:
            logits = family.logits(model, noisy, **kw)
            targets = clean
        else:
            logits = sp.logits(family, model, noisy, **kw)
            targets = sp.shard(clean)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
        (loss / clean.numel()).backward()
    return time.perf_counter() - start, peak.mib


def single(args, queue):
    torch.set_num_threads(args.threads)
    model, family = build(args)
    step(args, model, family)  # warm-up (allocator, kernels)
    model.zero_grad(set_to_none=True)
    queue.put(step(args, model, family))


def rank(index, args, port, results):
    torch.set_num_threads(args.threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=index, world_size=2)
    from dare.parallel import ATTENTION, SequenceParallel
    model, family = build(args)
    model.set_attn_implementation(ATTENTION)
    sp = SequenceParallel()
    step(args, model, family, sp)
    model.zero_grad(set_to_none=True)
    dist.barrier()
    results[index] = step(args, model, family, sp)
    dist.destroy_process_group()


def parallel(args) -> tuple[float, float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank, args=(args, port, results), nprocs=2, join=True)
        return max(r[0] for r in results.values()), max(r[1] for r in results.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="llada", choices=["llada", "dream", "sdar", "llada2"])
    parser.add_argument("--layout", default="plain", choices=["plain", "doubled"],
                        help="doubled: the [x_t || x_0] training layout (block families)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096], help="sequence lengths")
    parser.add_argument("--batch", type=int, default=1, help="sequences per step")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the tiny model (0: as built)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = parser.parse_args()
    # the tiny presets' position limits are short: let the bench's lengths fit (RoPE has no learned table)
    limit = 2 * max(args.lengths) if args.layout == "doubled" else max(args.lengths)
    args.overrides = {"max_sequence_length": limit} if args.family == "llada" else {"max_position_embeddings": limit}
    print(f"{args.family}, {args.layout} layout, hidden {args.hidden or 'as built'}, batch {args.batch}, "
          f"{args.threads} thread(s) per process; peak = live tensors of one forward + backward, per process")
    print("| length | SP=1 peak MiB | SP=2 peak MiB | ratio | SP=1 s | SP=2 s |")
    print("|---|---|---|---|---|---|")
    for length in args.lengths:
        args.length = length
        one_s, one_mib = in_child(single, args)
        two_s, two_mib = parallel(args)
        print(f"| {length} | {one_mib:.0f} | {two_mib:.0f} | {two_mib / one_mib:.2f} | {one_s:.2f} | {two_s:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
