"""Decoding exactly as the official samplers do (models-and-sampling.md §2.4-2.5). Each reference below is a
line-by-line port of the rule written in the official code (batch 1, greedy, no cache), not of our sampler:

* SDAR ``generate.py`` / LLaDA2 ``generate``: the canvas rounded up to whole blocks with masks after the prompt
  (M1: the last block is decoded whole, the output cut to gen_length); per block step j the split of the BLOCK SIZE
  over the steps, capped by the masks left (M3; LLaDA2's ``min(k, left)``); dynamic: all above the threshold if at
  least n_j pass, else the top n_j; after a block, stop if a stop token was generated.
* Dream ``confidence_threshold`` (Fast-dLLM; M2): the top (gen/steps + carried) candidates, the first always, the
  rest if >= threshold, the shortfall carried; past the last step the loop goes on with the carry.

Our samplers never propose the mask token (MDLM's SUBS rule); the ports ban it too. Every case also checks the
number of forwards and the tokens committed at every step."""

import math

import pytest
import torch
from conftest import BLOCK_FAMILIES

from dare.engines.base import decode_completions
from dare.models import Family, tiny
from dare.sampling import SamplingConfig, generate

SHARP = dict(initializer_range=0.2)


def load(name):
    model, tok = tiny(name, **SHARP)
    return model.double(), tok, Family.from_pretrained(model.config, tok)


def proposal(model, fam, x, rows):
    """Greedy token and its probability at canvas positions ``rows`` (whole-window forward, mask banned)."""
    logits = fam.logits(model, x[None], torch.ones_like(x)[None])[0, rows].double()
    logits[:, fam.mask_id] = float("-inf")
    p = logits.softmax(-1)
    x0 = p.argmax(-1)
    return x0, p.gather(-1, x0[:, None])[:, 0]


