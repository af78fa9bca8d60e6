"""SFT throughput of packed rows (``--data.pack``) against padded rows, on the length-skewed GSM8K SFT data; with
``--rl``, the same for RL scoring passes (``train_rl.py --pack``).

    python bench/bench_packing.py                               # tiny:llada, batch 16 at max_length 1024, 5 timed steps
    python bench/bench_packing.py --family sdar --hidden 256 --steps 10
    python bench/bench_packing.py --quick                       # a smoke run (tests/test_benches.py)
    python bench/bench_packing.py --rl --family sdar            # RL scoring: padded vs packed rows
    python bench/bench_packing.py --rl --family llada --vocab 126464 --gen-length 256   # LLaDA-8B's output layer

How the data, the modes and the columns are made: bench/README.md.
"""

import argparse
import time
from pathlib import Path

import torch
from _common import LivePeak, hidden_override, in_child

from dare.data import SFTCollator, SFTDataConfig, load_rows, tokenize_sft
from dare.data.sft import as_sft_rows
from dare.likelihood import MeanField, score_tokens
from dare.models import FAMILIES, Family, tiny
from dare.objectives import sft_loss
from dare.packing import PackedFamily

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "sft" / "train" / "gsm8k_train.parquet"
MODES = {"pad max_length": dict(pad_to="max_length"), "pad longest": dict(pad_to="longest"),
         "packed": dict(pad_to="max_length", pack=True)}
RL_MODES = {"padded": 0, "packed": 1, "packed 2x": 2}  # PackedFamily's row width, in batch widths (0: unpacked)


def micro_batches(args, tok, fam) -> list[list[dict]]:
    """The tokenized examples, ``--batch`` per step, in order."""
    rows = load_rows(str(args.data)).select(range(args.batch * (args.warmup + args.steps)))
    rows, config = as_sft_rows(rows, SFTDataConfig(max_length=args.max_length, truncation="right"))
    examples = [tokenize_sft(r, tok, fam, config) for r in rows]
    return [examples[i:i + args.batch] for i in range(0, len(examples), args.batch)]


