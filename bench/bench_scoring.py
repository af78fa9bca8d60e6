"""RL scoring in the block families' ``[x_t ‖ x_0]`` layout, forward + backward of the completion's log-probabilities
on one CPU thread: the whole noisy half (before), the noisy half without the prompt's whole blocks
(``dare.models.masks.unread_noisy_columns``), and the same with the clean half in a pass of its own and the noisy
half fed against its keys and values (what every estimator does now, ``Family.clean_cache``). Left-padded prompts of
``--prompt`` tokens (up to 16 fewer per row), completions of ``--completion``. Then ``--draws`` no-grad draws of the
same rows (how the old policy, the reference and a sequence-level algorithm's first stream score a multi-draw
estimator): each draw alone, with its own clean pass, against the clean half computed once for all of them (now:
``likelihood.shared_clean``).

    python bench/bench_scoring.py                                   # SDAR, hidden 256, 4 layers, 4 x (128 + 256)
    python bench/bench_scoring.py --family llada2 --prompt 256 --completion 256
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from _common import LivePeak, hidden_override  # noqa: E402

from dare.likelihood import MCElbo  # noqa: E402
from dare.models import Family, masks, tiny  # noqa: E402


def batch(fam, tok, rows: int, prompt: int, completion: int):
    g = torch.Generator().manual_seed(0)
    x0 = torch.randint(20, len(tok), (rows, prompt + completion), generator=g)
    mask = torch.ones_like(x0)
    for r in range(rows):
        mask[r, :int(torch.randint(0, 17, (1,), generator=g))] = 0
    xt = x0.clone()
    xt[:, prompt:] = x0[:, prompt:].masked_fill(torch.rand(rows, completion, generator=g) < 0.5, fam.mask_id)
    return xt, x0, mask, torch.arange(prompt, prompt + completion)


def step(model, fam, xt, x0, mask, rows, skip: bool | str):
    if skip == "split":  # what the estimators do now: the clean half's pass, then the noisy half against its cache
        logits = fam.logits(model, xt, mask, clean_ids=x0, keep=rows, clean_cache=fam.clean_cache(model, x0, mask))
    elif skip:
        logits = fam.logits(model, xt, mask, clean_ids=x0, keep=rows)
    else:  # what every estimator did before: the whole noisy half, the completion's rows kept
        ids, pos, ok = masks.doubled_layout(xt, x0, mask, fam.block_size)
        logits = model(input_ids=ids, attention_mask=masks.additive(ok, torch.float32), position_ids=pos,
                       logits_to_keep=rows).logits
    logp = logits.float().log_softmax(-1).gather(-1, x0[:, rows, None])
    logp.sum().backward()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="sdar", choices=["sdar", "sdar_moe", "llada2"])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--completion", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--draws", type=int, default=8, help="no-grad draws of the multi-draw table (0: skip it)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model, tok = tiny(args.family, num_hidden_layers=args.layers, **hidden_override(args.family, args.hidden))
    model.train()
    fam = Family.from_pretrained(model.config, tok)
    xt, x0, mask, rows = batch(fam, tok, args.rows, args.prompt, args.completion)
    skipped = masks.unread_noisy_columns(mask, rows, x0.shape[1], fam.block_size)
    print(f"{args.family}, hidden {args.hidden}, {args.layers} layers, block {fam.block_size}: {args.rows} rows x "
          f"({args.prompt} prompt + {args.completion} completion); the layout has {2 * x0.shape[1]} columns, "
          f"{skipped} of them skipped\n")
    print("| layout | columns | s / forward+backward | live peak MiB |\n|---|---|---|---|")
    results = []
    for name, skip in (("whole noisy half (before)", False), ("prompt's noisy blocks skipped, one call", True),
                       ("the same, clean half in its own pass (now)", "split")):
        step(model, fam, xt, x0, mask, rows, skip)  # warm-up
        model.zero_grad(set_to_none=True)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            step(model, fam, xt, x0, mask, rows, skip)
            times.append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
        with LivePeak() as peak:
            step(model, fam, xt, x0, mask, rows, skip)
        model.zero_grad(set_to_none=True)
        columns = 2 * x0.shape[1] - (skipped if skip else 0)  # fed in total (the split: in two calls)
        results.append((name, columns, min(times), peak.mib))
        print(f"| {name} | {columns} | {min(times):.3f} | {peak.mib:.0f} |", flush=True)
    if args.draws:
        results += draws_table(model, fam, xt, x0, mask, rows, args)
    return results


def draws_table(model, fam, xt, x0, mask, rows, args):
    """No-grad MCElbo scoring of ``args.draws`` draws: each alone (its own clean pass), or the clean half shared."""
    prompt = x0.shape[1] - len(rows)
    batch = {"prompt_ids": x0[:, :prompt], "prompt_mask": mask[:, :prompt], "completion_ids": x0[:, prompt:],
             "completion_mask": torch.ones_like(x0[:, prompt:]), "loss_mask": torch.ones_like(x0[:, prompt:])}
    est = MCElbo(samples=args.draws)
    noise = est.corrupt(fam, batch, torch.Generator().manual_seed(0))
    print(f"\n{args.draws} no-grad draws (MCElbo) of the same rows:\n\n| scoring | s / {args.draws} draws | "
          "live peak MiB |\n|---|---|---|")
    out, values = [], {}
    model.eval()
    for name, shared in (("each draw alone, its own clean pass", False), ("clean half shared (now)", True)):
        def score(shared=shared):
            with torch.no_grad():
                if shared:
                    return est.score(model, fam, batch, noise).logp
                return torch.cat([est.score(model, fam, batch, noise, draw=j).logp for j in range(args.draws)], -1)
        values[name] = score()  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            score()
            times.append(time.perf_counter() - start)
        with LivePeak() as peak:
            score()
        out.append((name, args.draws, min(times), peak.mib))
        print(f"| {name} | {min(times):.3f} | {peak.mib:.0f} |", flush=True)
    before, now = values.values()
    print(f"\nlargest difference of the estimates: {(before - now).abs().max().item():.1e}")
    return out


if __name__ == "__main__":
    main()
