"""DiffusionGemma (uniform-noise block diffusion on transformers' own class): the official architecture, the
training layout against the decoding loop, the sampler against transformers' ``generate``, the SFT objective."""

import json
from pathlib import Path

import pytest
import torch
from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion, DynamicCache

from dare.data.chat import left_pad
from dare.data.sft import SFTCollator, SFTDataConfig
from dare.models import tiny
from dare.models.family import Family
from dare.objectives import sft_loss
from dare.sampling import SamplingConfig, generate

OFFICIAL = Path(__file__).parent / "data" / "diffusiongemma-26B-A4B-it"


@pytest.fixture(scope="module")
def parts():
    model, tok = tiny("diffusion_gemma")
    return model, tok, Family.from_pretrained(model.config, tok)


def test_the_official_config_builds_the_checkpoints_architecture():
    config = DiffusionGemmaConfig.from_dict(json.loads((OFFICIAL / "config.json").read_text()))
    with torch.device("meta"):
        model = DiffusionGemmaForBlockDiffusion(config)
    # the official model.safetensors.index.json: total_parameters and 1047 stored tensors (the encoder's text
    # weights and lm_head are tied to the decoder's and not stored)
    assert sum(p.numel() for p in model.parameters()) == 25_823_778_864
    stored = [k for k in model.state_dict() if not k.startswith(("lm_head.", "model.encoder.language_model."))
              or k.endswith("layer_scalar")]
    assert len(stored) == 1047
    assert sum(k.startswith("model.decoder.") for k in stored) == 661
    family = Family.from_pretrained(config)
    assert (family.name, family.noise, family.block_size, family.vocab_size) == ("diffusion_gemma", "uniform", 256,
                                                                                 262144)
    assert (family.eos_id, family.pad_id, family.bos_id, family.mask_id) == (1, 0, 2, -1)


