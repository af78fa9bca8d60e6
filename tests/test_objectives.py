"""SFT objectives: the forward process (t ranges, masking statistics) and the per-family loss against the spec
formulas computed on an independent path."""

import pytest
import torch
import torch.nn.functional as F
from conftest import BLOCK_FAMILIES, FAMILIES

from dare.diffusion import RECIPES, NoiseRecipe, corrupt, recipe_for, sample_t, sft_masks
from dare.models import Family, masks
from dare.objectives import sft_loss, sft_noise, sft_units

LENGTH = 40  # > 32 so LLaDA2 (block 32) sees two blocks


def batch(fam: Family, prompts=(5, 9, 3), responses=(20, 12, 31), seed=0):
    """Right-padded rows ``prompt + response + pads`` with the family's loss / attention masks."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, fam.vocab_size, (len(prompts), LENGTH), generator=g)
    p, r = torch.tensor(prompts), torch.tensor(responses)
    pos = torch.arange(LENGTH)[None]
    ids[pos >= (p + r)[:, None]] = fam.pad_id
    loss_mask, attn = sft_masks(p, r, LENGTH, recipe_for(fam))
    return ids, loss_mask, attn


def block_diff_visible(length: int, block: int, valid: torch.Tensor) -> torch.Tensor:
    """Nemotron-Labs-Diffusion's ``block_diff`` training mask over ``[x_t ‖ x_0]``, restated from its remote code's
    ``block_diff_mask`` (block diagonal in the noisy half, offset block-causal from noisy to clean, fully causal in
    the clean half), with padding keys hidden (its flex mask has no padding: DARE's padding is padding)."""
    q, kv = torch.arange(2 * length)[:, None], torch.arange(2 * length)[None]
    x0_q, x0_kv = q >= length, kv >= length
    block_q = torch.where(x0_q, q - length, q) // block
    block_kv = torch.where(x0_kv, kv - length, kv) // block
    ok = (((block_q == block_kv) & ~x0_kv & ~x0_q) | ((block_q > block_kv) & x0_kv & ~x0_q)
          | ((q >= kv) & x0_kv & x0_q))
    return ok[None] & torch.cat([valid, valid], 1).bool()[:, None, :]


def direct_logits(model, fam, noisy, clean, attn):
    """Aligned logits without Family.logits: a plain call (Dream shifted by hand) or the doubled layout; and, for
    Nemotron's block_diff layout, the clean half's (causal) logits too."""
    with torch.no_grad():
        if fam.causal_block is not None:
            length = noisy.shape[1]
            ok = block_diff_visible(length, fam.causal_block, attn)
            pos = torch.arange(length).repeat(2)[None].expand(len(noisy), -1)
            out = model(input_ids=torch.cat([noisy, clean], 1), attention_mask=masks.additive(ok, torch.float32),
                        position_ids=pos).logits
            return out[:, :length], out[:, length:]
        if fam.block_size is None:
            out = model(input_ids=noisy, attention_mask=attn).logits
            return (torch.cat([out[:, :1], out[:, :-1]], dim=1) if fam.shift else out), None
        ids, pos, ok = masks.doubled_layout(noisy, clean, attn, fam.block_size)
        out = model(input_ids=ids, attention_mask=masks.additive(ok, torch.float32), position_ids=pos).logits
        return out[:, : noisy.shape[1]], None


def spec_loss(logits, x0, masked, loss_mask, t, name, causal_logits=None):
    """The spec's formula, written out row by row."""
    logp = torch.log_softmax(logits.double(), -1)
    rows, total_ce, total_masked = [], 0.0, 0
    for b in range(x0.shape[0]):
        ce = sum(-logp[b, i, x0[b, i]] for i in range(x0.shape[1]) if masked[b, i])
        n = int(masked[b].sum())
        if name == "llada2":  # plain CE averaged over the batch's masked tokens
            total_ce, total_masked = total_ce + ce, total_masked + n
        elif name == "nemotron_diffusion":  # CE / t summed over the batch, over its masked tokens
            total_ce, total_masked = total_ce + ce / t[b].item(), total_masked + n
        else:  # (1/b) Σ_seq (1/ℓ_seq) Σ_masked CE / t
            rows.append(ce / t[b].item() / int(loss_mask[b].sum()))
    if name != "nemotron_diffusion":
        return total_ce / total_masked if name == "llada2" else sum(rows) / len(rows)
    # NeMo AutoModel's HybridDiffusionLLMLoss with NVIDIA's SFT config (ar_loss_alpha 0.3, noise-count normaliser):
    # 0.3 x the diffusion term + the clean half's next-token CE over loss_mask[:, 1:], per supervised token
    causal = torch.log_softmax(causal_logits.double(), -1)
    ar = sum(-causal[b, i - 1, x0[b, i]] for b in range(x0.shape[0]) for i in range(1, x0.shape[1]) if loss_mask[b, i])
    return 0.3 * total_ce / total_masked + ar / int(loss_mask.sum())


# ---------------------------------------------------------------- recipes and t


def test_recipes_follow_upstream():
    assert set(RECIPES) == set(FAMILIES) | {"diffusion_gemma", "llada_v", "mmada"}
    assert RECIPES["mmada"] == RECIPES["llada"]  # MMaDA trains its understanding rows as LLaDA its answers
    # LLaDA-V: LLaDA's per-sequence recipe over the response only (labels -100 on prompt, pictures and padding)
    assert RECIPES["llada_v"] == NoiseRecipe(0.0, 1.0, 1e-3, "inverse_t", "answer_length", False, False)
    # Google's uniform-noise SFT: t uniform inside (1e-4, 1 - 1e-4), no weighting, a per-example mean
    assert RECIPES["diffusion_gemma"] == NoiseRecipe(0.0, 1 - 2e-4, 1e-4, "none", "answer_length", False, False)
    upstream = NoiseRecipe(0.0, 1.0, 1e-3, "inverse_t", "answer_length", True, False)
    assert RECIPES["llada"] == RECIPES["dream"] == upstream
    # Nemotron-Labs-Diffusion, NVIDIA's SFT recipe: 0.3 x (CE / p over the masked count) + the causal next-token CE
    assert RECIPES["nemotron_diffusion"] == NoiseRecipe(0.0, 1.0, 1e-3, "inverse_t", "masked", False, False, 0.3, True)
    for name in ("sdar", "sdar_moe"):
        assert RECIPES[name] == NoiseRecipe(0.0, 1.0, 1e-3, "inverse_t", "answer_length", True, True)
    assert RECIPES["llada2"] == NoiseRecipe(0.3, 0.8, 0.0, "none", "masked", False, False)
    with pytest.raises(ValueError, match="No SFT noise recipe"):
        recipe_for("gpt2")
    with pytest.raises(ValueError, match="t > 0"):
        NoiseRecipe(eps=0.0)
    with pytest.raises(ValueError, match="diffusion_weight"):
        NoiseRecipe(diffusion_weight=0.0)


@pytest.mark.parametrize("name", FAMILIES)
def test_t_ranges(name):
    recipe = RECIPES[name]
    t = sample_t(20000, recipe, torch.Generator().manual_seed(0))
    lo = recipe.eps + (1 - recipe.eps) * recipe.t_low
    hi = recipe.eps + (1 - recipe.eps) * recipe.t_high
    assert t.min() >= lo - 1e-7 and t.max() <= hi + 1e-7
    assert t.min() < lo + 0.01 and t.max() > hi - 0.01  # the whole range is used
    assert abs(t.mean().item() - (lo + hi) / 2) < 0.01
    if name == "llada":
        assert t.min() >= 1e-3 and t.max() <= 1.0
    if name == "llada2":
        assert t.min() >= 0.3 and t.max() <= 0.8


# ---------------------------------------------------------------- corruption


def test_corrupt_statistics():
    g = torch.Generator().manual_seed(0)
    rows, length = 4000, 24
    prompt = torch.arange(length)[None] < 6
    maskable = (~prompt).expand(rows, length)
    ids = torch.randint(10, 100, (rows, length), generator=g)
    t = sample_t(rows, RECIPES["llada"], g)
    noisy, masked = corrupt(ids, maskable, t, 3, g)
    assert not masked[:, :6].any()                         # prompt never masked
    assert masked[:, 6:].any(0).all()                      # every maskable position masked sometimes
    assert torch.equal(masked, noisy == 3) and torch.equal(noisy[~masked], ids[~masked])
    # per-row rate ≈ t: one long row per noise level
    t = torch.tensor([0.1, 0.5, 0.9])
    _, masked = corrupt(torch.zeros(3, 20000, dtype=torch.long), torch.ones(3, 20000), t, 3, g)
    assert torch.allclose(masked.float().mean(-1), t, atol=0.015)


def test_min_one_masks_a_token_even_at_tiny_t():
    g = torch.Generator().manual_seed(0)
    maskable = torch.zeros(500, 12, dtype=torch.bool)
    maskable[:, 4:] = True
    maskable[7] = False                                    # a row with nothing to mask stays clean
    t = torch.full((500,), 1e-6)
    _, plain = corrupt(torch.zeros(500, 12, dtype=torch.long), maskable, t, 3, g)
    assert (plain.sum(-1) == 0).sum() > 490                # without min_one almost every row is clean
    _, masked = corrupt(torch.zeros(500, 12, dtype=torch.long), maskable, t, 3, g, min_one=True)
    n = masked.sum(-1)
    assert n[7] == 0 and (n[torch.arange(500) != 7] == 1).all()
    assert not (masked & ~maskable).any()
    assert masked[:, 4:].any(0).all()                      # the forced token is spread over the maskable ones


@pytest.mark.parametrize("name", FAMILIES)
def test_loss_masks_only_trainable_positions(models, name):
    """Through sft_loss: the prompt is never masked, LLaDA2 never masks its pads, SDAR always masks something."""
    model, fam = models[name]
    ids, loss_mask, attn = batch(fam)
    g = torch.Generator().manual_seed(1)
    seen = torch.zeros_like(ids, dtype=torch.bool)
    for _ in range(5):
        with torch.no_grad():
            loss, parts = sft_loss(model, fam, ids, loss_mask, attn, generator=g, return_parts=True)
        masked = parts["masked"]
        assert torch.isfinite(loss)
        assert not (masked & ~loss_mask.bool()).any()
        assert torch.equal(masked, parts["noisy"] == fam.mask_id)
        if recipe_for(fam).min_one:
            assert (masked.sum(-1) >= 1).all()
        seen |= masked
    pads = ids == fam.pad_id  # the tail after the response (random ids start at 10, above every special id)
    assert seen[pads].any() == recipe_for(fam).mask_pads
    assert not seen[~loss_mask.bool()].any()
    if name == "llada2":
        assert (attn[pads] == 0).all() and (loss_mask[pads] == 0).all()


# ---------------------------------------------------------------- the loss against the spec formula


@pytest.mark.parametrize("name", FAMILIES)
def test_loss_matches_spec_formula(models, name):
    model, fam = models[name]
    ids, loss_mask, attn = batch(fam)
    t = torch.tensor([0.3, 0.6, 0.9])
    g = torch.Generator().manual_seed(2)
    masked = (torch.rand(ids.shape, generator=g) < t[:, None]) & loss_mask.bool()
    fed = []  # the output layer scores the masked positions only (Dream: the ones they read)
    head = model.get_output_embeddings().register_forward_hook(lambda m, i, o: fed.append(i[0].shape[:-1].numel()))
    with torch.no_grad():
        loss = sft_loss(model, fam, ids, loss_mask, attn, t=t, masked=masked)
    head.remove()
    scored = int(masked.sum()) + (int(loss_mask[:, 1:].sum()) if recipe_for(fam).causal_loss else 0)
    assert fed[-1] <= scored if fam.shift else fed[-1] == scored  # + the causal loss's sources
    noisy = ids.masked_fill(masked, fam.mask_id)
    logits, causal = direct_logits(model, fam, noisy, ids, attn)
    expect = spec_loss(logits, ids, masked, loss_mask, t, name, causal)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - float(expect)) < 1e-5 * max(1.0, abs(float(expect)))


