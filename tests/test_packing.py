"""Packed SFT rows (``--data.pack``): several examples per row, each one attending, noised and normalised on its own,
so a packed batch has the loss, gradients and per-example logits of the same examples unpacked. Packed RL scoring
(``train_rl.py --pack``, ``dare.packing.PackedFamily``): the estimators' log-probs, losses and a training run equal
the unpacked ones."""

import json

import pytest
import torch
from conftest import FAMILIES

import train_rl
import train_sft
from dare.algos import get_algorithm
from dare.data import SFTCollator, SFTDataConfig
from dare.diffusion import recipe_for, sft_masks
from dare.likelihood import Autoregressive, MCElbo, rollout_attention, whole_blocks
from dare.models import Family, masks
from dare.objectives import sft_loss, sft_noise, sft_units, unpacked_index
from dare.packing import PackedFamily
from dare.sampling import SamplingConfig

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
    with pytest.raises(ValueError, match="packed rows keep a boolean mask of their shape"):
        fam.logits(model, ids, segment_ids=seg, keep=8)
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



# -- packed RL scoring ------------------------------------------------------------------------------------------
SCORED = ("llada", "dream", "sdar", "llada2")
PROMPT_LENGTHS, STOPS = (7, 3, 5, 1, 6), (12, 4, 9, 1, 6)  # left-padded prompts; completions stopping early


def rollout(fam: Family) -> dict:
    """A rollout batch: left-padded prompts, completions up to their stop token (EOS after it), as make_batch has it."""
    g = torch.Generator().manual_seed(3)
    n, p, r = len(STOPS), max(PROMPT_LENGTHS), max(STOPS)
    prompt_mask = (torch.arange(p) >= p - torch.tensor(PROMPT_LENGTHS)[:, None]).long()
    completion_mask = (torch.arange(r) < torch.tensor(STOPS)[:, None]).long()
    prompt = torch.randint(10, 200, (n, p), generator=g).masked_fill(prompt_mask == 0, fam.pad_id)
    completion = torch.randint(10, 200, (n, r), generator=g).masked_fill(torch.arange(r) >= torch.tensor(STOPS)[:, None]
                                                                        - 1, fam.eos_id)
    return {"prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": completion,
            "completion_mask": completion_mask, "loss_mask": completion_mask.clone(),
            "advantages": torch.randn(n, generator=g)}


class WithoutSegments:
    """Negative control: the packed rows scored as one sequence each (examples see each other)."""

    def __init__(self, fam):
        self.fam = fam

    def __getattr__(self, name):
        return getattr(self.fam, name)

    def logits(self, model, ids, clean_ids=None, segment_ids=None, keep=None):
        out = self.fam.logits(model, ids, torch.ones_like(ids), clean_ids=clean_ids)
        return out if keep is None else out[keep]


@pytest.mark.parametrize("name", SCORED)
def test_packed_scoring_logits_equal_unpacked(models, name):
    """At every attended position of the rows, in each layout and ``keep`` form the estimators use, the logits of rows
    packed two or three to a row (twice the batch's width) are the unpacked ones (positions not attended: zeros; Dream:
    a row's first attended token, a prompt token, reads itself, not the padding before it); without segment ids they are
    not. The output layer scores the kept attended positions only, not the packed rows' other examples' prompts."""
    model, fam = models[name]
    batch = rollout(fam)
    p, r = batch["prompt_ids"].shape[1], batch["completion_ids"].shape[1]
    noisy = torch.cat([batch["prompt_ids"], batch["completion_ids"].masked_fill(batch["completion_ids"] % 2 == 0,
                                                                                 fam.mask_id)], 1)
    attention = rollout_attention(fam, batch["prompt_mask"], batch["completion_mask"])
    clean = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    cases = [(None, None), (r, None), (torch.tensor([p - 1, p, p + 3]), None)]  # plain: all, the last r, positions
    with torch.no_grad():
        control = PackedFamily(WithoutSegments(fam), 2 * (p + r)).logits(model, noisy, attention)
        assert (control - fam.logits(model, noisy, attention))[attention.bool()].abs().max() > 1e-3
    if fam.is_block_diffusion:  # score_tokens' doubled layout: whole blocks, the completion's positions
        noisy, clean, attention = whole_blocks(fam, noisy, clean, attention)
        assert noisy.shape[1] > p + r  # a row's last block runs past the batch's width
        cases += [(torch.arange(p, p + r), clean), (None, clean)]
    first, width = attention.argmax(-1), 2 * noisy.shape[1]  # each row's first attended column; the packed rows'
    with torch.no_grad():
        for keep, clean_ids in cases:
            cols = torch.arange(noisy.shape[1])
            cols = cols if keep is None else keep if torch.is_tensor(keep) else cols[-keep:]
            seen = attention[:, cols].bool()
            compared = seen & (cols != first[:, None]) if fam.shift else seen
            want = fam.logits(model, noisy, attention, clean_ids=clean_ids, keep=keep)
            fed = []  # positions the output layer scores: the kept attended ones only (Dream: those they read)
            head = model.get_output_embeddings().register_forward_hook(
                lambda m, i, o, fed=fed: fed.append(i[0].shape[:-1]))
            got = PackedFamily(fam, width).logits(model, noisy, attention, clean_ids=clean_ids, keep=keep)
            head.remove()
            assert len(fed) == 1 and (fed[0].numel() <= seen.sum() if fam.shift else fed[0].numel() == seen.sum())
            assert got.shape == want.shape and not got[~seen].any()
            assert (got - want)[compared].abs().max() < TOL, (keep, clean_ids is not None)


