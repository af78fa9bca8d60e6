"""Diffusion decoding against a causal context (Nemotron-Labs-Diffusion): one checkpoint read left to right for
what is committed and bidirectionally for the block being denoised.

As the checkpoint's own ``generate`` (``modeling_nemotron_labs_diffusion.py``, read, not copied): a causal pass over
the prompt fills the KV cache and its last logit proposes the first token of the first block; each block of
``block_length`` positions then holds that token and masks, and is denoised against the cached context only (later
blocks do not exist yet), its own positions reading each other bidirectionally, the scheduled number of most confident
masks committed per step (LLaDA's even split of the block's masks over its steps, remainder first) or those a
threshold admits (``threshold_rule`` "one": the most confident always, the others at or above it); a causal pass over
the finished block appends its keys and values to the cache and its last logit proposes the next block's first token.
A block owns the global steps ``b * S .. (b + 1) * S - 1`` (S = steps per block): its first token is committed at the
block's first step (by the causal pass before it, which costs no extra forward), its masks at the following ones,
so ``steps = gen_length`` commits one token per step as the official sampler does.

``speculative`` (the checkpoint's ``linear_spec_generate``, self-speculation): after the causal prefill, each round
drafts a block (its first token the one proposed last, the rest masks) bidirectionally against the cache, in one pass
or, with a threshold, committing the most confident and every other at or above it until no mask is left; a causal
pass over the draft then proposes every next token; the longest prefix on which the draft agrees with those proposals
stays, plus the proposal after it (the bonus token: at least one token a round), and the cache keeps the accepted
positions only. All the tokens of a round share its step.

Where DARE differs: rows are left-padded (positions count from each row's first real token; the official code takes
one unpadded prompt); a row stops committing inside a block once it holds a stop token with no mask before it, and
after a block rows holding a stop token are finished (the official code stops the whole batch's block when any row
does); tokens after the first stop token are padding; the mask token is never proposed.
"""

import torch
from transformers.cache_utils import DynamicCache

from .cache import truncate
from .config import Generation, plan_causal
from .primitives import after_first, ban, decode_step, linear_schedule, proposal_entropy, propose


def generate_causal(model, family, prompt_ids, prompt_mask, cfg, generator):
    if cfg.speculative:
        return generate_speculative(model, family, prompt_ids, prompt_mask, cfg, generator)
    n_rows, p_len = prompt_ids.shape
    length = cfg.gen_length
    n_blocks, steps = plan_causal(cfg, family)
    block, per_block = length // n_blocks, steps // n_blocks
    dynamic = cfg.threshold is not None or cfg.factor is not None
    x = torch.cat([prompt_ids, prompt_ids.new_full((n_rows, length), family.mask_id)], 1)
    attn = torch.cat([prompt_mask, prompt_mask.new_ones(n_rows, length)], 1)
    step_map = torch.full((n_rows, length), -1, dtype=torch.long, device=x.device)
    out = Generation(x[:, p_len:], step_map, step_map.clone())
    if cfg.record_entropy:
        out.entropy = torch.zeros(step_map.shape, device=x.device)
    stop_ids = torch.tensor(family.stop_ids, device=x.device)
    live = torch.ones(n_rows, dtype=torch.bool, device=x.device)
    cache = DynamicCache()
    seed = model(x[:, :p_len], attention_mask=attn[:, :p_len], cache=cache, causal=True, logits_to_keep=1).logits
    out.nfe += 1

    def commit(lg, masked, n, start, end, step, j):
        x0, chosen, _ = decode_step(lg, masked, n, cfg, family.eos_id, generator, family.mask_id)
        x[:, start:end][chosen] = x0[chosen]
        region = slice(start - p_len, end - p_len)
        out.step_map[:, region][chosen], out.block_step[:, region][chosen] = step, j
        if cfg.record_entropy:
            drawn = proposal_entropy(ban(lg, cfg, family.eos_id, family.mask_id), cfg.temperature, cfg.top_k,
                                     cfg.top_p)
            out.entropy[:, region][chosen] = drawn[chosen]
        if cfg.record_states:
            out.states.append(x[:, p_len:].clone())
        return chosen

    for b in range(n_blocks):
        start, end = p_len + b * block, p_len + (b + 1) * block
        commit(seed, live[:, None], live.long(), start, start + 1, b * per_block, 0)  # the causal pass's proposal
        masked = (x[:, start:end] == family.mask_id) & live[:, None]
        schedule = linear_schedule(masked.sum(-1), per_block - 1) if per_block > 1 else None
        j = 1
        while masked.any() and (dynamic or j < per_block):
            lg = family.logits(model, x[:, start:end], attn[:, :end], cache=cache)
            truncate(cache, start)
            out.nfe += 1
            left = masked.sum(-1)
            n = schedule[:, j - 1] if j < per_block else torch.zeros_like(left)
            n = torch.maximum(n.minimum(left), (left > 0).long()) if dynamic else n.minimum(left)
            masked &= ~commit(lg, masked, n, start, end, b * per_block + j, j)
            if cfg.stop_at_eos:  # a stop token with nothing masked before it: the row is done
                done = torch.isin(x[:, start:end], stop_ids) & ~after_first(x[:, start:end] == family.mask_id)
                masked &= ~done.any(-1, keepdim=True)
            j += 1
        if cfg.stop_at_eos:
            live &= ~torch.isin(x[:, p_len:end], stop_ids).any(-1)
            if not live.any():
                break
        if b + 1 < n_blocks:  # the finished block joins the causal context and proposes the next block's first token
            seed = model(x[:, start:end], attention_mask=attn[:, :end], cache=cache, causal=True,
                         logits_to_keep=1).logits
            out.nfe += 1
    seq = x[:, p_len:]
    stops = torch.isin(seq, stop_ids)
    unused = (seq == family.mask_id) | (after_first(stops) if cfg.stop_at_eos else torch.zeros_like(stops))
    out.sequences = seq.masked_fill(unused, family.pad_id)
    out.step_map, out.block_step = out.step_map.masked_fill(unused, -1), out.block_step.masked_fill(unused, -1)
    if cfg.record_entropy:
        out.entropy = out.entropy.masked_fill(unused, 0.0)
    if cfg.record_states:
        out.states = [s.masked_fill(unused, family.pad_id) for s in out.states]
    return out


