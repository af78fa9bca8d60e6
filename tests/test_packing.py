"""Packed SFT rows (``--data.pack``): several examples per row, each one attending, noised and normalised on its own,
so a packed batch has the loss, gradients and per-example logits of the same examples unpacked."""

import json

import pytest
import torch
from conftest import FAMILIES

import train_sft
from dare.data import SFTCollator, SFTDataConfig
from dare.diffusion import recipe_for, sft_masks
from dare.models import Family, masks
from dare.objectives import sft_loss, sft_noise, sft_units, unpacked_index

MAX = 80  # example 1 (36 tokens) starts at 17 in row 0: it crosses a 32-block of the row, not of its own
PROMPTS, RESPONSES = (3, 6, 2, 5, 4), (14, 30, 5, 20, 7)
TOL = 1e-5


def examples(fam: Family, seed=0) -> list[dict]:
    """tokenize_sft-style examples: random ids (above every special id), the response ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p, r in zip(PROMPTS, RESPONSES, strict=True):
        ids = torch.randint(10, fam.vocab_size, (p + r,), generator=g).tolist()
        out.append({"input_ids": ids[:-1] + [fam.eos_id], "prompt_length": p, "response_length": r})
    return out


def unpacked(fam: Family, exs: list[dict]):
    """The same examples as rows padded to the longest, padding excluded from attention and loss."""
    width = max(len(e["input_ids"]) for e in exs)
    ids = torch.full((len(exs), width), fam.pad_id)
    for n, e in enumerate(exs):
        ids[n, :len(e["input_ids"])] = torch.tensor(e["input_ids"])
    loss_mask, attn = sft_masks(torch.tensor(PROMPTS), torch.tensor(RESPONSES), width, recipe_for("llada2"))
    return ids, loss_mask, attn


def packed(fam: Family, pad_to="max_length"):
    return SFTCollator(fam, SFTDataConfig(max_length=MAX, pack=True, pad_to=pad_to))(examples(fam))


def same_noise(batch, loss_mask_u):
    """Per-example t and masked positions, in both layouts."""
    g = torch.Generator().manual_seed(1)
    t = torch.tensor([0.2, 0.5, 0.9, 0.35, 0.7])
    masked_u = (torch.rand(loss_mask_u.shape, generator=g) < t[:, None]) & loss_mask_u.bool()
    rows, cols, real = unpacked_index(batch["segment_ids"])
    masked_p = torch.zeros_like(batch["input_ids"], dtype=torch.bool)
    masked_p[rows[real], cols[real]] = masked_u[real]
    return t, masked_u, masked_p


def test_rows_segments_and_positions(models):
    _, fam = models["llada"]
    batch = packed(fam)
    seg, pos = batch["segment_ids"], batch["position_ids"]
    assert batch["input_ids"].shape == (2, MAX)  # first fit: [0, 1, 2, 4] and [3]
    assert seg[0].unique().tolist() == [-1, 0, 1, 2, 4] and seg[1].unique().tolist() == [-1, 3]
    for n, e in enumerate(examples(fam)):
        r, c = (seg == n).nonzero(as_tuple=True)
        assert len(c) == len(e["input_ids"]) and bool((c.diff() == 1).all())  # whole and contiguous
        assert batch["input_ids"][r, c].tolist() == e["input_ids"]
        assert pos[r, c].tolist() == list(range(len(c)))  # positions restart per example
        assert batch["loss_mask"][r, c].tolist() == [0] * e["prompt_length"] + [1] * e["response_length"]
    assert torch.equal(masks.segment_positions(seg)[seg >= 0], pos[seg >= 0])
    assert torch.equal(batch["attention_mask"].bool(), seg >= 0) and not batch["loss_mask"][seg < 0].any()
    assert packed(fam, "longest")["input_ids"].shape == (2, 17 + 36 + 7 + 11)


@pytest.mark.parametrize("name", FAMILIES)
def test_packed_loss_and_gradients_equal_unpacked(models, name):
    model, fam = models[name]
    batch = packed(fam)
    ids_u, loss_u, attn_u = unpacked(fam, examples(fam))
    t, masked_u, masked_p = same_noise(batch, loss_u)
    grads = []
    for ids, loss_mask, kw, masked in ((ids_u, loss_u, {"attention_mask": attn_u}, masked_u),
                                       (batch["input_ids"], batch["loss_mask"],
                                        {"segment_ids": batch["segment_ids"]}, masked_p)):
        model.zero_grad()
        loss, parts = sft_loss(model, fam, ids, loss_mask, **kw, t=t, masked=masked, return_parts=True)
        loss.backward()
        grads.append((loss.detach(), parts, [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    model.zero_grad()
    (a, pa, ga), (b, pb, gb) = grads
    assert abs(a - b) < TOL * max(1.0, abs(a)), (a, b)
    for key in ("n_masked", "answer_len", "per_seq"):
        assert torch.allclose(pa[key].float(), pb[key].float(), atol=TOL), key
    assert len(ga) == len(gb) and max((x - y).abs().max() for x, y in zip(ga, gb, strict=True)) < TOL
    recipe = recipe_for(fam)
    assert torch.equal(sft_units(fam, loss_u, masked_u, recipe),
                       sft_units(fam, batch["loss_mask"], masked_p, recipe, batch["segment_ids"]))


def logits_of(model, fam, ids, segment_ids=None, doubled=False):
    with torch.no_grad():
        return fam.logits(model, ids, clean_ids=ids if doubled else None, segment_ids=segment_ids)


@pytest.mark.parametrize("name", FAMILIES)
def test_each_example_sees_only_itself(models, name):
    """Each example's logits in the packed row are its logits alone (Dream's shift included: an example's first
    position does not read the previous example), in every layout the family trains or decodes with; tokens of the
    other examples cannot move them. Without the segment mask they do (negative control)."""
    model, fam = models[name]
    batch = packed(fam)
    seg = batch["segment_ids"]
    coin = torch.rand(seg.shape, generator=torch.Generator().manual_seed(2)) < 0.5
    noisy = batch["input_ids"].masked_fill(batch["loss_mask"].bool() & coin, fam.mask_id)
    others = noisy.clone()
    others[(seg != 1) & (seg >= 0)] = 11  # every token of the other examples changed
    for doubled in (False, True) if fam.is_block_diffusion else (False,):
        full = logits_of(model, fam, noisy, seg, doubled)
        moved = logits_of(model, fam, others, seg, doubled)
        for n in range(len(PROMPTS)):
            r, c = (seg == n).nonzero(as_tuple=True)
            alone = logits_of(model, fam, noisy[r, c][None], doubled=doubled)[0]
            assert (full[r, c] - alone).abs().max() < TOL, (n, doubled)
        r, c = (seg == 1).nonzero(as_tuple=True)
        assert (full[r, c] - moved[r, c]).abs().max() < TOL  # not bitwise: MoE experts batch other tokens
    with torch.no_grad():  # the same row without segments: one sequence, positions 0..L-1
        plain = fam.logits(model, noisy[:1], torch.ones_like(noisy[:1]))
    r, c = (seg[:1] == 1).nonzero(as_tuple=True)
    alone = logits_of(model, fam, noisy[:1, c])[0]
    assert (plain[r, c] - alone).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["sdar", "llada2"])
def test_noise_is_drawn_per_example(models, name):
    """From the same generator state, a packed batch draws the t and the masks of its examples unpacked (padded to
    the longest); SDAR's min_one holds per example."""
    _, fam = models[name]
    batch = packed(fam)
    ids_u, loss_u, _ = unpacked(fam, examples(fam))
    t_u, m_u = sft_noise(fam, ids_u, loss_u, generator=torch.Generator().manual_seed(5))
    t_p, m_p = sft_noise(fam, batch["input_ids"], batch["loss_mask"], generator=torch.Generator().manual_seed(5),
                         segment_ids=batch["segment_ids"])
    rows, cols, real = unpacked_index(batch["segment_ids"])
    assert torch.equal(t_u, t_p) and torch.equal(m_p[rows, cols] & real, m_u)
    assert int(m_p.sum()) == int(m_u.sum()) and not (m_p & ~batch["loss_mask"].bool()).any()
    if name == "sdar":
        low = sft_noise(fam, batch["input_ids"], batch["loss_mask"], segment_ids=batch["segment_ids"],
                        t=torch.full((5,), 1e-6), generator=torch.Generator().manual_seed(0))[1]
        assert [int(low[batch["segment_ids"] == n].sum()) for n in range(5)] == [1] * 5


