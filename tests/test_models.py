"""The model families: official architecture, attention rules, alignment, backends, cache, save/reload, LoRA."""

import json
import re

import pytest
import torch
from conftest import BLOCK_FAMILIES, FAMILIES
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.cache_utils import DynamicCache

from dare.models import Family, load_pretrained, masks, save_tiny, tiny

OFFICIAL = ["LLaDA-8B-Instruct", "Dream-v0-Instruct-7B", "SDAR-8B-Chat", "SDAR-30B-A3B-Chat", "LLaDA2.0-mini",
            "LLaDA2.1-mini"]
# A few shapes stated in the spec (section 1.3), on top of the byte total of every tensor.
SPEC_SHAPES = {
    "LLaDA-8B-Instruct": {"model.transformer.wte.weight": (126464, 4096), "model.transformer.ff_out.weight":
                          (126464, 4096), "model.transformer.blocks.0.ff_out.weight": (4096, 12288)},
    "Dream-v0-Instruct-7B": {"model.layers.0.self_attn.k_proj.weight": (512, 3584),
                             "model.layers.0.self_attn.q_proj.bias": (3584,), "lm_head.weight": (152064, 3584)},
    "SDAR-8B-Chat": {"model.layers.0.self_attn.q_norm.weight": (128,),
                     "model.layers.0.self_attn.k_proj.weight": (1024, 4096)},
    "SDAR-30B-A3B-Chat": {"model.layers.0.mlp.gate.weight": (128, 2048),
                          "model.layers.0.mlp.experts.127.down_proj.weight": (2048, 768)},
    "LLaDA2.0-mini": {"model.layers.0.attention.query_key_value.weight": (3072, 2048),
                      "model.layers.0.mlp.gate_proj.weight": (5120, 2048),
                      "model.layers.1.mlp.gate.expert_bias": (256,),
                      "model.layers.19.mlp.shared_experts.up_proj.weight": (512, 2048)},
}


