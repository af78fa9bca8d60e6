"""Nemotron-Labs-Diffusion (``dare.models.nemotron_diffusion``): the official key names and shapes, the same logits
as transformers' own Ministral-3 on the same weights, left to right and bidirectionally, and its decoding against a
causal context (``dare.sampling.causal``) token for token as the checkpoint's own loop."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, Ministral3Config, Ministral3ForCausalLM
from transformers.cache_utils import DynamicCache

from dare.models import Family, NemotronDiffusionConfig, NemotronLabsDiffusionModel, tiny
from dare.models.nemotron_diffusion import tiny_config
from dare.objectives import sft_loss
from dare.sampling import SamplingConfig, generate
from dare.sampling.cache import truncate

# the released checkpoints' config.json fields known here (nvidia/Nemotron-Labs-Diffusion-3B: not its MLP width)
RELEASED = {
    "3B": {"hidden_size": 3072, "num_hidden_layers": 26, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 128, "vocab_size": 131072, "max_position_embeddings": 262144, "block_size": 32,
           "dlm_paradigm": "bidirectional", "mask_token_id": 100},
    "8B": {"hidden_size": 4096, "num_hidden_layers": 34, "num_attention_heads": 32, "num_key_value_heads": 8,
           "vocab_size": 131072, "intermediate_size": 14336, "max_position_embeddings": 262144, "block_size": 32,
           "dlm_paradigm": "bidirectional", "mask_token_id": 100, "attn_implementation": "sdpa", "use_cache": False,
           "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                        "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"}},
}


def pair(seed: int = 0):
    """A tiny model and transformers' Ministral-3 causal LM holding the same weights (``encoder.`` -> ``model.``,
    ``diffusion_head`` -> ``lm_head``). The tiny config's llama-4 scaling starts at position 16, inside the inputs."""
    torch.manual_seed(seed)
    config = tiny_config(300, mask_token_id=299)
    model = NemotronLabsDiffusionModel(config).eval()
    fields = {k: v for k, v in config.to_dict().items() if k in Ministral3Config.__dataclass_fields__}
    reference = Ministral3ForCausalLM(Ministral3Config(**fields)).eval()
    renamed = {k.replace("encoder.", "model.").replace("diffusion_head", "lm_head"): v
               for k, v in model.state_dict().items()}
    reference.load_state_dict(renamed, strict=True)
    return model, reference