def official_block(model, fam, prompt, gen_length, steps, threshold=None, stop=False):
    """SDAR generate.py / LLaDA2 generate, greedy: returns the canvas after the prompt (whole last block), the local
    step of every decoded position (-1: never), the forwards and the tokens committed per step."""
    block, p_len = fam.block_size, len(prompt)
    n_blocks = math.ceil((p_len + gen_length) / block)
    x = torch.full((n_blocks * block,), fam.mask_id)
    x[:p_len] = prompt
    local = torch.full_like(x, -1)
    quota = [block // steps + (1 if j < block % steps else 0) for j in range(steps)]  # get_num_transfer_tokens
    nfe, per_step = 0, []
    for b in range(p_len // block, n_blocks):
        s, e = b * block, (b + 1) * block
        for j in range(steps):
            masked = x[s:e] == fam.mask_id
            if not masked.any():
                break
            x0, p = proposal(model, fam, x[:e], slice(s, e))
            nfe += 1
            conf = torch.where(masked, p, float("-inf"))
            high = conf > threshold if threshold is not None else None
            if high is not None and int(high.sum()) >= quota[j]:
                chosen = high
            else:
                chosen = torch.zeros_like(masked)
                chosen[conf.topk(min(quota[j], int(masked.sum()))).indices] = True  # LLaDA2's cap
            x[s:e][chosen] = x0[chosen]
            local[s:e][chosen] = j
            per_step.append(int(chosen.sum()))
        if stop and torch.isin(x[p_len:e], torch.tensor(fam.stop_ids)).any():
            break
    return x[p_len:], local[p_len:], nfe, per_step


def official_dream_threshold(model, fam, prompt, gen_length, steps, threshold):
    """Dream diffusion_generate, alg='confidence_threshold' (Fast-dLLM), greedy."""
    p_len = len(prompt)
    x = torch.cat([prompt, torch.full((gen_length,), fam.mask_id)])
    step_of = torch.full_like(x, -1)
    number_transfer_tokens, left_tokens_last_step, i, nfe, per_step = gen_length // steps, 0, 0, 0, []
    while i < steps:
        mask_index = x == fam.mask_id
        if not mask_index.any():
            break
        x0, p = proposal(model, fam, x, slice(None))
        nfe += 1
        full_confidence = torch.where(mask_index, p, float("-inf"))
        current = number_transfer_tokens + left_tokens_last_step
        left_tokens_last_step = 0
        selected, select_index = full_confidence.topk(current)
        transfer = torch.zeros_like(mask_index)
        transfer[select_index] = True  # official: transfer_index[0, select_index[0]] (the whole candidate row)
        for k in range(1, current):
            if selected[k] < threshold:
                if i < steps - 1:
                    left_tokens_last_step += 1
                else:
                    number_transfer_tokens = 0
                    steps += 1
                    left_tokens_last_step += 1
                transfer[select_index[k]] = False
        x[transfer] = x0[transfer]
        step_of[transfer] = i
        per_step.append(int(transfer.sum()))
        i += 1
    return x[p_len:], step_of[p_len:], nfe, per_step


def counts_per_step(local, block_of):
    """Tokens committed per executed step, block by block (steps that commit nothing end a block's run)."""
    out = []
    for b in block_of.unique().tolist():
        sel = (block_of == b) & (local >= 0)
        if sel.any():
            out += torch.bincount(local[sel]).tolist()
    return out


@pytest.mark.parametrize("threshold", [None, 0.05])
@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_sampler_is_the_official_one(name, threshold):
    """M1 + M3 (and the dynamic rule): prompts that end inside a block, a length that ends inside one and fewer steps
    than the block size; tokens, local steps, forwards and per-step counts equal the official loop's."""
    model, _, fam = load(name)
    block = fam.block_size
    steps = 2 if block == 4 else 8
    gen_length = 2 * block + 3
    g = torch.Generator().manual_seed(0)
    lengths = [block + 3, 2 * block + 2, 6]  # every prompt and every answer ends inside a block
    rows = [torch.randint(20, 200, (n,), generator=g) for n in lengths]
    cfg = SamplingConfig(gen_length=gen_length, steps=steps, threshold=threshold, stop_at_eos=False)
    width = max(lengths)
    ids = torch.stack([torch.cat([torch.full((width - len(r),), fam.pad_id), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]).long() for r in rows])
    batched = {c: generate(model, fam, ids, mask, SamplingConfig(**{**cfg.__dict__, "cache": c}))
               for c in ("block", "none")}
    for r, prompt in enumerate(rows):
        tokens, local, nfe, per_step = official_block(model, fam, prompt, gen_length, steps, threshold)
        solo = generate(model, fam, prompt[None], None, SamplingConfig(**{**cfg.__dict__, "cache": "none"}))
        assert solo.nfe == nfe and len(tokens) > gen_length
        span = len(tokens)
        assert torch.equal(solo.replay_ids[0, :span], tokens) and torch.equal(solo.replay_step[0, :span], local)
        block_of = (len(prompt) + torch.arange(span)) // block
        assert counts_per_step(solo.replay_step[0, :span], block_of) == per_step
        if threshold is None:
            assert max(per_step) <= math.ceil(block / steps)
        for out in batched.values():
            assert torch.equal(out.sequences[r], tokens[:gen_length])
            assert torch.equal(out.replay_step[r, :span], local)


def test_dream_threshold_is_the_official_confidence_threshold():
    """M2: Dream's default threshold rule commits at most the step's share plus the carried shortfall; the tokens,
    the step of each, the forwards (more than ``steps``: the carry runs past the last step) equal the official."""
    model, _, fam = load("dream")
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(20, 200, (5,), generator=g)
    gen_length, steps = 16, 4
    forwards = []
    for threshold in (0.05, 0.1, 1.01):
        tokens, step_of, nfe, per_step = official_dream_threshold(model, fam, prompt, gen_length, steps, threshold)
        ours = generate(model, fam, prompt[None], None, SamplingConfig(gen_length=gen_length, steps=steps,
                                                                       threshold=threshold))
        assert ours.nfe == nfe and torch.equal(ours.sequences[0], tokens) and torch.equal(ours.step_map[0], step_of)
        assert torch.bincount(ours.step_map[0]).tolist() == per_step
        forwards.append(nfe)
    # candidates dropped and carried past the last step; at 1.01 only the first passes: one token a step
    assert steps < forwards[0] < forwards[1] < forwards[2] == gen_length
    uncapped = generate(model, fam, prompt[None], None, SamplingConfig(gen_length=gen_length, steps=steps,
                                                                       threshold=0.0, threshold_rule="one"))
    assert uncapped.nfe == 1  # the Fast-dLLM LLaDA rule commits everything above the threshold at once


def biased(name, token, position, bias=60.0):
    """A tiny model whose logits favour ``token`` at canvas position ``position`` (whole-window forwards, also
    those that keep the logits of some positions only)."""
    model, tok, fam = load(name)

    def hook(module, args, kwargs, out):
        width = (args[0] if args else kwargs["input_ids"]).shape[1]
        keep = kwargs.get("logits_to_keep", 0)
        columns = torch.arange(width)[keep if torch.is_tensor(keep) else slice(-keep if keep else None, None)]
        out.logits[:, columns == position, token] += bias
        return out

    model.register_forward_hook(hook, with_kwargs=True)
    return model, tok, fam


@pytest.mark.parametrize("name,which", [("sdar", "turn_end"), ("sdar", "eos"), ("llada2", "eos")])
def test_block_families_stop_after_the_block_holding_a_stop_token(name, which):
    """SDAR stops after a block that holds <|im_end|> or EOS; LLaDA2 after the block of its EOS, the output cut after
    it: no later block is decoded (forwards as in the official loop), tokens after the stop are padding."""
    _, tok, fam = load(name)
    token = fam.stop_ids[-1] if which == "turn_end" else fam.eos_id
    prompt = torch.randint(20, 200, (fam.block_size + 2,), generator=torch.Generator().manual_seed(2))
    stop_at = 3  # generated index of the stop token, inside the second decoded block for block 4
    model, tok, fam = biased(name, token, len(prompt) + stop_at)
    steps = fam.block_size // 2
    gen_length = 4 * fam.block_size
    tokens, local, nfe, _ = official_block(model, fam, prompt, gen_length, steps, stop=True)
    out = generate(model, fam, prompt[None], None, SamplingConfig(gen_length=gen_length, steps=steps, cache="none"))
    assert out.sequences[0, stop_at] == token and out.nfe == nfe
    assert torch.equal(out.sequences[0, :stop_at + 1], tokens[:stop_at + 1])
    assert (out.sequences[0, stop_at + 1:] == fam.pad_id).all() and (out.step_map[0, stop_at + 1:] == -1).all()
    stop_block_end = (len(prompt) + stop_at) // fam.block_size * fam.block_size + fam.block_size - len(prompt)
    assert (local[stop_block_end:] == -1).all() and (local[:stop_block_end] >= 0).all()  # official: nothing later
    assert torch.equal(out.replay_step[0, :stop_block_end], local[:stop_block_end])  # the stop block complete
    full = generate(model, fam, prompt[None], None, SamplingConfig(gen_length=gen_length, steps=steps, cache="none",
                                                                   stop_at_eos=False))
    assert full.nfe > out.nfe and (full.step_map[0] >= 0).all()
    mask, texts = decode_completions(tok, fam, out.sequences)
    assert mask[0].tolist() == [1] * (stop_at + 1) + [0] * (gen_length - stop_at - 1)
    assert texts[0] == tok.decode(out.sequences[0, :stop_at], skip_special_tokens=True)


@pytest.mark.parametrize("name", ["llada", "dream"])
def test_masked_families_decode_the_whole_canvas_and_the_answer_ends_at_the_first_stop(name):
    """LLaDA's and Dream's official samplers have no stop rule: the whole fixed-length canvas is decoded (every
    step runs, EOS tail included) and the answer is read up to the first stop token (completion mask and text).
    DARE's packed LLaDA rollout in eval mode (EOS confidence 0, leftover masks -> EOS) is not copied: our
    schedules leave no mask, and EOS early rejection (``eos_early_rejection``) is the principled late-EOS knob."""
    _, tok, fam = load(name)
    prompt = torch.randint(20, 200, (5,), generator=torch.Generator().manual_seed(3))
    stop_at = 2
    model, tok, fam = biased(name, fam.eos_id, len(prompt) + stop_at - int(fam.shift))  # Dream reads one back
    out = generate(model, fam, prompt[None], None, SamplingConfig(gen_length=8, steps=8))
    assert out.nfe == 8 and (out.step_map[0] >= 0).all() and out.sequences[0, stop_at] == fam.eos_id
    mask, texts = decode_completions(tok, fam, out.sequences)
    assert mask[0].tolist() == [1] * (stop_at + 1) + [0] * (8 - stop_at - 1)
    assert texts[0] == tok.decode(out.sequences[0, :stop_at], skip_special_tokens=True)


@pytest.mark.parametrize("name", ["llada", "sdar", "llada2"])
def test_quota_rule_on_other_families(name):
    """The quota rule as an option elsewhere: a threshold every candidate passes commits exactly each step's share
    (the static schedule, same tokens and steps); one nothing passes commits one token a step."""
    model, _, fam = load(name)
    prompt = torch.randint(20, 200, (1, 6), generator=torch.Generator().manual_seed(4))
    length = 8 if fam.block_size != 32 else 40
    common = dict(gen_length=length, steps=4, stop_at_eos=False, cache="none")
    static = generate(model, fam, prompt, None, SamplingConfig(**common))
    everything = generate(model, fam, prompt, None, SamplingConfig(threshold=0.0, threshold_rule="quota", **common))
    assert torch.equal(everything.sequences, static.sequences) and everything.nfe == static.nfe
    assert torch.equal(everything.block_step, static.block_step)
    nothing = generate(model, fam, prompt, None, SamplingConfig(threshold=1.01, threshold_rule="quota", **common))
    decoded = length if fam.block_size is None else int((nothing.replay_step >= 0).sum())
    assert nothing.nfe == decoded  # one a step, the carry drains past each block's scheduled steps
