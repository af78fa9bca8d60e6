"""Launched by tests/test_sequence_parallel.py on 2 CPU processes (gloo): Ulysses SP=2 (dare.parallel) against the
1-process full forward, for every family and layout, packed rows included. Per case, on every rank:

* the rows of ``sp.logits`` gathered over the 2 ranks equal ``family.logits`` of the full batch (max |d| < 1e-5);
* the gradients of a loss summed over the sequence (each rank: its rows; gradients summed over the SP group) equal
  the full-batch gradients (max |d| < 1e-5);
* negative control: the same local chunks with attention restricted to the rank's own chunk (plain sdpa, the diagonal
  block of the mask, no exchange) differ from the SP logits by > 1e-3 on some rank, so the exchange is what makes them
  match (on rank 0 alone a block-causal layout needs no exchange: its chunk never looks ahead).

RL scoring through ``PackedFamily(SequenceParallelFamily(family))`` (``train_rl.py --pack --sequence-parallel 2``):
per-token log-probs and gradients of an odd-width rollout batch equal the plain 1-process ``score_tokens``.
"""

import torch
import torch.distributed as dist

from dare.config import leave_together
from dare.likelihood import score_tokens
from dare.models import Family, masks, tiny
from dare.packing import PackedFamily
from dare.parallel import SequenceParallel, SequenceParallelFamily

TOL, CONTROL = 1e-5, 1e-3
B, L = 2, 16
# packed rows (-1: padding): an example across the rank boundary (8), one starting on it, one ending a row
SEGMENTS = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [3] * 8 + [4] * 5 + [-1] * 3])
# family, config overrides, layout, padded second row (or "packed" rows), gradient checkpointing
CASES = [
    ("llada", {}, "plain", False, False),  # no padding: fully visible, the [1, 1, 1, L] zero mask
    ("llada", {}, "plain", True, False),  # padding excluded from attention
    ("dream", {}, "plain", True, False),  # GQA 4/2, the logit shift across the rank boundary
    ("dream", {"num_key_value_heads": 1}, "plain", False, False),  # 1 KV head: repeated to 2 for sp=2
    ("sdar", {}, "plain", True, False),  # block-causal
    ("sdar", {}, "doubled", True, False),  # [x_t ‖ x_0]
    ("sdar", {}, "doubled", True, True),  # ... with gradient checkpointing (the recompute exchanges again)
    ("llada2", {"block_size": 4}, "plain", True, False),  # MoE, partial RoPE, block-causal with pad exclusion
    ("llada2", {"block_size": 4}, "doubled", True, False),
    ("llada", {}, "plain", "packed", False),
    ("dream", {}, "plain", "packed", False),  # the shift inside an example across the boundary, not across examples
    ("sdar", {}, "doubled", "packed", False),
    ("llada2", {"block_size": 4}, "plain", "packed", False),
]


def grads(model):
    return {n: (p.grad if p.grad is not None else torch.zeros_like(p)).clone() for n, p in model.named_parameters()}


def run_case(sp, name, overrides, layout, padded, checkpointing):
    model, tok = tiny(name, **overrides)  # same seed, same weights on every rank
    family = Family.from_pretrained(model.config, tok)
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
        model.train()
    g = torch.Generator().manual_seed(0)  # same batch on every rank
    clean = torch.randint(10, min(model.config.vocab_size, 200), (B, L), generator=g)
    attention = torch.ones(B, L, dtype=torch.long)
    if padded:
        attention[1, L - 5:] = 0
        clean[1, L - 5:] = family.pad_id
    noisy = clean.masked_fill(torch.rand(B, L, generator=g) < 0.5, family.mask_id)
    kw = dict(attention_mask=attention if padded else None, clean_ids=clean if layout == "doubled" else None)
    if padded == "packed":
        kw = dict(segment_ids=SEGMENTS, clean_ids=kw["clean_ids"])
    weight = torch.randn(B, L, model.config.vocab_size, generator=g) / (B * L)  # a per-token mean over the batch

    model.set_attn_implementation("sdpa")  # reference: the whole batch in one process
    ref = family.logits(model, noisy, **kw)
    (ref.float() * weight).sum().backward()
    ref_grads = grads(model)
    model.zero_grad(set_to_none=True)

    model.set_attn_implementation("ulysses_sdpa")
    local = sp.logits(family, model, noisy, **kw)
    (local.float() * sp.shard(weight)).sum().backward()
    sp_grads = grads(model)
    for g_ in sp_grads.values():
        dist.all_reduce(g_, group=sp.group)
    d_logits = (sp.gather(local.detach()) - ref.detach()).abs().max().item()
    d_grads = max((sp_grads[n] - ref_grads[n]).abs().max().item() for n in ref_grads)

    # negative control: the same local chunk, attention over the rank's own chunk only
    with torch.no_grad():
        if layout == "doubled":
            ids, pos, ok = masks.doubled_layout(noisy, clean, kw.get("attention_mask"), family.block_size,
                                                kw.get("segment_ids"))
            order = torch.arange(2 * L).view(2, sp.size, -1).transpose(0, 1).reshape(-1)
            inputs = sp.inputs(model, ids, masks.additive(ok, torch.float32), pos, order)
        elif padded == "packed":
            pos, ok = masks.packed_layout(SEGMENTS, family.block_size)
            inputs = sp.inputs(model, noisy, masks.additive(ok, torch.float32), pos)
        else:
            inputs = sp.inputs(model, noisy, kw["attention_mask"])
        sharded = model(**inputs).logits
        rows = sp.chunk(inputs["attention_mask"].shape[-1])
        mask = inputs["attention_mask"]
        inputs["attention_mask"] = mask[..., rows] if mask.shape[-2] == 1 else mask[:, :, rows, rows]
        model.set_attn_implementation("sdpa")
        d_control = (model(**inputs).logits - sharded).abs().max().item()
    return d_logits, d_grads, d_control