@pytest.mark.parametrize("name", FAMILIES)
def test_micro_batches_add_up_to_the_step_loss(models, name):
    """A step split into micro-batches, each divided by the whole step's counts (``sft_units`` add up; two counts with
    Nemotron's causal loss), has the loss and gradients of the unsplit step; each part divided by its own counts
    does not (negative control)."""
    model, fam = models[name]
    ids, loss_mask, attn = batch(fam)
    t, masked = sft_noise(fam, ids, loss_mask, generator=torch.Generator().manual_seed(4))
    step, parts = sft_units(fam, loss_mask, masked), (slice(0, 1), slice(1, 3))
    assert torch.equal(sum(sft_units(fam, loss_mask[p], masked[p]) for p in parts), step)

    def run(normaliser):
        model.zero_grad()
        total = 0.0
        for p in parts:
            loss = sft_loss(model, fam, ids[p], loss_mask[p], attn[p], t=t[p], masked=masked[p],
                            normaliser=normaliser)
            loss.backward()
            total += loss.item()
        return total, [q.grad.clone() for q in model.parameters() if q.grad is not None]

    model.zero_grad()
    whole = sft_loss(model, fam, ids, loss_mask, attn, t=t, masked=masked)
    whole.backward()
    expect = [q.grad.clone() for q in model.parameters() if q.grad is not None]
    split, grads = run(step)
    assert abs(split - whole.item()) < 1e-5 * max(1.0, whole.item()), (split, whole.item())
    assert max((a - b).abs().max() for a, b in zip(grads, expect, strict=True)) < 1e-5
    own, _ = run(None)  # each micro-batch's own counts: a different loss
    assert abs(own - whole.item()) > 1e-3, (own, whole.item())
    model.zero_grad()


