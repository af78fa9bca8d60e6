"""FlexAttention against sdpa on the layouts with most hidden tiles: packed SFT rows (examples of 64-256 tokens) and the
block families' ``[x_t ‖ x_0]`` training layout, at row lengths 512-2048. Each path gets its own copy of one tiny
model; the table gives seconds per call (after a warm-up call that compiles FlexAttention, timed apart), tokens per
second, the live peak memory and the largest logit difference from sdpa.

On CPU it times the no-grad forward (scoring and decoding): torch has no FlexAttention backward there. With
``--device cuda`` it times forward + backward of the summed log-probabilities, the training step's attention work.

    python bench/bench_flex.py                                     # SDAR, hidden 256, 4 layers, 2 rows, CPU
    python bench/bench_flex.py --device cuda --hidden 1024 --layers 8 --rows 8 --lengths 1024 2048 4096
"""

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from _common import LivePeak, hidden_override  # noqa: E402

from dare.models import Family, masks, tiny  # noqa: E402


def packed_segments(rows: int, length: int, generator) -> torch.Tensor:
    """Segment ids ``[rows, length]``: examples of 64-256 tokens back to back, the last one cut at the row's end."""
    out = torch.empty(rows, length, dtype=torch.long)
    for r in range(rows):
        at, seg = 0, 0
        while at < length:
            n = int(torch.randint(64, 257, (1,), generator=generator))
            out[r, at:at + n] = seg
            at, seg = at + n, seg + 1
    return out


def inputs(layout: str, fam, tok, rows: int, length: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(20, len(tok), (rows, length), generator=g)
    if layout == "packed":
        return dict(input_ids=x0, segment_ids=packed_segments(rows, length, g))
    xt = x0.masked_fill(torch.rand(rows, length, generator=g) < 0.5, fam.mask_id)
    return dict(input_ids=xt, clean_ids=x0)


def call(model, fam, batch: dict, train: bool) -> torch.Tensor:
    with torch.set_grad_enabled(train):
        logits = fam.logits(model, batch["input_ids"], clean_ids=batch.get("clean_ids"),
                            segment_ids=batch.get("segment_ids"))
        if train:
            target = batch.get("clean_ids", batch["input_ids"])
            logits.float().log_softmax(-1).gather(-1, target[..., None]).sum().backward()
            model.zero_grad(set_to_none=True)
    return logits.detach()


def measure(model, fam, batch, train, device, repeats):
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    start = time.perf_counter()
    reference = call(model, fam, batch, train)  # warm-up: FlexAttention compiles for this shape here
    sync()
    warm = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call(model, fam, batch, train)
        sync()
        times.append(time.perf_counter() - start)
    with LivePeak(device) as peak:
        call(model, fam, batch, train)
    return reference, warm, min(times), peak.mib


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="sdar", choices=["llada", "dream", "sdar", "sdar_moe", "llada2"])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rows", type=int, default=2)
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--layouts", nargs="+", default=["packed", "doubled"], choices=["packed", "doubled"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    train = args.device.startswith("cuda")
    if args.device == "cpu":
        torch.set_num_threads(1)
    torch._dynamo.config.recompile_limit = 64  # one compiled kernel per shape (default 8: then eager, unfused)
    sdpa, tok = tiny(args.family, num_hidden_layers=args.layers, **hidden_override(args.family, args.hidden))
    sdpa = sdpa.to(args.device, getattr(torch, args.dtype)).train(train)
    flex = copy.deepcopy(sdpa)
    flex.set_attn_implementation(masks.FLEX)
    fam = Family.from_pretrained(sdpa.config, tok)
    layouts = [x for x in args.layouts if x == "packed" or fam.block_size]
    work = "forward + backward" if train else "no-grad forward"
    print(f"{args.family}, hidden {args.hidden}, {args.layers} layers, block {fam.block_size}, {args.rows} rows, "
          f"{args.dtype} on {args.device}: {work} per call\n")
    print("| layout | row length | columns | path | warm-up s | s / call | tokens / s | live peak MiB | max diff |\n"
          "|---|---|---|---|---|---|---|---|---|")
    results = []
    for layout in layouts:
        for length in args.lengths:
            batch = {k: v.to(args.device) for k, v in inputs(layout, fam, tok, args.rows, length).items()}
            columns = length * (2 if layout == "doubled" else 1)
            reference = None
            for path, model in (("sdpa", sdpa), ("flex", flex)):
                logits, warm, seconds, peak = measure(model, fam, batch, train, args.device, args.repeats)
                reference = logits if reference is None else reference
                diff = (logits.float() - reference.float()).abs().max().item()
                row = dict(layout=layout, length=length, path=path, warm=warm, seconds=seconds,
                           tokens_per_s=args.rows * length / seconds, peak_mib=peak, diff=diff)
                results.append(row)
                print(f"| {layout} | {length} | {columns} | {path} | {warm:.2f} | {seconds:.3f} | "
                      f"{row['tokens_per_s']:.0f} | {peak:.0f} | {diff:.1e} |", flush=True)
    return results


if __name__ == "__main__":
    main()