def ids(tok, batch, length, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(20, len(tok), (batch, length), generator=g)


def logits(model, x, **kw):
    with torch.no_grad():
        return model(x, **kw).logits


# ---------------------------------------------------------------- official architectures


@pytest.mark.parametrize("name", OFFICIAL)
def test_official_state_dict_keys_and_shapes(name, shared_models):
    folder = shared_models / name
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    state = model.state_dict()
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(state) == set(index["weight_map"]), (set(state) ^ set(index["weight_map"]))
    # shapes: every tensor's bf16 bytes add up to the checkpoint's total (LLaDA2.1 stores expert_bias in fp32)
    numel = {k: v.numel() for k, v in state.items()}
    bias = sum(n for k, n in numel.items() if k.endswith("expert_bias"))
    total = 2 * sum(numel.values())
    assert index["metadata"]["total_size"] in (total, total + 2 * bias)
    for key, shape in SPEC_SHAPES.get(name, {}).items():
        assert tuple(state[key].shape) == shape, key
    assert type(model).__name__ == config.architectures[0]


def test_official_special_ids_resolve(shared_models):
    """Family ids follow the documented resolution order on the official configs (+ real tokenizers where shipped)."""
    from dare.models import load_tokenizer
    expect = {"LLaDA-8B-Instruct": (126336, 126081), "Dream-v0-Instruct-7B": (151666, 151643),
              "SDAR-8B-Chat": (151669, 151643), "SDAR-30B-A3B-Chat": (151669, 151643),
              "LLaDA2.0-mini": (156895, 156892)}
    for name, (mask, eos) in expect.items():
        config = AutoConfig.from_pretrained(shared_models / name)
        tok = load_tokenizer(str(shared_models / name)) if (shared_models / name / "vocab.json").exists() else None
        fam = Family.from_pretrained(config, tok)
        assert (fam.mask_id, fam.eos_id, fam.pad_id) == (mask, eos, eos), name
        if tok is not None:  # the real Qwen tokenizer: generation also stops on <|im_end|>
            assert 151645 in fam.stop_ids


# ---------------------------------------------------------------- attention rules


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_masked_diffusion_attention_is_bidirectional(family):
    model, tok = tiny(family)
    x = ids(tok, 1, 24)
    base = logits(model, x)
    for p in (0, 11, 23):
        y = x.clone()
        y[0, p] = (y[0, p] + 1) % len(tok)
        changed = (logits(model, y) - base).abs().amax(-1)[0]
        assert bool((changed > 1e-6).all()), f"position {p} did not reach every position"


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_block_diffusion_attention_is_block_causal(family):
    model, tok = tiny(family)
    bs = model.config.block_size
    x = ids(tok, 1, 3 * bs)
    base = logits(model, x)
    for j in range(3):
        y = x.clone()
        y[0, j * bs + bs // 2] += 1
        changed = (logits(model, y) - base).abs().amax(-1)[0] > 1e-6
        assert not changed[: j * bs].any(), f"block {j} leaked into earlier blocks"
        assert changed[j * bs:].all(), f"block {j} did not reach its own / later blocks"


@pytest.mark.parametrize("family", FAMILIES)
def test_padding_is_never_attended(family):
    model, tok = tiny(family)
    bs = getattr(model.config, "block_size", None) or 4
    x = ids(tok, 2, 2 * bs + 3)
    mask = torch.ones_like(x)
    mask[0, :5] = 0  # left padding on row 0
    base = logits(model, x, attention_mask=mask)
    y = x.clone()
    y[0, :5] = torch.randint(20, len(tok), (5,))
    assert torch.allclose(logits(model, y, attention_mask=mask)[0, 5:], base[0, 5:], atol=1e-6)
    # and the left-padded row equals the same tokens run alone (positions restart after the padding)
    assert torch.allclose(logits(model, x[:1, 5:])[0], base[0, 5:], atol=1e-5)


def brute_force_rule(q, k, n, bs):
    """The three BD3LM rules of the spec (section 3.4), written literally."""
    cq, ck, bq, bk = q >= n, k >= n, (q % n) // bs, (k % n) // bs
    return (bq == bk and cq == ck) or (not cq and ck and bq > bk) or (cq and ck and bq >= bk)


def test_doubled_layout_mask_matches_the_spec_rules():
    n, bs = 10, 4
    x = torch.zeros(1, n, dtype=torch.long)
    _, pos, ok = masks.doubled_layout(x, x, None, bs)
    want = torch.tensor([[brute_force_rule(q, k, n, bs) for k in range(2 * n)] for q in range(2 * n)])
    assert torch.equal(ok[0], want)
    assert torch.equal(pos[0], torch.cat([torch.arange(n), torch.arange(n)]))


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_doubled_layout_equals_plain_prefix_runs(family):
    """Noisy block j in [x_t ‖ x_0] sees exactly clean blocks < j and itself: its logits equal a plain run on
    x_0[:jB] + x_t[jB:(j+1)B]. The test holds only if all three attention rules are right."""
    model, tok = tiny(family)
    fam = Family.from_pretrained(model.config, tok)
    bs = fam.block_size
    x0 = ids(tok, 2, 3 * bs, seed=1)
    xt = x0.masked_fill(torch.rand(x0.shape, generator=torch.Generator().manual_seed(2)) < 0.5, fam.mask_id)
    with torch.no_grad():
        doubled = fam.logits(model, xt, clean_ids=x0)
        for j in range(3):
            plain = fam.logits(model, torch.cat([x0[:, : j * bs], xt[:, j * bs:(j + 1) * bs]], dim=1))
            assert torch.allclose(doubled[:, j * bs:(j + 1) * bs], plain[:, j * bs:], atol=1e-5), j


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_doubled_layout_with_padding(family):
    model, tok = tiny(family)
    fam = Family.from_pretrained(model.config, tok)
    bs = fam.block_size
    x0 = ids(tok, 2, 2 * bs + 2, seed=3)
    xt = x0.clone()
    xt[:, -bs:] = fam.mask_id
    mask = torch.ones_like(x0)
    mask[1, :2] = 0  # row 1 left-padded: blocks restart at its first real token
    with torch.no_grad():
        padded = fam.logits(model, xt, mask, clean_ids=x0)
        alone = fam.logits(model, xt[1:, 2:], clean_ids=x0[1:, 2:])
    assert torch.allclose(padded[1, 2:], alone[0], atol=1e-5)



@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_doubled_layout_skips_only_the_unread_noisy_prompt(family):
    """RL scoring keeps the completion's logits only: the noisy copy of the prompt's whole blocks is dropped from the
    call (masks.unread_noisy_columns), and the kept logits and their gradients equal the full layout's (1e-6). The
    boundary is tight: dropping one more column (into the block the prompt and completion share) changes them."""
    model, tok = tiny(family)
    fam = Family.from_pretrained(model.config, tok)
    bs = fam.block_size
    prompt = 3 * bs + 1  # a block shared by the prompt's end and the completion's start
    x0 = ids(tok, 3, prompt + 2 * bs, seed=4)
    xt = x0.clone()
    noise = torch.rand(x0.shape, generator=torch.Generator().manual_seed(5)) < 0.6
    xt[:, prompt:] = x0[:, prompt:].masked_fill(noise[:, prompt:], fam.mask_id)
    mask = torch.ones_like(x0)
    mask[1, :bs + 2] = 0  # left padding: row 1's blocks start elsewhere, so its first kept block starts earlier
    mask[2, :1] = 0
    rows = torch.arange(prompt, x0.shape[1])
    skip = masks.unread_noisy_columns(mask, rows, x0.shape[1], bs)
    assert 0 < skip < prompt
    model.train()  # no dropout in the tiny configs: train() only enables the graph
    full = fam.logits(model, xt, mask, clean_ids=x0)[:, rows]
    (full.float().pow(2).mean()).backward()
    want = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
    model.zero_grad()
    kept = fam.logits(model, xt, mask, clean_ids=x0, keep=rows)
    (kept.float().pow(2).mean()).backward()
    assert (kept - full).abs().max() < 1e-6
    assert max(float((q.grad - want[n]).abs().max()) for n, q in model.named_parameters() if n in want) < 1e-6
    with torch.no_grad():
        ids_, pos, ok = masks.doubled_layout(xt, x0, mask, bs)
        over = model(input_ids=ids_[:, skip + 1:], position_ids=pos[:, skip + 1:],
                     attention_mask=masks.additive(ok[:, skip + 1:, skip + 1:], torch.float32),
                     logits_to_keep=rows - skip - 1).logits
    assert (over - full.detach()).abs().max() > 1e-4

@pytest.mark.parametrize("family", FAMILIES)
def test_a_boolean_keep_scores_its_positions_only(family):
    """``keep=<[B, L] bool>`` (SFT's masked positions) gives the full logits at those positions and their gradients
    (1e-6), in the plain layout, in ``[x_t ‖ x_0]`` and against a clean cache, while the output layer scores those
    positions only (Dream: the positions they read, once each)."""
    model, tok = tiny(family)
    fam = Family.from_pretrained(model.config, tok)
    x0 = ids(tok, 3, 4 * 8, seed=2)
    xt = x0.masked_fill(torch.rand(x0.shape, generator=torch.Generator().manual_seed(3)) < 0.5, fam.mask_id)
    mask = torch.ones_like(x0)
    mask[1, -5:] = 0  # right padding (SFT)
    mask[2, :3] = 0  # left padding (RL)
    keep = (torch.rand(x0.shape, generator=torch.Generator().manual_seed(4)) < 0.3) & mask.bool()
    keep[0, :2] = True  # Dream: positions 0 and 1 both read row 0
    layouts = [{}] + ([{"clean_ids": x0}, {"clean_ids": x0, "clean_cache": True}] if fam.is_block_diffusion else [])
    model.train()  # no dropout in the tiny configs: train() only enables the graph
    for layout in layouts:
        kw = dict(layout)
        full = fam.logits(model, xt, mask, **{k: v for k, v in kw.items() if k != "clean_cache"})[keep]
        full.float().pow(2).mean().backward()
        want = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
        model.zero_grad()
        if kw.get("clean_cache"):
            kw["clean_cache"] = fam.clean_cache(model, x0, mask)
        fed = []
        head = model.get_output_embeddings().register_forward_hook(
            lambda m, i, o, fed=fed: fed.append(i[0].shape[:-1]))
        kept = fam.logits(model, xt, mask, keep=keep, **kw)
        head.remove()
        kept.float().pow(2).mean().backward()
        assert kept.shape == full.shape and (kept - full).abs().max() < 1e-6, layout.keys()
        grads = {n: q.grad for n, q in model.named_parameters() if q.grad is not None}
        assert max(float((grads[n] - g).abs().max()) for n, g in want.items() if n in grads) < 1e-6
        assert all(float(g.abs().max()) == 0 for n, g in want.items() if n not in grads)
        model.zero_grad()
        scored = fed[-1].numel()  # the last call's (a clean cache's own pass scores one row)
        assert scored == int(keep.sum()) - int(fam.shift), (layout.keys(), scored)
    with pytest.raises(ValueError, match="a boolean keep must have the shape of input_ids"):
        fam.logits(model, xt, mask, keep=keep[:, 1:])


# ---------------------------------------------------------------- alignment


@pytest.mark.parametrize("family", FAMILIES)
def test_aligned_logits(family):
    model, tok = tiny(family)
    fam = Family.from_pretrained(model.config, tok)
    x = ids(tok, 2, 16)
    raw = logits(model, x)
    with torch.no_grad():
        aligned = fam.logits(model, x)
    if family == "dream":
        assert fam.shift
        assert torch.equal(aligned[:, 1:], raw[:, :-1]) and torch.equal(aligned[:, 0], raw[:, 0])
    else:
        assert not fam.shift and torch.equal(aligned, raw)


# ---------------------------------------------------------------- backends, precision, checkpointing


def masked_loss(fam, model, x, mask=None):
    xt = x.clone()
    xt[:, ::3] = fam.mask_id
    lg = fam.logits(model, xt, mask)
    return torch.nn.functional.cross_entropy(lg[:, ::3].flatten(0, 1).float(), x[:, ::3].flatten())


@pytest.mark.parametrize("family", FAMILIES)
def test_sdpa_and_eager_agree(family):
    model, tok = tiny(family)
    eager, _ = tiny(family)
    eager.config._attn_implementation = "eager"
    assert model.config._attn_implementation == "sdpa"
    x = ids(tok, 2, 40)
    mask = torch.ones_like(x)
    mask[1, :7] = 0
    fam = Family.from_pretrained(model.config, tok)
    for kw in ({}, {"attention_mask": mask}):
        assert (logits(model, x, **kw) - logits(eager, x, **kw)).abs().max() < 1e-4
    if fam.block_size:
        with torch.no_grad():
            a = fam.logits(model, x, mask, clean_ids=x.flip(1))
            b = fam.logits(eager, x, mask, clean_ids=x.flip(1))
        assert (a - b).abs().max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing_same_loss_and_grads(family):
    fam_model, tok = tiny(family)
    fam = Family.from_pretrained(fam_model.config, tok)
    x = ids(tok, 2, 32)
    results = []
    for ckpt in (False, True):
        model, _ = tiny(family)
        model.train()
        if ckpt:
            model.activation_checkpointing_enable({"use_reentrant": False})
            assert all(layer.gradient_checkpointing for layer in model.model.layers)
        loss = masked_loss(fam, model, x)
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (l0, g0), (l1, g1) = results
    assert torch.equal(l0, l1)
    assert g0.keys() == g1.keys() and len(g0) > 10
    for n in g0:
        assert torch.allclose(g0[n], g1[n], atol=1e-6), n


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_forward_tracks_fp32(family):
    model, tok = tiny(family)
    x = ids(tok, 1, 32)
    ref = logits(model, x)
    low = logits(model.to(torch.bfloat16), x)
    assert low.dtype == torch.bfloat16 and torch.isfinite(low).all()
    assert (low.float() - ref).abs().max() < 0.05 * ref.abs().max() + 0.05


# ---------------------------------------------------------------- KV cache


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_block_cache_equals_full_forward(family):
    """Prefill whole blocks into the cache, then run the next block against it: same logits as one full pass."""
    model, tok = tiny(family)
    fam = Family.from_pretrained(model.config, tok)
    bs = fam.block_size
    x = ids(tok, 2, 4 * bs)
    mask = torch.ones_like(x)
    mask[0, :bs] = 0  # row 0 is left-padded by one block: 2 real blocks cached, row 1 has 3
    prefix = 3 * bs
    with torch.no_grad():
        full = fam.logits(model, x, mask)
        cache = DynamicCache()
        model(x[:, :prefix], attention_mask=mask[:, :prefix], cache=cache)
        step = fam.logits(model, x[:, prefix:], mask, cache=cache)
    assert torch.allclose(step, full[:, prefix:], atol=1e-5)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_prefix_cache_reuses_full_pass_exactly(family):
    """Fast-dLLM prefix cache: K/V of the prefix from a full pass, then the suffix alone gives the same logits."""
    model, tok = tiny(family)
    x = ids(tok, 2, 24)
    with torch.no_grad():
        cache = DynamicCache()
        full = model(x, cache=cache).logits
        cache.crop(-8)  # keep the 16-token prefix
        suffix = model(x[:, 16:], cache=cache).logits
    assert torch.allclose(suffix, full[:, 16:], atol=1e-5)


# ---------------------------------------------------------------- save / reload, LoRA


@pytest.mark.parametrize("family", FAMILIES)
def test_save_reload_round_trip(family, tmp_path):
    path = save_tiny(family, tmp_path / family)
    model, tok = tiny(family)
    # an official folder names remote code and a flash/flex backend: both must be ignored without trust_remote_code
    cfg = json.loads((tmp_path / family / "config.json").read_text())
    cfg.update(auto_map={"AutoConfig": "configuration_x.XConfig"}, attn_implementation="flash_attention_2")
    (tmp_path / family / "config.json").write_text(json.dumps(cfg))
    reloaded, tok2, fam = load_pretrained(path, dtype=torch.float32)
    assert type(reloaded) is type(model) and reloaded.config._attn_implementation == "sdpa"
    x = ids(tok, 2, 20)
    saved, loaded = model.state_dict(), reloaded.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    # bit-identical weights; logits may differ in the last ulp only because mmap-loaded tensors are not 64-byte
    # aligned and CPU kernels then take another SIMD path
    assert (logits(model, x) - logits(reloaded.eval(), x)).abs().max() < 1e-6
    assert fam == Family.from_pretrained(model.config, tok)
    assert tok2.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == \
        tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_attaches_and_trains(family):
    from peft import LoraConfig, get_peft_model
    model, tok = tiny(family)
    fam = Family.from_pretrained(model.config, tok)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    wrapped = {n.rsplit(".lora_A", 1)[0] for n, _ in peft_model.named_parameters() if ".lora_A" in n}
    head = [n for n, m in model.named_modules() if m is model.get_output_embeddings()][0]
    assert not any(n.endswith(head) for n in wrapped), "the LM head must not get an adapter"
    if family == "llada":  # the per-block down projections share the head's name `ff_out`: they must be adapted
        assert any(re.search(r"blocks\.\d+\.ff_out$", n) for n in wrapped)
    if family in ("sdar_moe", "llada2"):
        assert any(".experts." in n for n in wrapped)
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    assert trainable and all(p.numel() < 5000 for p in trainable)
    opt = torch.optim.AdamW(trainable, lr=1e-2)
    x = ids(tok, 4, 24)
    peft_model.train()
    losses = []
    for _ in range(8):
        loss = masked_loss(fam, peft_model, x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.05, losses


# ---------------------------------------------------------------- MoE routing


def test_llada2_router_is_group_limited_and_unbiased():
    model, _ = tiny("llada2")
    moe = model.model.layers[1].mlp
    c = model.config
    torch.manual_seed(0)
    moe.gate.expert_bias.copy_(torch.randn(c.num_experts))
    h = torch.randn(50, c.hidden_size)
    with torch.no_grad():
        weights, idx = moe.route(h)
        scores = torch.sigmoid(h @ moe.gate.weight.T)
    per_group = c.num_experts // c.n_group
    assert all(len(set((row // per_group).tolist())) <= c.topk_group for row in idx)
    assert torch.allclose(weights.sum(-1), torch.full((50,), c.routed_scaling_factor))
    chosen = scores.gather(1, idx)  # mixing weights come from unbiased scores
    assert torch.allclose(weights, chosen / chosen.sum(-1, keepdim=True) * c.routed_scaling_factor, atol=1e-6)
    # brute force: the best group pair (sum of top-2 biased scores) then top-k inside
    sel = scores + moe.gate.expert_bias
    for t in range(50):
        g = sel[t].view(c.n_group, -1).topk(2, -1).values.sum(-1).topk(c.topk_group).indices
        allowed = torch.cat([torch.arange(int(i) * per_group, (int(i) + 1) * per_group) for i in g])
        want = allowed[sel[t, allowed].topk(c.num_experts_per_tok).indices]
        assert set(want.tolist()) == set(idx[t].tolist())


@pytest.mark.parametrize("family", ["sdar_moe", "llada2"])
def test_moe_layer_matches_per_token_reference(family):
    model, _ = tiny(family)
    moe = model.model.layers[1].mlp
    h = torch.randn(2, 5, model.config.hidden_size)
    with torch.no_grad():
        out = moe(h)
        weights, idx = moe.route(h.view(-1, h.shape[-1]))
        ref = torch.stack([sum(w * moe.experts[int(e)](t) for w, e in zip(ws, es, strict=True))
                           for t, ws, es in zip(h.view(-1, h.shape[-1]), weights, idx, strict=True)])
        if family == "llada2":
            ref = ref + moe.shared_experts(h.view(-1, h.shape[-1]))
    assert torch.allclose(out.view(-1, h.shape[-1]), ref, atol=1e-6)


# ---------------------------------------------------------------- errors and speed


def test_clear_errors():
    model, tok = tiny("sdar")
    fam = Family.from_pretrained(model.config, tok)
    with pytest.raises(ValueError, match="known model_type"):
        Family.from_pretrained(AutoConfig.for_model("llama"), None)
    dream, dtok = tiny("dream")
    dtok.mask_token = None
    dream.config.mask_token_id = None
    with pytest.raises(ValueError, match="no mask token"):
        Family.from_pretrained(dream.config, dtok)
    with pytest.raises(ValueError, match="same shape"):
        fam.logits(model, ids(tok, 1, 8), clean_ids=ids(tok, 1, 9))
    with pytest.raises(ValueError, match="whole blocks"):
        cache = DynamicCache()
        model(ids(tok, 1, 6), cache=cache)
        fam.logits(model, ids(tok, 1, 4), cache=cache)
    llada, ltok = tiny("llada")
    with pytest.raises(ValueError, match="masked-diffusion"):
        Family.from_pretrained(llada.config, ltok).logits(llada, ids(tok, 1, 4), clean_ids=ids(tok, 1, 4))
    with pytest.raises(ValueError, match="cached \\+ current"):
        model(ids(tok, 1, 8), attention_mask=torch.ones(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="Unknown family"):
        tiny("gpt2")


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_builds_fast_and_small(family):
    import time
    t = time.perf_counter()
    model, _ = tiny(family, seed=1)
    assert time.perf_counter() - t < 2.0
    assert sum(p.numel() for p in model.parameters()) * 4 < 8e6


def test_tiny_name_takes_config_overrides():
    from dare.models import load_pretrained
    model, _, fam = load_pretrained("tiny:sdar:hidden_size=32,num_hidden_layers=3,head_dim=8,block_size=8")
    assert (model.config.hidden_size, model.config.num_hidden_layers, fam.block_size) == (32, 3, 8)
    with pytest.raises(ValueError, match="not key=value"):
        load_pretrained("tiny:llada:d_model")
    with pytest.raises(ValueError, match=r"Unknown llada config field\(s\) \[.d_modl.\] in .tiny:llada:d_modl=3."):
        load_pretrained("tiny:llada:d_modl=3")


def test_tiny_name_loads_as_asked():
    """A ``tiny:`` model takes the dtype and attention implementation a checkpoint would (flags are not ignored)."""
    from dare.models import load_pretrained
    model, _, _ = load_pretrained("tiny:sdar", dtype=torch.bfloat16, attn_implementation="eager")
    assert next(model.parameters()).dtype == torch.bfloat16 and model.config._attn_implementation == "eager"
    model, _, _ = load_pretrained("tiny:llada")
    assert next(model.parameters()).dtype == torch.float32 and model.config._attn_implementation == "sdpa"


def test_a_llada_moe_checkpoint_is_refused_by_name_before_the_weights_load(tmp_path):
    """LLaDA-MoE's config.json says ``model_type: llada`` (dllm asks users to edit it): its experts must not meet the
    dense LLaDA classes as a wall of missing keys."""
    import json

    from dare.models.loading import load_config
    config = {"model_type": "llada", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
              "num_experts": 8, "num_experts_per_tok": 2, "expert_intermediate_size": 32, "vocab_size": 512}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="LLaDA-MoE checkpoint .* DARE has no LLaDA-MoE family yet"):
        load_config(str(tmp_path))