def test_clear_errors(models):
    model, fam = models["llada"]
    with pytest.raises(ValueError, match="does not fit a packed row"):
        SFTCollator(fam, SFTDataConfig(max_length=20, pack=True))(examples(fam))
    with pytest.raises(ValueError, match="pad_to must be one of"):
        SFTDataConfig(pad_to="row")
    batch = packed(fam)
    ids, loss_mask, seg = batch["input_ids"], batch["loss_mask"], batch["segment_ids"]
    with pytest.raises(ValueError, match="one per example"):
        sft_loss(model, fam, ids, loss_mask, segment_ids=seg, t=torch.ones(2), masked=loss_mask.bool())
    split = seg.clone()
    split[0, 2:4] = 3  # example 3 twice
    with pytest.raises(ValueError, match="contiguous run"):
        sft_loss(model, fam, ids, loss_mask, segment_ids=split)
    with pytest.raises(ValueError, match="attention_mask must be segment_ids >= 0"):
        sft_loss(model, fam, ids, loss_mask, torch.ones_like(ids), segment_ids=seg)
    with pytest.raises(ValueError, match="pass no attention_mask"):
        fam.logits(model, ids, batch["attention_mask"], segment_ids=seg)
    dream_model, dream = models["dream"]
    batch = packed(dream)
    first = batch["loss_mask"].clone()
    first[0, 17] = 1  # the first (prompt) token of example 1, in the middle of row 0
    with pytest.raises(ValueError, match="position 0 \\(its first"):
        sft_loss(dream_model, dream, batch["input_ids"], first, segment_ids=batch["segment_ids"])