def run_rl_case(sp, name):
    """score_tokens through PackedFamily(SequenceParallelFamily(family)) vs family alone: left-padded prompts,
    completions stopping early, width 15, packed into rows of up to 29 tokens (odd: SP pads them)."""
    model, tok = tiny(name)
    family = Family.from_pretrained(model.config, tok)
    g = torch.Generator().manual_seed(1)
    prompt_mask = (torch.arange(5) >= torch.tensor([0, 3, 1, 4])[:, None]).long()
    completion_mask = (torch.arange(10) < torch.tensor([10, 3, 6, 1])[:, None]).long()
    batch = {"prompt_ids": torch.randint(10, 200, (4, 5), generator=g).masked_fill(prompt_mask == 0, family.pad_id),
             "prompt_mask": prompt_mask, "completion_ids": torch.randint(10, 200, (4, 10), generator=g),
             "completion_mask": completion_mask}
    noisy = torch.cat([batch["prompt_ids"], batch["completion_ids"].masked_fill(torch.rand(4, 10, generator=g) < 0.5,
                                                                                family.mask_id)], 1)
    weight = torch.randn(4, 10, generator=g) * completion_mask
    results = []
    for scorer, attention in ((family, "sdpa"), (PackedFamily(SequenceParallelFamily(family, sp), 29), "ulysses_sdpa")):
        model.set_attn_implementation(attention)
        logp = score_tokens(model, scorer, batch, noisy).logp
        (logp * weight).sum().backward()
        results.append((logp.detach(), grads(model)))
        model.zero_grad(set_to_none=True)
    (ref, ref_grads), (got, got_grads) = results
    for g_ in got_grads.values():  # every process scored the whole rows: the group's sum is sp x the gradient
        dist.all_reduce(g_, group=sp.group)
        g_ /= sp.size
    d_logp = (got - ref)[completion_mask.bool()].abs().max().item()
    return d_logp, max((got_grads[n] - ref_grads[n]).abs().max().item() for n in ref_grads)


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    sp = SequenceParallel()
    assert sp.size == 2, f"expected 2 processes, got {sp.size}"
    failures = []
    for name, overrides, layout, padded, checkpointing in CASES:
        d_logits, d_grads, d_control = run_case(sp, name, overrides, layout, padded, checkpointing)
        # the control over both ranks: under a block-causal rule the first chunk never looks ahead (rank 0 alone is
        # exact without the exchange), the later chunks do
        d_control = torch.tensor(d_control)
        dist.all_reduce(d_control, op=dist.ReduceOp.MAX, group=sp.group)
        d_control = d_control.item()
        shape = " packed" if padded == "packed" else " padded" if padded else ""
        label = f"{name}{overrides or ''} {layout}{shape}{' ckpt' if checkpointing else ''}"
        ok = d_logits < TOL and d_grads < TOL and d_control > CONTROL
        print(f"sp_check rank={sp.rank} {label}: max|dlogits|={d_logits:.2e} max|dgrad|={d_grads:.2e} "
              f"control max|d|={d_control:.2e} {'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(label)
    for name in ("dream", "sdar"):
        d_logp, d_grads = run_rl_case(sp, name)
        ok = d_logp < TOL and d_grads < TOL
        print(f"sp_check rank={sp.rank} {name} rl packed: max|dlogp|={d_logp:.2e} max|dgrad|={d_grads:.2e} "
              f"{'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(f"{name} rl packed")
    dist.barrier()
    assert not failures, f"rank {sp.rank}: {failures}"
    print(f"sp_check rank={sp.rank} OK", flush=True)
    leave_together()


if __name__ == "__main__":
    main()