@pytest.mark.parametrize("name", SCORED)
def test_packed_estimates_and_losses_equal_unpacked(models, name):
    """Per-token log-probs of the d1 (mean-field), coupled, AR (explicit positions) and MC-ELBO estimators, and one
    step's loss and gradients of d1 and coupled-GRPO (reference and old log-probs included), packed = unpacked."""
    model, fam = models[name]
    batch = rollout(fam)
    width = 4 * (batch["prompt_ids"].shape[1] + batch["completion_ids"].shape[1])  # LLaDA2's rows: whole blocks of 32
    packed_fam = PackedFamily(fam, width)
    g = torch.Generator().manual_seed(4)
    mask = batch["loss_mask"].bool()
    with torch.no_grad():  # AR: explicit positions (keep as a tensor); MC-ELBO: per-sequence values
        for est, kw, read in ((Autoregressive(chunk=2), {"positions": range(0, 4)}, mask[:, :4]),
                              (MCElbo(samples=2), {}, slice(None))):
            noise = est.corrupt(fam, batch, g)
            a, b = est.score(model, fam, batch, noise, **kw), est.score(model, packed_fam, batch, noise, **kw)
            assert (a.logp - b.logp)[read].abs().max() < TOL, type(est).__name__
    for algo_name in ("d1", "coupled-grpo"):
        algo, config = get_algorithm(algo_name)(beta=0.1).validate(fam), SamplingConfig()
        noise = algo.corrupt(fam, batch, g, config)
        steps = []
        for scorer in (fam, packed_fam):
            with torch.no_grad():
                est = algo.score(model, scorer, batch, noise, config)
            part = {**batch, "noise": [noise], "ref": [est.logp - 0.01], "old": [est.logp + 0.02]}
            model.zero_grad()
            loss, stats = algo.step_loss(model, scorer, part, 0, 0, algo.normaliser(fam, part, config), config)
            loss.backward()
            grads = [q.grad.clone() for q in model.parameters() if q.grad is not None]
            steps.append((est, loss.detach(), stats, grads))
        model.zero_grad()
        (ea, la, sa, ga), (eb, lb, sb, gb) = steps
        assert (ea.logp - eb.logp)[mask].abs().max() < TOL and (ea.entropy - eb.entropy)[mask].abs().max() < TOL
        assert abs(la - lb) < TOL and all(abs(sa[k][0] - sb[k][0]) < TOL * max(1, abs(sa[k][0])) for k in sa)
        assert max((x - y).abs().max() for x, y in zip(ga, gb, strict=True)) < TOL, algo_name


def test_train_rl_pack_end_to_end(tmp_path, monkeypatch):
    """``train_rl.py --pack 96`` on SDAR ([x_t ‖ x_0], whole-block tails): two inner iterations with old and
    reference log-probs end with the weights of the unpacked run, scored on fewer rows."""
    from test_train_rl import rl_args, weights

    from dare import packing
    from dare.data.tasks import write_task
    data = (write_task("addition", str(tmp_path / "train.jsonl"), 16, 0, "train"), None)
    shapes, first_fit = [], packing.first_fit

    def recorded(lengths, width):
        rows, offsets = first_fit(lengths, width)
        shapes.append((len(lengths), max(rows) + 1, width))
        return rows, offsets

    monkeypatch.setattr(packing, "first_fit", recorded)
    for pack in (0, 96):
        train_rl.main(rl_args(data, tmp_path / str(pack), model="tiny:sdar", pack=pack, optim="sgd", learning_rate=1.0,
                              algo_config__num_iterations=2, algo_config__beta=0.1, eval_steps=0, log_completions=0))
    start, plain, packed = weights("tiny:sdar"), weights(tmp_path / "0"), weights(tmp_path / "96")
    assert max((plain[k] - start[k]).abs().max() for k in plain) > 1e-3
    assert max((plain[k] - packed[k]).abs().max() for k in plain) < TOL
    assert shapes and all(rows < scored for scored, rows, _ in shapes)


def test_train_vrpo_pack_end_to_end(tmp_path, monkeypatch):
    """The offline trainer's ``--pack``: VRPO's chosen and rejected ELBOs (policy and reference) on packed rows end
    with the weights of the unpacked run, scored on fewer rows."""
    from test_train_rl import weights
    from test_vrpo import vrpo_args

    from dare import packing
    shapes, first_fit = [], packing.first_fit

    def recorded(lengths, width):
        rows, offsets = first_fit(lengths, width)
        shapes.append((len(lengths), max(rows) + 1))
        return rows, offsets

    monkeypatch.setattr(packing, "first_fit", recorded)
    for pack in (0, 160):
        train_rl.main(vrpo_args(tmp_path / str(pack), model="tiny:sdar", pack=pack, optim="sgd", learning_rate=1.0))
    start, plain, packed = weights("tiny:sdar"), weights(tmp_path / "0"), weights(tmp_path / "160")
    assert max((plain[k] - start[k]).abs().max() for k in plain) > 1e-3
    assert max((plain[k] - packed[k]).abs().max() for k in plain) < TOL
    assert shapes and all(rows < scored for scored, rows in shapes)