@pytest.mark.parametrize("size", sorted(RELEASED))
def test_the_released_configs_build_the_official_key_names_and_shapes(size):
    with torch.device("meta"):
        model = NemotronLabsDiffusionModel(NemotronDiffusionConfig(**RELEASED[size]))
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    config = model.config
    assert config.head_dim == 128 and config.mask_token_id == 100 and config.block_size == 32
    per_layer = {"input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
                 "mlp.up_proj.weight", "mlp.down_proj.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                 "self_attn.v_proj.weight", "self_attn.o_proj.weight"}
    expected = {"encoder.embed_tokens.weight", "encoder.norm.weight", "diffusion_head.weight"} | {
        f"encoder.layers.{i}.{key}" for i in range(config.num_hidden_layers) for key in per_layer}
    assert set(shapes) == expected  # untied head, no lm_head
    assert shapes["encoder.layers.0.self_attn.k_proj.weight"] == (8 * 128, config.hidden_size)
    assert shapes["diffusion_head.weight"] == (131072, config.hidden_size)
    if size == "8B":
        total = sum(v.numel() for v in model.state_dict().values())
        print(f"8B: {total / 1e9:.2f}B parameters")
        assert 8.0e9 < total < 9.0e9


def test_left_to_right_and_bidirectional_logits_equal_ministral3_on_the_same_weights():
    model, reference = pair()
    ids = torch.randint(0, 299, (2, 40))
    with torch.no_grad():
        causal = model(input_ids=ids, causal=True).logits
        bidirectional = model(input_ids=ids).logits
        expected_causal = reference(input_ids=ids).logits
        everything = torch.zeros(2, 1, 40, 40)  # a 4-D additive mask that hides nothing
        expected_bidirectional = reference.lm_head(reference.model(input_ids=ids, attention_mask=everything)[0])
    # two mask paths (DARE's, transformers' own): 0.0 apart here; another CPU's kernels need not round them alike
    gaps = (causal - expected_causal).abs().max(), (bidirectional - expected_bidirectional).abs().max()
    print(f"causal {gaps[0]:.1e}, bidirectional {gaps[1]:.1e} from Ministral3")
    assert max(gaps) <= 1e-6
    assert (causal - bidirectional).abs().max() > 0.1  # the two readings differ (a mode switch that did nothing fails)


def test_the_llama4_query_scaling_is_applied_from_each_tokens_position():
    """Past ``original_max_position_embeddings`` (16 here) queries are scaled by 1 + beta log(1 + floor(p / 16)):
    a reference without it agrees up to position 15 and differs after."""
    model, reference = pair()
    reference.config.rope_parameters["llama_4_scaling_beta"] = 0.0
    ids = torch.randint(0, 299, (1, 40))
    with torch.no_grad():
        ours, unscaled = model(input_ids=ids, causal=True).logits, reference(input_ids=ids).logits
    gap = (ours - unscaled).abs().amax(-1)[0]
    print(f"gap before position 16 {gap[:16].max():.1e}, from 16 on at least {gap[16:].min():.1e}")
    assert gap[:16].max() <= 1e-6 and gap[16:].min() > 1e-5  # rounding is ~1e-7


def test_padding_changes_no_real_tokens_logits_either_way():
    model, _ = pair(1)
    ids = torch.randint(0, 299, (1, 24))
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), ids], 1)
    mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 24, dtype=torch.long)], 1)
    with torch.no_grad():
        for causal in (False, True):
            alone = model(input_ids=ids, causal=causal).logits
            inside = model(input_ids=padded, attention_mask=mask, causal=causal).logits[:, 5:]
            torch.testing.assert_close(inside, alone, atol=1e-5, rtol=1e-5)


def test_an_official_config_json_loads_through_the_auto_classes_and_the_weights_round_trip(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "nemotron_labs_diffusion",
                                                      "architectures": ["NemotronLabsDiffusionModel"],
                                                      **RELEASED["8B"]}))
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is NemotronDiffusionConfig and config.num_hidden_layers == 34
    assert config.rope_parameters["rope_type"] == "yarn" and config.rope_parameters["factor"] == 16.0
    model, _ = pair(2)
    model.save_pretrained(tmp_path / "tiny")
    again = AutoModel.from_pretrained(tmp_path / "tiny").eval()
    ids = torch.randint(0, 299, (1, 20))
    with torch.no_grad():
        assert type(again) is NemotronLabsDiffusionModel
        assert torch.equal(again(input_ids=ids).logits, model(input_ids=ids).logits)


# -- the family and its decoding against a causal context ---------------------------------------------------------


