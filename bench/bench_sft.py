"""Framework overhead of SFT: ``DiffusionSFTTrainer`` (transformers Trainer) vs a minimal hand-written PyTorch loop
doing the same work (same tiny model init, same collated batches, ``sft_loss`` + backward + grad clipping + AdamW
step + zero_grad), per tiny family. Target: overhead < 10 %.

    python bench/bench_sft.py                         # batch 8, prompt ~16 + response ~48 tokens, all families
    python bench/bench_sft.py --families sdar llada2 --hidden 256 --steps 50
    python bench/bench_sft.py --logging-steps 1 --num-workers 2     # how Trainer settings move the overhead

How steps are timed and memory measured: bench/README.md.
"""

import argparse
import random
import shutil
import statistics
import tempfile
import time
from itertools import pairwise

import torch
from _common import LivePeak, hidden_override, in_child

from dare.data import SFTCollator, SFTDataConfig
from dare.models import FAMILIES, Family, tiny
from dare.objectives import sft_loss


def synthetic_rows(args, fam: Family, vocab: int) -> list[dict]:
    """Tokenized SFT examples (the ``tokenize_sft`` output format), one per sequence of every step."""
    rng = random.Random(args.seed)
    stop = [i for i in fam.stop_ids if i != fam.eos_id][:1]
    rows = []
    for _ in range(args.batch * (args.warmup + args.steps)):
        p = rng.randint(args.prompt - 4, args.prompt + 4)
        r = rng.randint(args.response - 4, args.response + 4) - len(stop) - 1
        ids = [rng.randrange(20, vocab) for _ in range(p + r)]
        rows.append({"input_ids": ids + stop + [fam.eos_id], "prompt_length": p, "response_length": r + len(stop) + 1})
    assert max(len(r["input_ids"]) for r in rows) <= args.max_length, "raise --max-length"
    return rows


def build(args, family):
    model, tok = tiny(family, seed=0, **hidden_override(family, args.hidden))
    model.config._attn_implementation = args.attn
    model.to(args.device).train()
    fam = Family.from_pretrained(model.config, tok)
    config = SFTDataConfig(max_length=args.max_length, pad_to="max_length")
    return model, tok, fam, synthetic_rows(args, fam, len(tok)), SFTCollator(fam, config)


def sync(args):
    if args.device == "cuda":
        torch.cuda.synchronize()


def run_trainer(args, model, tok, fam, rows, collator):
    from transformers import TrainerCallback, TrainingArguments

    from dare.trainers import DiffusionSFTTrainer

    ends = []

    class StepClock(TrainerCallback):
        def on_step_end(self, *_, **__):
            sync(args)
            ends.append(time.perf_counter())

    out = tempfile.mkdtemp(prefix="bench_sft_")
    try:
        training_args = TrainingArguments(
            output_dir=out, max_steps=args.warmup + args.steps, per_device_train_batch_size=args.batch,
            learning_rate=1e-4, weight_decay=0.01, adam_beta2=0.95, max_grad_norm=args.max_grad_norm,
            optim=args.optim, save_strategy="no", logging_steps=args.logging_steps, report_to="none",
            disable_tqdm=True, dataloader_num_workers=args.num_workers,
            dataloader_pin_memory=args.device == "cuda", include_num_input_tokens_seen=args.tokens_seen,
            use_cpu=args.device == "cpu", seed=args.seed, remove_unused_columns=False)
        trainer = DiffusionSFTTrainer(model=model, args=training_args, train_dataset=rows, family=fam,
                                      data_collator=collator, processing_class=tok, callbacks=[StepClock()])
        ends.append(time.perf_counter())
        trainer.train()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return ends


def run_loop(args, model, tok, fam, rows, collator):
    fused = args.optim == "adamw_torch_fused"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01,
                                  fused=fused or None)
    generator = torch.Generator().manual_seed(args.seed)
    loader = torch.utils.data.DataLoader(rows, batch_size=args.batch, shuffle=True, collate_fn=collator,
                                         generator=generator, num_workers=args.num_workers)
    model.train()
    ends = [time.perf_counter()]
    for batch in loader:
        batch = {k: v.to(args.device) for k, v in batch.items()}
        loss = sft_loss(model, fam, batch["input_ids"], batch["loss_mask"], batch["attention_mask"])
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(args)
        ends.append(time.perf_counter())
    return ends


def child(args, family, kind, queue):
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tok, fam, rows, collator = build(args, family)
    params = sum(p.numel() for p in model.parameters())
    start = time.perf_counter()
    ends = (run_trainer if kind == "trainer" else run_loop)(args, model, tok, fam, rows, collator)
    wall = time.perf_counter() - start
    steps = [b - a for a, b in pairwise(ends)]
    assert len(steps) == args.warmup + args.steps, f"{kind}: {len(steps)} steps recorded"
    queue.put((statistics.median(steps[args.warmup:]), params, wall))


def memory_child(args, family, kind, queue):
    """Live-tensor peak of the first two steps (model built before, so its weights are not counted)."""
    args = argparse.Namespace(**{**vars(args), "warmup": 1, "steps": 1})
    torch.manual_seed(args.seed)
    model, tok, fam, rows, collator = build(args, family)
    with LivePeak(args.device) as peak:
        (run_trainer if kind == "trainer" else run_loop)(args, model, tok, fam, rows, collator)
    queue.put(peak.mib)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    p.add_argument("--batch", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--prompt", type=int, default=16, help="mean prompt tokens, +-4 (default 16)")
    p.add_argument("--response", type=int, default=48, help="mean response tokens incl. EOS, +-4 (default 48)")
    p.add_argument("--max-length", type=int, default=72, help="padded sequence length (default 72 = 16+48+8)")
    p.add_argument("--hidden", type=int, default=0, help="override the tiny hidden size (0 = tiny default)")
    p.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    p.add_argument("--steps", type=int, default=30, help="timed steps, median step time reported (default 30)")
    p.add_argument("--optim", default="adamw_torch_fused", choices=["adamw_torch_fused", "adamw_torch"],
                   help="AdamW variant, same in both paths (default: the Trainer default, fused)")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="grad clipping in both paths (0 = off)")
    p.add_argument("--logging-steps", type=int, default=10**9, help="Trainer logging_steps (default: never)")
    p.add_argument("--num-workers", type=int, default=0, help="dataloader workers in both paths (default 0)")
    p.add_argument("--tokens-seen", default="no", choices=["no", "all", "non_padding"],
                   help="Trainer include_num_input_tokens_seen (default no)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per child (default 1: less noise on a shared CPU; 0 = torch default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    tokens = args.batch * args.max_length
    print(f"batch {args.batch} x {args.max_length} tokens (all tokens counted), {args.warmup} warm-up + "
          f"{args.steps} timed steps, device {args.device}, torch threads {args.threads or torch.get_num_threads()}")
    print("| family | params | trainer ms/step | loop ms/step | trainer tokens/s | loop tokens/s | overhead % "
          "| trainer peak MiB | loop peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    start = time.perf_counter()
    for family in args.families:
        t_step, params, _ = in_child(child, args, family, "trainer")
        l_step, _, _ = in_child(child, args, family, "loop")
        t_peak, l_peak = (in_child(memory_child, args, family, kind) for kind in ("trainer", "loop"))
        print(f"| {family} | {params / 1e6:.2f}M | {t_step * 1e3:.1f} | {l_step * 1e3:.1f} | {tokens / t_step:,.0f} | "
              f"{tokens / l_step:,.0f} | {(t_step / l_step - 1) * 100:+.1f} | {t_peak:.1f} | {l_peak:.1f} |",
              flush=True)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