def test_t_equal_one_is_plain_masked_lm_ce(models):
    """LLaDA recipe at t = 1 with every maskable token masked: mean over sequences of Σ CE / answer length."""
    model, fam = models["llada"]
    ids, loss_mask, attn = batch(fam)
    full = loss_mask.bool()
    with torch.no_grad():
        loss = sft_loss(model, fam, ids, loss_mask, attn, t=torch.ones(3), masked=full)
        logits = model(input_ids=ids.masked_fill(full, fam.mask_id)).logits
    ce = F.cross_entropy(logits.flatten(0, 1), ids.flatten(), reduction="none").view(ids.shape)
    plain = ((ce * full).sum(-1) / full.sum(-1)).mean()
    assert torch.allclose(loss, plain, atol=1e-6)


@pytest.mark.parametrize("name", ["llada", "dream", "sdar", "llada2"])
def test_gradients_flow_and_empty_rows_are_harmless(models, name):
    model, fam = models[name]
    # row 1's prompt fills the whole row: nothing to learn there
    ids, loss_mask, attn = batch(fam, prompts=(5, LENGTH, 3), responses=(20, 0, 31))
    assert loss_mask[1].sum() == 0
    model.zero_grad()
    loss, parts = sft_loss(model, fam, ids, loss_mask, attn, generator=torch.Generator().manual_seed(3),
                           return_parts=True)
    assert torch.isfinite(loss) and loss > 0
    assert parts["per_seq"][1] == 0 and parts["n_masked"][1] == 0
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    model.zero_grad()