def test_train_sft_pack_end_to_end(tmp_path, monkeypatch):
    """--data.pack through the real Trainer. LLaDA2 never trains its pads, so packed and unpacked (pad_to=longest)
    runs see the same batches, draw the same noise and log the same losses."""
    path = tmp_path / "arith.jsonl"
    path.write_text("".join(json.dumps({"q": f"{a}+{b}=?", "a": f"{a}+{b}={a + b}" + " so" * (a * b % 7)}) + "\n"
                            for a in range(8) for b in range(4)))
    shapes, pack_rows = [], SFTCollator.pack

    def recorded(self, exs):
        batch = pack_rows(self, exs)
        shapes.append((len(exs), len(batch["input_ids"])))
        return batch

    monkeypatch.setattr(SFTCollator, "pack", recorded)
    losses = {}
    for name, pack in (("llada", True), ("llada2", True), ("llada2", False)):
        args = train_sft.Args(model=f"tiny:{name}", output_dir=str(tmp_path / f"{name}-{pack}"), logging_steps=1,
                              per_device_train_batch_size=8, max_steps=3, save_steps=3, warmup_steps=0.0)
        args.data.path, args.data.prompt_key, args.data.response_key = str(path), "q", "a"
        args.data.max_length, args.data.pad_to, args.data.pack = 192, "longest", pack
        train_sft.main(args)
        state = json.loads((tmp_path / f"{name}-{pack}" / "checkpoint-3" / "trainer_state.json").read_text())
        losses[name, pack] = [h["loss"] for h in state["log_history"] if "loss" in h]
    assert len(losses["llada", True]) == 3 and all(x > 0 for x in losses["llada", True])
    assert losses["llada2", True] == pytest.approx(losses["llada2", False], rel=1e-5)
    assert shapes and all(rows < examples for examples, rows in shapes)  # 8 examples in about 3 rows