def official_generate(model, prompt, max_new_tokens, block_length, threshold, mask_id, eos_id):
    """The checkpoint's ``generate`` restated for one unpadded prompt at temperature 0 (its remote code imports a
    vendored Ministral file that is not public, so it cannot run here): a causal prefill seeds the first block; each
    block is denoised against the cache (top-k of LLaDA's front-loaded even split over ``block_length`` steps, or the
    top one plus every other at or above ``threshold``), stopping once EOS stands with no mask before it; a causal pass
    over the block extends the cache and seeds the next. DARE's one departure: the mask token is never proposed."""
    def proposal(logits):
        logits = logits.clone()
        logits[..., mask_id] = float("-inf")
        return logits.argmax(-1), logits.softmax(-1).amax(-1)

    cache = DynamicCache()
    x = prompt.clone()
    seed = proposal(model(input_ids=prompt, cache=cache, causal=True).logits[:, -1])[0]
    for _ in range(max_new_tokens // block_length):
        block = torch.full((1, block_length), mask_id)
        block[0, 0] = seed
        x = torch.cat([x, block], 1)
        start = x.shape[1] - block_length
        masks = int((x[0, start:] == mask_id).sum())
        counts = [masks // block_length + (i < masks % block_length) for i in range(block_length)]
        for i in range(block_length):
            masked = x[0, start:] == mask_id
            if not masked.any():
                break
            logits = model(input_ids=x[:, start:], cache=cache).logits[0]
            truncate(cache, start)
            x0, conf = proposal(logits)
            conf = torch.where(masked, conf, float("-inf"))
            k = int(masked.sum()) if threshold is not None else counts[i]
            chosen = conf.topk(k).indices
            if threshold is not None:
                chosen = chosen[torch.cat([torch.tensor([True]), conf[chosen[1:]] >= threshold])]
            x[0, start + chosen] = x0[chosen]
            eos = x[0, start:] == eos_id
            if eos.any() and not (x[0, start:start + int(eos.long().argmax())] == mask_id).any():
                break
        seed = proposal(model(input_ids=x[:, start:], cache=cache, causal=True).logits[:, -1])[0]
        if (x[0, prompt.shape[1]:] == eos_id).any():
            break
    return x[0, prompt.shape[1]:]


def confident_nemotron(seed=0):
    """The tiny model with its output layer scaled up 40x: a random model's confidences are near ties that float
    rounding can flip; scaled, they are apart, as a trained model's are."""
    model, tok = tiny("nemotron_diffusion", seed)
    with torch.no_grad():
        model.diffusion_head.weight.mul_(40)
    return model, tok, Family.from_pretrained(model.config, tok)


def test_the_family_decodes_blocks_of_its_config_against_a_causal_context():
    model, tok, family = confident_nemotron()
    assert family.block_size is None and family.causal_block == model.config.block_size == 4
    assert family.stop_ids == (tok.convert_tokens_to_ids("<|im_end|>"),) and family.mask_id == 2
    released = Family.from_pretrained(NemotronDiffusionConfig(**RELEASED["8B"]))
    assert (released.mask_id, released.causal_block, released.block_size, released.shift) == (100, 32, None, False)


@pytest.mark.parametrize("threshold", [None, 0.9])
@pytest.mark.parametrize("stops", [False, True])
def test_greedy_tokens_equal_the_official_loop_and_padding_changes_none(threshold, stops):
    """``stops``: EOS takes the place of token 204, which the second prompt's answer holds in its second block."""
    model, tok, family = confident_nemotron()
    if stops:
        with torch.no_grad():
            model.diffusion_head.weight[family.eos_id] = model.diffusion_head.weight[204] * 1.01
    prompts = ["What is 2 + 3?", "Question: Natalia sold 48 clips in April and half as many in May."]
    config = SamplingConfig(gen_length=16, threshold=threshold)
    batch = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    together = generate(model, family, batch.input_ids, batch.attention_mask, config)
    for row, prompt in enumerate(prompts):
        ids = tok(prompt, return_tensors="pt").input_ids
        alone = generate(model, family, ids, None, config)
        expected = official_generate(model, ids, 16, 4, threshold, family.mask_id, family.eos_id)
        eos = expected == family.eos_id
        if eos.any():  # the official output ends at its first EOS; DARE pads after it
            expected = expected[:int(eos.long().argmax()) + 1]
            assert (alone.sequences[0][len(expected):] == family.pad_id).all()
            assert (alone.step_map[0][len(expected):] == -1).all()
        print(f"row {row}: {len(expected)} official tokens, EOS {bool(eos.any())}")
        assert bool(eos.any()) == (stops and row == 1)
        assert torch.equal(alone.sequences[0][:len(expected)], expected), (alone.sequences[0], expected)
        assert torch.equal(together.sequences[row], alone.sequences[0])
        assert torch.equal(together.step_map[row], alone.step_map[0])


def test_a_block_owns_its_steps_and_its_first_token_comes_from_the_causal_pass():
    """steps = gen_length: one token per step, the block's first at its first step; the first token of every block is
    the causal (left-to-right) proposal: greedy decoding with one-token blocks is autoregressive decoding."""
    model, tok, family = confident_nemotron(1)
    ids = tok("Question: What is 2 + 3? Answer:", return_tensors="pt").input_ids
    out = generate(model, family, ids, None, SamplingConfig(gen_length=12, stop_at_eos=False))
    steps = out.step_map[0].view(3, 4)
    assert torch.equal(steps[:, 0], torch.tensor([0, 4, 8])) and torch.equal(steps.sort(-1).values,
                                                                             torch.arange(12).view(3, 4))
    assert out.nfe == 1 + 3 * 3 + 2  # the prefill, 3 denoising steps a block, a causal pass between blocks
    ar = generate(model, family, ids, None, SamplingConfig(gen_length=6, block_length=1, stop_at_eos=False))
    x = ids
    with torch.no_grad():
        for _ in range(6):
            logits = model(input_ids=x, causal=True).logits[:, -1]
            logits[:, family.mask_id] = float("-inf")
            x = torch.cat([x, logits.argmax(-1, keepdim=True)], 1)
    assert torch.equal(ar.sequences[0], x[0, ids.shape[1]:]) and ar.nfe == 6


def test_settings_the_causal_context_sampler_cannot_honour_fail_before_decoding():
    model, tok, family = confident_nemotron()
    ids = tok("hi", return_tensors="pt").input_ids
    for bad, words in [(dict(gen_length=10), "not divisible by block_length 4"),
                       (dict(cache="dual"), "cache must be 'prefix'"),
                       (dict(schedule="dream"), "takes no schedule"),
                       (dict(gen_length=8, steps=2), "one step per block"),
                       (dict(speculative=True, record_entropy=True), "takes no record_entropy")]:
        with pytest.raises(ValueError, match=words):
            generate(model, family, ids, None, SamplingConfig(**{"gen_length": 8, **bad}))
    with pytest.raises(ValueError, match="cannot be resumed"):
        generate(model, family, ids, None, SamplingConfig(gen_length=8), from_step=2)


def official_speculative(model, prompt, max_new_tokens, block_length, threshold, mask_id, eos_id):
    """The checkpoint's ``linear_spec_generate`` restated for one prompt at temperature 0 (the mask token never
    proposed): ``(tokens, forwards)``."""
    def proposal(logits):
        logits = logits.clone()
        logits[..., mask_id] = float("-inf")
        return logits.argmax(-1), logits.softmax(-1).amax(-1)

    cache = DynamicCache()
    seed = proposal(model(input_ids=prompt, cache=cache, causal=True).logits[:, -1])[0]
    made, forwards = [seed], 1
    while sum(len(t) for t in made) < max_new_tokens and not (made[-1] == eos_id).any():
        start = cache.get_seq_length()
        block = torch.full((1, block_length), mask_id)
        block[0, 0] = made[-1][-1]
        while (block == mask_id).any():
            masked = block == mask_id
            x0, conf = proposal(model(input_ids=block, cache=cache).logits)
            truncate(cache, start)
            forwards += 1
            if threshold is None:
                block = torch.where(masked, x0, block)
                break
            conf = torch.where(masked, conf, float("-inf"))
            unmask = conf >= threshold
            if not unmask.any():
                unmask = conf == conf.max()
            block = torch.where(unmask, x0, block)
        verified = proposal(model(input_ids=block, cache=cache, causal=True).logits)[0][0]
        forwards += 1
        accepted = 0
        while accepted < block_length - 1 and verified[accepted] == block[0, accepted + 1]:
            accepted += 1
        accepted += 1
        truncate(cache, start + accepted)
        made.append(verified[:accepted])
    tokens = torch.cat(made)[:max_new_tokens]
    eos = tokens == eos_id
    return (tokens[:int(eos.long().argmax()) + 1] if eos.any() else tokens), forwards


@pytest.mark.parametrize("threshold", [None, 0.9])
def test_self_speculation_equals_the_official_loop_and_greedy_autoregressive_decoding(threshold):
    """Greedy self-speculation keeps only tokens the causal pass itself proposes, so its output is greedy
    autoregressive decoding whatever the drafts; what the drafts decide is how many forwards it takes (the official
    loop's count). A left-padded batch decodes each row as alone."""
    model, tok, family = confident_nemotron()
    with torch.no_grad():  # EOS where token 379 would be: the second prompt's 7th token
        model.diffusion_head.weight[family.eos_id] = model.diffusion_head.weight[379] * 1.01
    prompts = ["What is 2 + 3?", "Question: Natalia sold 48 clips in April and half as many in May."]
    config = SamplingConfig(gen_length=16, threshold=threshold, speculative=True)
    batch = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    together = generate(model, family, batch.input_ids, batch.attention_mask, config)
    autoregressive = generate(model, family, batch.input_ids, batch.attention_mask,
                              SamplingConfig(gen_length=16, block_length=1))
    assert torch.equal(together.sequences, autoregressive.sequences)
    for row, prompt in enumerate(prompts):
        ids = tok(prompt, return_tensors="pt").input_ids
        alone = generate(model, family, ids, None, config)
        expected, forwards = official_speculative(model, ids, 16, 4, threshold, family.mask_id, family.eos_id)
        print(f"row {row}: {len(expected)} tokens in {forwards} forwards (autoregressive decoding: {len(expected)})")
        assert torch.equal(alone.sequences[0][:len(expected)], expected) and alone.nfe == forwards
        assert torch.equal(together.sequences[row], alone.sequences[0])
        assert (alone.step_map[0][:len(expected)] >= 0).all() and (alone.step_map[0][len(expected):] == -1).all()
    assert (together.sequences[1] == family.eos_id).any()
    llada, llada_tok = tiny("llada")
    with pytest.raises(ValueError, match="has no causal reading"):
        SamplingConfig(speculative=True).check(Family.from_pretrained(llada.config, llada_tok))


def test_a_draft_is_accepted_up_to_its_first_disagreement():
    from dare.sampling.causal import agreeing_prefix
    draft = torch.tensor([7, 1, 9, 3])  # the causal pass confirms 1, not 9; a later agreement (3) does not count
    assert agreeing_prefix(draft, torch.tensor([1, 2, 3, 4])) == 1
    assert agreeing_prefix(draft, torch.tensor([1, 9, 3, 5])) == 3
    assert agreeing_prefix(draft, torch.tensor([2, 9, 3, 5])) == 0


def test_the_joint_sft_loss_is_the_causal_lm_loss_plus_denoising_against_clean_earlier_blocks():
    """NVIDIA's SFT loss for the family (NeMo AutoModel's hybrid mode on the checkpoint's block_diff layout): its
    causal term is the next-token loss of transformers' Ministral-3 causal LM on the same weights over the response;
    its diffusion term reads a noisy block against the clean earlier blocks only (an earlier clean token changes it,
    a later one does not), and the two add as 0.3 x diffusion + causal."""
    model, reference = pair(2)
    fam = Family.from_pretrained(model.config)
    block = fam.causal_block
    ids = torch.randint(3, 299, (2, 6 * block), generator=torch.Generator().manual_seed(0))
    loss_mask = torch.zeros_like(ids)
    loss_mask[:, block:] = 1  # the first block is the prompt
    masked = torch.zeros_like(ids, dtype=torch.bool)
    masked[:, 3 * block:4 * block] = True  # block 3 fully masked
    t = torch.tensor([0.5, 0.8])
    with torch.no_grad():
        loss, parts = sft_loss(model, fam, ids, loss_mask, t=t, masked=masked, return_parts=True)
        ar = torch.nn.functional.cross_entropy(reference(input_ids=ids).logits[:, :-1].flatten(0, 1),
                                               ids[:, 1:].flatten(), reduction="none").view(2, -1)
    expect = (ar * loss_mask[:, 1:]).sum() / loss_mask.sum()
    torch.testing.assert_close(parts["causal_loss"], expect, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(loss, 0.3 * parts["diffusion_loss"] + parts["causal_loss"])

    def block3(changed_position):
        other = ids.clone()
        other[:, changed_position] = (other[:, changed_position] + 1) % 299
        with torch.no_grad():
            _, p = sft_loss(model, fam, other, loss_mask, t=t, masked=masked, return_parts=True)
        return p["token_loss"][:, 3 * block:4 * block]

    same = parts["token_loss"][:, 3 * block:4 * block]
    assert not torch.allclose(block3(2 * block + 1), same)  # a clean token of an earlier block is read
    torch.testing.assert_close(block3(4 * block + 1), same)  # a later block's is not
    with pytest.raises(ValueError, match="sequence parallelism"):
        sft_loss(model, fam, ids, loss_mask, t=t, masked=masked, sp=object())


def test_rl_scoring_reads_each_block_as_the_sampler_decodes_it():
    """The RL estimators' logits of a completion (``dare.likelihood.completion_logits``) are the sampler's: block k
    (blocks of ``causal_block`` from the completion's first token, whatever the prompt's length) read
    bidirectionally against a causal pass over the prompt and the completion's earlier blocks, as
    ``dare/sampling/causal.py`` denoises it, its first token from that causal pass (which proposes it there); a
    subset of positions in any order reads the same; and not the plain bidirectional reading (control)."""
    from dare.likelihood import completion_logits

    model, _ = pair(3)
    fam = Family.from_pretrained(model.config)
    block, width = fam.causal_block, 6
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 299, (2, width), generator=g)
    prompt_mask = torch.ones_like(prompt)
    prompt_mask[1, :3] = 0  # row 1: 3 prompt tokens, left-padded (its blocks start at position 3, row 0's at 6)
    completion = torch.randint(3, 299, (2, 3 * block), generator=g)
    hidden = torch.rand(completion.shape, generator=g) < 0.5
    hidden[:, block:2 * block] = True
    noisy = torch.cat([prompt, completion.masked_fill(hidden, fam.mask_id)], 1)
    batch = {"prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": completion,
             "completion_mask": torch.ones_like(completion), "loss_mask": torch.ones_like(completion)}
    with torch.no_grad():
        got = completion_logits(model, fam, batch, noisy)
        attn = torch.cat([prompt_mask, torch.ones_like(completion)], 1)
        for k in range(3):
            start, end = width + k * block, width + (k + 1) * block
            cache = DynamicCache()
            seed = model(torch.cat([prompt, completion], 1)[:, :start], attention_mask=attn[:, :start], cache=cache,
                         causal=True).logits[:, -1]
            expect = model(noisy[:, start:end], attention_mask=attn[:, :end], cache=cache).logits
            expect[:, 0] = seed
            torch.testing.assert_close(got[:, k * block:(k + 1) * block], expect, atol=1e-5, rtol=1e-5)
        picked = torch.tensor([9, 4, 1, 5])
        torch.testing.assert_close(completion_logits(model, fam, batch, noisy, picked), got[:, picked])
        plain = model(noisy, attention_mask=attn).logits[:, width:]
    assert (got - plain).abs().max() > 1e-2


def test_rl_refuses_rollouts_its_scoring_cannot_read_back():
    from dare.likelihood import check_scoring

    fam = Family.from_pretrained(tiny_config(300, mask_token_id=299))
    check_scoring(fam, SamplingConfig())
    check_scoring(fam, SamplingConfig(block_length=fam.causal_block))
    with pytest.raises(ValueError, match="speculative"):
        check_scoring(fam, SamplingConfig(speculative=True))
    with pytest.raises(ValueError, match="blocks of 4"):
        check_scoring(fam, SamplingConfig(block_length=8))
    _, llada = tiny("llada")
    check_scoring(Family.from_pretrained(tiny("llada")[0].config, llada), SamplingConfig(block_length=8))