# ---------------------------------------------------------------- errors


def test_clear_errors(models):
    model, fam = models["llada"]
    ids, loss_mask, attn = batch(fam)
    with pytest.raises(ValueError, match="all zero.*nothing to learn|no response token"):
        sft_loss(model, fam, ids, torch.zeros_like(loss_mask), attn)
    with pytest.raises(ValueError, match="loss_mask shape"):
        sft_loss(model, fam, ids, loss_mask[:, :-1], attn)
    with pytest.raises(ValueError, match="attention_mask shape"):
        sft_loss(model, fam, ids, loss_mask, attn[:2])
    with pytest.raises(ValueError, match="input_ids must be"):
        sft_loss(model, fam, ids[0], loss_mask[0], attn[0])
    with pytest.raises(ValueError, match="t must have shape"):
        sft_loss(model, fam, ids, loss_mask, attn, t=torch.ones(2))
    with pytest.raises(ValueError, match="outside loss_mask"):
        sft_loss(model, fam, ids, loss_mask, attn, t=torch.ones(3), masked=torch.ones_like(ids, dtype=torch.bool))
    with pytest.raises(ValueError, match="without t"):
        sft_loss(model, fam, ids, loss_mask, attn, masked=loss_mask.bool())
    with pytest.raises(ValueError, match="causal loss reads the clean half"):
        sft_loss(model, fam, ids, loss_mask, attn, recipe=NoiseRecipe(causal_loss=True))
    _, dream = models["dream"]
    with pytest.raises(ValueError, match="position 0"):
        sft_loss(models["dream"][0], dream, ids, torch.ones_like(loss_mask), attn)
    _, llada2 = models["llada2"]
    ids2, loss2, attn2 = batch(llada2)
    with pytest.raises(ValueError, match="attention_mask excludes"):
        sft_loss(models["llada2"][0], llada2, ids2, torch.ones_like(loss2).index_fill(1, torch.tensor([0]), 0), attn2)


@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_loss_sees_the_clean_half(models, name):
    """Block families read [x_t ‖ x_0]: masked tokens of a later block see the clean earlier blocks, so changing a
    clean token of block 0 changes their loss (with a plain x_t call they would see only mask tokens there)."""
    model, fam = models[name]
    ids, loss_mask, attn = batch(fam, prompts=(2, 2, 2), responses=(38, 38, 38))
    masked, t = loss_mask.bool(), torch.ones(3)  # everything but the prompt is masked
    later = slice(fam.block_size, LENGTH)
    with torch.no_grad():
        _, a = sft_loss(model, fam, ids, loss_mask, attn, t=t, masked=masked, return_parts=True)
        _, b = sft_loss(model, fam, ids.index_fill(1, torch.tensor([3]), 7), loss_mask, attn, t=t, masked=masked,
                        return_parts=True)
    assert not torch.allclose(a["token_loss"][:, later], b["token_loss"][:, later])