def train(args, mode, steps):
    """``[(seconds, real tokens, row slots, rows, score entries)]`` per step (collation included, as in a Trainer)."""
    model, tok = tiny(args.family, seed=0, **hidden_override(args.family, args.hidden, args.vocab))
    model.config._attn_implementation = args.attn
    model.to(args.device).train()
    fam = Family.from_pretrained(model.config, tok)
    collate = SFTCollator(fam, SFTDataConfig(max_length=args.max_length, **MODES[mode]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01)
    generator = torch.Generator().manual_seed(args.seed)
    out = []
    for examples in micro_batches(args, tok, fam)[:steps]:
        start = time.perf_counter()
        batch = {k: v.to(args.device) for k, v in collate(examples).items()}
        loss = sft_loss(model, fam, batch["input_ids"], batch["loss_mask"], batch["attention_mask"],
                        segment_ids=batch.get("segment_ids"), generator=generator)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        real = sum(len(e["input_ids"]) for e in examples)
        rows, width = batch["input_ids"].shape
        out.append((time.perf_counter() - start, real, rows * width, rows, rows * width ** 2))
    return out


def rollouts(args, tok, fam) -> list[dict]:
    """RL micro-batches from the GSM8K rows: left-padded chat prompts, the answers as completions (see above)."""
    out = []
    for examples in micro_batches(args, tok, fam):
        prompts = [e["input_ids"][:e["prompt_length"]] for e in examples]
        answers = [e["input_ids"][e["prompt_length"]:][:args.gen_length] for e in examples]
        width = max(map(len, prompts))
        prompt = torch.full((len(examples), width), fam.pad_id)
        completion = torch.full((len(examples), args.gen_length), fam.eos_id)
        for n, (q, a) in enumerate(zip(prompts, answers, strict=True)):
            prompt[n, width - len(q):], completion[n, :len(a)] = torch.tensor(q), torch.tensor(a)
        lengths = torch.tensor(list(map(len, answers)))[:, None]
        out.append({"prompt_ids": prompt, "prompt_mask": (prompt != fam.pad_id).long(), "completion_ids": completion,
                    "completion_mask": (torch.arange(args.gen_length) < lengths).long()})
    return out


class Shapes:
    """The family, recording the shape of every row batch it scores."""

    def __init__(self, family):
        self.family, self.shapes = family, []

    def __getattr__(self, name):
        return getattr(self.family, name)

    def logits(self, model, input_ids, *a, **kw):
        self.shapes.append(tuple(input_ids.shape))
        return self.family.logits(model, input_ids, *a, **kw)


def score(args, mode, steps):
    """``train``'s per-step tuples for one RL scoring forward + backward (``--rl``)."""
    model, tok = tiny(args.family, seed=0, **hidden_override(args.family, args.hidden, args.vocab))
    model.config._attn_implementation = args.attn
    model.to(args.device).train()
    fam = Family.from_pretrained(model.config, tok)
    recorder = Shapes(fam)
    generator, out = torch.Generator().manual_seed(args.seed), []
    for batch in rollouts(args, tok, fam)[:steps]:
        start = time.perf_counter()
        batch = {k: v.to(args.device) for k, v in batch.items()}
        width = batch["prompt_ids"].shape[1] + args.gen_length
        scorer = PackedFamily(recorder, RL_MODES[mode] * width) if RL_MODES[mode] else recorder
        noisy = MeanField(0.15).corrupt(fam, batch, generator)["noisy"]
        mask = batch["completion_mask"]
        (-(score_tokens(model, scorer, batch, noisy).logp * mask).sum() / mask.sum()).backward()
        model.zero_grad(set_to_none=True)
        if args.device == "cuda":
            torch.cuda.synchronize()
        rows, width = recorder.shapes[-1][:2]
        real = int(batch["prompt_mask"].sum() + (mask if fam.is_block_diffusion else torch.ones_like(mask)).sum())
        layout = 2 if fam.is_block_diffusion else 1  # [x_t ‖ x_0]
        out.append((time.perf_counter() - start, real, rows * width, rows, rows * (layout * width) ** 2))
    return out


def timed_child(args, mode, queue):
    torch.set_num_threads(args.threads or torch.get_num_threads())
    queue.put((score if args.rl else train)(args, mode, args.warmup + args.steps)[args.warmup:])


def memory_child(args, mode, queue):
    with LivePeak(args.device) as peak:
        (score if args.rl else train)(args, mode, 2)
    queue.put(peak.mib)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA, help="GSM8K SFT parquet (default: ../shared/data/sft/...)")
    p.add_argument("--family", default="llada", choices=FAMILIES, help="tiny model family (default llada)")
    p.add_argument("--hidden", type=int, default=0, help="override the tiny hidden size (0 = tiny default)")
    p.add_argument("--vocab", type=int, default=0,
                   help="output-layer rows of the tiny model (0 = the tiny tokenizer's 512; 126464 = LLaDA-8B's)")
    p.add_argument("--batch", type=int, default=16, help="examples per micro-batch (default 16)")
    p.add_argument("--max-length", type=int, default=1024, help="row length (default 1024; GSM8K's longest ~ 900)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    p.add_argument("--steps", type=int, default=5, help="timed steps (default 5)")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    p.add_argument("--threads", type=int, default=1, help="torch threads per child (default 1; 0 = torch default)")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    p.add_argument("--quick", action="store_true", help="batch 8, max_length 1024, 1 timed step, no memory")
    p.add_argument("--rl", action="store_true", help="RL scoring passes (padded vs packed) instead of SFT steps")
    p.add_argument("--gen-length", type=int, default=256, help="--rl: the completion canvas (default 256)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.warmup, args.steps, args.no_memory = 8, 0, 1, True
    if not args.data.exists():
        print(f"bench_packing: {args.data} is absent (the GSM8K SFT parquet of ../shared); nothing to measure")
        return []
    what = f"RL scoring of {args.gen_length}-token completions" if args.rl else f"rows of {args.max_length}"
    vocab = f", output layer {args.vocab} rows" if args.vocab else ""
    print(f"tiny:{args.family}{vocab}, {args.batch} GSM8K examples per step, {what}, {args.warmup} "
          f"warm-up + {args.steps} timed steps, device {args.device}")
    print("| mode | rows / step | padding % | scores M | real tokens / step | ms / step | real tokens/s | speed-up "
          "| peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    table, base = [], None
    for mode in RL_MODES if args.rl else MODES:
        steps = in_child(timed_child, args, mode)
        seconds, real = sum(s[0] for s in steps), sum(s[1] for s in steps)
        padding = 1 - real / sum(s[2] for s in steps)
        rate = real / seconds
        base = base or rate
        peak = "-" if args.no_memory else f"{in_child(memory_child, args, mode):.1f}"
        table.append((mode, rate, padding))
        n, scores = len(steps), sum(s[4] for s in steps) / len(steps) / 1e6
        print(f"| {mode} | {sum(s[3] for s in steps) / n:.1f} | {padding * 100:.1f} | {scores:.1f} | {real / n:,.0f} | "
              f"{seconds / n * 1e3:.0f} | {rate:,.0f} | {rate / base:.2f}x | {peak} |", flush=True)
    return table


if __name__ == "__main__":
    main()