def agreeing_prefix(draft: torch.Tensor, verified: torch.Tensor) -> int:
    """How many drafted tokens after the first the causal pass confirms in a row: ``verified[i]`` is its proposal for
    the position after ``draft[i]``."""
    return int((verified[:-1] == draft[1:]).long().cumprod(0).sum())


def generate_speculative(model, family, prompt_ids, prompt_mask, cfg, generator):
    """Self-speculative decoding (module docstring), one row at a time (rows accept different numbers of tokens)."""
    length, block = cfg.gen_length, cfg.block_length or family.causal_block
    n_rows = prompt_ids.shape[0]
    out = Generation(prompt_ids.new_full((n_rows, length), family.pad_id),
                     torch.full((n_rows, length), -1, dtype=torch.long, device=prompt_ids.device), None)
    stop_ids = torch.tensor(family.stop_ids, device=prompt_ids.device)

    def draw(logits):
        return propose(ban(logits, cfg, family.eos_id, family.mask_id), cfg.temperature, cfg.top_k, cfg.top_p,
                       generator)

    for r in range(n_rows):
        ids = prompt_ids[r:r + 1, prompt_mask[r].bool()]
        cache, rounds, count = DynamicCache(), 0, 1
        made = [draw(model(ids, cache=cache, causal=True, logits_to_keep=1).logits)[0]]
        out.nfe += 1
        out.step_map[r, 0] = 0
        while count < length and not (cfg.stop_at_eos and torch.isin(made[-1], stop_ids).any()):
            rounds += 1
            start = cache.get_seq_length()
            draft = torch.cat([made[-1][-1:], made[-1].new_full((block - 1,), family.mask_id)])[None]
            masked = draft == family.mask_id
            while masked.any():
                logits = model(draft, cache=cache).logits
                truncate(cache, start)
                out.nfe += 1
                if cfg.threshold is None:  # one pass fills every mask
                    draft = torch.where(masked, draw(logits), draft)
                    break
                x0, chosen, _ = decode_step(logits, masked, torch.ones(1, dtype=torch.long), cfg, family.eos_id,
                                            generator, family.mask_id)
                draft, masked = torch.where(chosen, x0, draft), masked & ~chosen
            verified = draw(model(draft, cache=cache, causal=True).logits)[0]  # verified[i]: the token after i
            out.nfe += 1
            accepted = agreeing_prefix(draft[0], verified) + 1
            truncate(cache, start + accepted)
            made.append(verified[:accepted])
            out.step_map[r, count:count + accepted] = rounds
            count += accepted
        tokens = torch.cat(made)[:length]
        stops = torch.isin(tokens, stop_ids)
        keep = int(stops.long().argmax()) + 1 if cfg.stop_at_eos and stops.any() else len(tokens)
        out.sequences[r, :keep] = tokens[:keep]
        out.step_map[r, keep:] = -1
    out.block_step = out.step_map.clone()
    return out