def test_loading_freezes_the_vision_tower_and_nothing_else():
    from dare.models import load_pretrained

    model = load_pretrained("tiny:diffusion_gemma")[0]
    frozen = {n.split(".")[2] for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == {"vision_tower", "embed_vision"}
    assert all(p.requires_grad for n, p in model.named_parameters() if "language_model" in n or "decoder" in n)


def test_the_tiny_tokenizer_has_gemmas_ids_and_turns(parts):
    _, tok, family = parts
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert family.stop_ids == (1, tok.convert_tokens_to_ids("<turn|>"))
    text = tok.apply_chat_template([{"role": "user", "content": " hi "}], tokenize=False, add_generation_prompt=True)
    assert text == "<bos><|turn>user\nhi<turn|>\n<|turn>model\n"


def loop_logits(model, noisy, clean, start, canvas):
    """The decoding loop's logits of one unpadded row: the encoder caches the prompt and each clean canvas (its
    sliding layers keep their window), the decoder reads each noisy canvas against it."""
    cache = DynamicCache(config=model.config.get_text_config())
    model.model.encoder(input_ids=clean[:, :start], cache=cache)
    out = []
    for s in range(start, clean.shape[1], canvas):
        out.append(model(decoder_input_ids=noisy[:, s:s + canvas], cache=cache).logits)
        model.model.encoder(input_ids=clean[:, s:s + canvas], cache=cache,
                            position_ids=torch.arange(s, s + canvas)[None])
    return torch.cat(out, dim=1)


def test_the_training_layout_gives_the_decoding_loops_logits_for_every_canvas(parts):
    """Prompts of 5 and 11 tokens, 3 canvases of 8, a sliding window of 8 (so the window truncates): each row of a
    right-padded batch scores each canvas as the decoding loop does, alone."""
    model, _, family = parts
    canvas, g = family.block_size, torch.Generator().manual_seed(0)
    rows = []
    for start in (5, 11):
        clean = torch.randint(8, 512, (1, start + 3 * canvas), generator=g)
        noisy = clean.clone()
        noisy[:, start:] = torch.randint(8, 512, (1, 3 * canvas), generator=g)
        rows.append((start, clean, noisy))
    width = max(c.shape[1] for _, c, _ in rows)
    pad = lambda x: torch.nn.functional.pad(x, (0, width - x.shape[1]), value=family.pad_id)  # noqa: E731
    clean = torch.cat([pad(c) for _, c, _ in rows])
    noisy = torch.cat([pad(n) for _, _, n in rows])
    mask = torch.cat([pad(torch.ones_like(c)) for _, c, _ in rows])
    start = torch.tensor([s for s, _, _ in rows])
    with torch.no_grad():
        batch = family.logits(model, noisy, mask, clean_ids=clean, start=start)
        for r, (s, c, n) in enumerate(rows):
            alone = loop_logits(model, n, c, s, canvas)
            assert torch.allclose(batch[r, s:s + 3 * canvas], alone[0], atol=1e-5), r


def test_a_later_canvas_cannot_change_an_earlier_canvas_and_a_canvas_sees_only_the_clean_past(parts):
    model, _, family = parts
    canvas, start = family.block_size, 6
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(8, 512, (1, start + 3 * canvas), generator=g)
    noisy = clean.clone()
    noisy[:, start:] = torch.randint(8, 512, (1, 3 * canvas), generator=g)
    s = torch.tensor([start])
    second = slice(start + canvas, start + 2 * canvas)
    with torch.no_grad():
        base = family.logits(model, noisy, None, clean_ids=clean, start=s)
        later = noisy.clone(), clean.clone()
        later[0][:, second.stop:] = 7
        later[1][:, second.stop:] = 7  # the third canvas, noisy and clean
        moved = family.logits(model, later[0], None, clean_ids=later[1], start=s)
        assert torch.equal(base[:, :second.stop], moved[:, :second.stop])
        other = noisy.clone()
        other[:, start:start + canvas] = 7  # the first canvas's noise: only the first canvas's logits change
        moved = family.logits(model, other, None, clean_ids=clean, start=s)
        assert torch.equal(base[:, second], moved[:, second])
        assert not torch.allclose(base[:, start:start + canvas], moved[:, start:start + canvas])


def prompts(tok, n=3):
    return [list(tok.apply_chat_template([{"role": "user", "content": f"What is {a} + 3?"}],
                                         add_generation_prompt=True)["input_ids"]) for a in range(n)]


@pytest.mark.parametrize("steps", [6, 48])
def test_decoding_equals_transformers_generate_token_for_token(parts, steps):
    model, tok, family = parts
    ids, mask = left_pad(prompts(tok), family.pad_id)
    assert bool(mask.all())  # equal lengths: transformers counts padding columns as positions
    torch.manual_seed(7)
    ref = model.generate(ids, max_new_tokens=24, max_denoising_steps=steps, eos_token_id=list(family.stop_ids),
                         pad_token_id=family.pad_id).sequences[:, ids.shape[1]:]
    out = generate(model, family, ids, mask, SamplingConfig(gen_length=24, steps=steps, temperature=1.0),
                   torch.Generator().manual_seed(7))
    assert torch.equal(out.sequences, ref)
    assert out.nfe == 3 * steps  # a random model is never confident enough to stop a canvas early
    assert bool((out.step_map // steps == torch.arange(24) // family.block_size).all())  # canvas k: its own steps


def test_a_stop_token_and_the_early_stop_end_decoding_as_transformers_does(parts):
    """A token the model proposes early counts as EOS (so rows finish inside a canvas) and a loose confidence stop
    with no stability requirement ends each canvas after one step: still the same tokens, padding after the stop."""
    model, tok, family = parts
    ids, mask = left_pad(prompts(tok), family.pad_id)
    cfg = SamplingConfig(gen_length=24, steps=12, temperature=1.0, confidence_stop=100.0, stability_steps=0)
    first = generate(model, family, ids, mask, cfg, torch.Generator().manual_seed(3))
    stop = int(first.sequences[0, 2])
    fam = Family(**{**family.__dict__, "stop_ids": (stop,)})
    torch.manual_seed(3)
    ref = model.generate(ids, max_new_tokens=24, max_denoising_steps=12, eos_token_id=[stop],
                         pad_token_id=family.pad_id, confidence_threshold=100.0,
                         stability_threshold=0).sequences[:, ids.shape[1]:]
    ref = torch.nn.functional.pad(ref, (0, 24 - ref.shape[1]), value=family.pad_id)
    out = generate(model, fam, ids, mask, cfg, torch.Generator().manual_seed(3))
    assert torch.equal(out.sequences, ref)
    assert out.nfe <= 3  # one step per canvas
    assert bool((out.step_map[0, 3:] == -1).all()) and bool((out.sequences[0, 3:] == family.pad_id).all())


def test_left_padding_does_not_change_a_rows_decoding(parts):
    model, tok, family = parts
    rows = prompts(tok, 2)
    ids, mask = left_pad(rows, family.pad_id)
    padded = torch.nn.functional.pad(ids, (3, 0), value=family.pad_id)
    padded_mask = torch.nn.functional.pad(mask, (3, 0))
    cfg = SamplingConfig(gen_length=16, steps=4, temperature=1.0)
    a = generate(model, family, ids, mask, cfg, torch.Generator().manual_seed(0))
    b = generate(model, family, padded, padded_mask, cfg, torch.Generator().manual_seed(0))
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.step_map, b.step_map)


@pytest.mark.parametrize("knob", [{"threshold": 0.9}, {"block_length": 4}, {"cache": "prefix"}, {"top_k": 5},
                                  {"t_min": 0.9, "t_max": 0.8}, {"cfg_scale": 1.0}])
def test_mask_sampler_knobs_are_refused_in_one_line(parts, knob):
    model, tok, family = parts
    ids, mask = left_pad(prompts(tok, 1), family.pad_id)
    with pytest.raises(ValueError) as e:
        generate(model, family, ids, mask, SamplingConfig(gen_length=8, **knob))
    assert "\n" not in str(e.value)


def sft_batch(tok, family, n=8):
    examples = []
    for row, a in zip(prompts(tok, n), range(n), strict=True):
        r = tok(f"{a} + 3 = {a + 3}.<turn|>", add_special_tokens=False)["input_ids"] + [family.eos_id]
        examples.append({"input_ids": row + r, "prompt_length": len(row), "response_length": len(r)})
    return SFTCollator(family, SFTDataConfig(max_length=64, pad_to="longest"))(examples), examples


def test_responses_are_eos_filled_to_whole_canvases(parts):
    _, tok, family = parts
    batch, examples = sft_batch(tok, family)
    for row, e, loss, attn in zip(batch["input_ids"], examples, batch["loss_mask"], batch["attention_mask"],
                                  strict=True):
        filled = -(-e["response_length"] // family.block_size) * family.block_size
        assert int(loss.sum()) == filled and int(attn.sum()) == e["prompt_length"] + filled
        tail = row[len(e["input_ids"]):e["prompt_length"] + filled]
        assert bool((tail == family.eos_id).all())


def test_the_sft_loss_is_the_canvas_mean_of_every_position_plus_the_encoders_next_token_loss(parts):
    model, tok, family = parts
    batch, _ = sft_batch(tok, family, 4)
    ids, loss_mask, attn = batch["input_ids"], batch["loss_mask"], batch["attention_mask"]
    g = torch.Generator().manual_seed(0)
    loss, p = sft_loss(model, family, ids, loss_mask, attn, generator=g, return_parts=True)
    assert bool((p["masked"] <= loss_mask.bool()).all())  # only canvas positions are noised
    changed = p["noisy"] != ids
    assert bool((changed <= p["masked"]).all())
    assert torch.allclose(loss, (p["denoise"] + p["encoder"]).mean())
    # t = 1: every canvas position is a uniform draw; the denoising loss is then near log V for a random model
    t = torch.ones(4) - 1e-4
    _, p = sft_loss(model, family, ids, loss_mask, attn, t=t, masked=loss_mask.bool(), generator=g, return_parts=True)
    assert abs(float(p["denoise"].mean()) - torch.log(torch.tensor(512.0)).item()) < 0.5


def test_sft_learns_and_decoding_learns_the_format(parts):
    """60 steps on 8 examples: the loss falls to under a third, and greedy decoding writes the answer's form closed
    by the turn end in at least 3 of 8 completions (4-8 of 8 over model seeds 0-3), the untrained model in none."""
    _, tok, family = parts
    model = tiny("diffusion_gemma")[0]
    ids, mask = left_pad(prompts(tok, 8), family.pad_id)

    def formatted():
        out = generate(model.eval(), family, ids, mask, SamplingConfig(gen_length=16, temperature=0.0),
                       torch.Generator().manual_seed(0))
        return sum("<turn|>" in t and " + 3 = " in t for t in tok.batch_decode(out.sequences))

    control = formatted()
    batch, _ = sft_batch(tok, family)
    opt = torch.optim.AdamW(model.train().parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(60):
        loss = sft_loss(model, family, batch["input_ids"], batch["loss_mask"], batch["attention_mask"], generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < sum(losses[:5]) / 3, losses
    trained = formatted()
    assert control == 0 and trained >= 3, (control, trained)


def test_mask_only_algorithms_and_sglang_refuse_it_naming_why(parts):
    from dare.algos import get_algorithm, known
    from dare.engines.sglang import SGLangEngine

    _, _, family = parts
    uniform = {name for name in known() if "uniform" in get_algorithm(name).noises}
    assert uniform == {"d1", "wd1", "gdpo"}  # tests/test_uniform_elbo.py, tests/test_algo_contract.py
    for name in set(known()) - uniform:
        with pytest.raises(ValueError, match="noise is uniform"):
            get_algorithm(name)().check_family(family)
    with pytest.raises(ValueError, match="masked block-diffusion models only"):
        SGLangEngine.check(SamplingConfig(), family)
