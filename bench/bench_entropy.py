"""The entropy diagnostic of every scored position (logged as ``entropy``), before and after chunking, beside the
log-softmax the loss needs, over LLaDA's vocabulary (126,464) on one CPU thread.

    python bench/bench_entropy.py                     # micro-batch 4 x 256 positions
    python bench/bench_entropy.py --rows 16 --positions 256
"""

import argparse
import resource
import subprocess
import sys
import time

import torch

VARIANTS = ("log_softmax", "entropy whole-tensor (before)", "entropy chunked (dare.likelihood.entropy_of)")


def run(variant: str, rows: int, positions: int, vocab: int) -> tuple[float, float]:
    """(seconds, peak resident MB above the logits' own) of one variant, in this process."""
    torch.set_num_threads(1)
    logp = torch.randn(rows, positions, vocab).log_softmax(-1)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    if variant == VARIANTS[0]:
        logp.log_softmax(-1)  # the cost is the same on log-probs as on logits
    elif variant == VARIANTS[1]:
        -(logp.exp() * logp.masked_fill(torch.isinf(logp), 0)).sum(-1)
    else:
        from dare.likelihood import entropy_of
        entropy_of(logp)
    seconds = time.perf_counter() - start
    return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=126464)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:  # one measurement, in a fresh process (peak memory is per process)
        print(*run(args.variant, args.rows, args.positions, args.vocab))
        return
    print(f"{args.rows} x {args.positions} positions, vocabulary {args.vocab}, float32, 1 thread\n")
    print("| computation | seconds | extra peak MB |\n|---|---|---|")
    for variant in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--rows", str(args.rows), "--positions", str(args.positions),
                              "--vocab", str(args.vocab), "--variant", variant], capture_output=True, text=True,
                             check=True).stdout.split()
        print(f"| {variant} | {float(out[0]):.2f} | {float(out[1]):.0f} |")


if __name__ == "__main__":
    main()
