"""Masked-diffusion decoding (LLaDA, Dream): semi-autoregressive blocks over a fixed-length canvas of masks.

Per block, each step proposes a token for every masked position and commits some of them: the scheduled count
(LLaDA's even split, or Dream's ``floor(m (1 - s/t))``) of the most confident, or those a confidence threshold admits
(Fast-dLLM parallel decoding; ``threshold_rule``: LLaDA's "one" commits every position above it, Dream's "quota"
at most the step's even share plus the shortfall carried from earlier steps, going on past the last step until the
block is done; where the steps do not divide the block, the remainder goes to the first steps; the official
asserts divisibility). Fast-dLLM caches: "prefix" keeps the K/V of everything before
the block from the block's first (full) pass; "dual" keeps the whole canvas and overwrites the block's rows in
place. Both refresh at every block and are approximations for bidirectional models (stale K/V). ``vicinity=W``
(dInfer's vicinity refresh) also recomputes W positions on each side of the block at every dual-cache step: the
cached K/V nearest the block, which go stale fastest, stay fresh; a vicinity covering the canvas is plain decoding.
A row whose block has no masks left sits out the block's remaining forwards (threshold decoding finishes rows at
different steps; the cache drops its rows until the next block's full pass); its proposals were never committed,
and the sampling draws stay the whole batch's, so the output is the same. Not with classifier-free guidance or
recorded whole-canvas predictions, which read every row. A full pass feeds each distinct row once (a GRPO group's
completions share one canvas until their first commit) and keeps the block's logits only.
"""

import torch
from transformers.cache_utils import DynamicCache

from ..models.masks import positions_from_padding
from .cache import keep_rows, move_tail, truncate
from .config import Generation, plan_masked
from .primitives import (
    CONFIDENCE,
    ascending_schedule,
    ban,
    decode_step,
    dream_count,
    eos_factor,
    linear_schedule,
    proposal_entropy,
)


def generate_masked(model, family, prompt_ids, prompt_mask, cfg, generator, canvas=None, from_step=0, to_step=None):
    n_rows, p_len = prompt_ids.shape
    length, cache_mode = cfg.gen_length, cfg.cache or "none"
    n_blocks, steps = plan_masked(cfg, family)
    block = length // n_blocks
    per_block = steps // n_blocks
    dynamic = cfg.threshold is not None or cfg.factor is not None
    mask_id, shift = family.mask_id, int(family.shift)
    if from_step or to_step is not None:
        if dynamic:
            raise ValueError("resuming from / stopping at a step needs a fixed step schedule (no threshold/factor)")
        to_step = steps if to_step is None else to_step
        if not 0 <= from_step <= to_step <= steps:
            raise ValueError(f"need 0 <= from_step ({from_step}) <= to_step ({to_step}) <= steps ({steps})")
    to_step = float("inf") if to_step is None else to_step
    predict_all = cfg.record_states and cache_mode == "none"  # whole-canvas predictions need whole-canvas logits
    sits_out = not (predict_all or cfg.cfg_scale)  # a row with no masks left in the block skips its forwards

    x = torch.cat([prompt_ids, prompt_ids.new_full((n_rows, length), mask_id) if canvas is None else canvas], dim=1)
    attn = torch.cat([prompt_mask, prompt_mask.new_ones(n_rows, length)], dim=1)
    positions = positions_from_padding(attn)
    step_map = torch.full((n_rows, length), -1, dtype=torch.long, device=x.device)
    block_step = step_map.clone()
    out = Generation(x[:, p_len:], step_map, block_step)
    if cfg.record_entropy:
        out.entropy = torch.zeros(step_map.shape, device=x.device)

    def logits_full(keep, rows=None, cache=None):
        """The canvas's logits at ``keep`` (None: everywhere), each distinct row fed once: a GRPO group's
        completions share one canvas until their first commit (and all along when decoded greedily)."""
        xs, attns = (x, attn) if rows is None else (x[rows], attn[rows])
        distinct, copy = torch.unique(torch.cat([xs, attns], 1), dim=0, return_inverse=True)
        shared = len(distinct) < len(xs)
        if shared:  # (unique sorts its rows: the copy puts each back in its place)
            xs, attns = distinct[:, :x.shape[1]], distinct[:, x.shape[1]:]
        lg = family.logits(model, xs, attns, cache=cache, keep=keep)
        if cfg.cfg_scale:
            uncond = xs.clone()
            uncond[:, :p_len][attns[:, :p_len].bool()] = mask_id
            lg_u = family.logits(model, uncond, attns, keep=keep)
            out.nfe += 1
            lg = lg_u + (cfg.cfg_scale + 1) * (lg - lg_u)
        if shared:
            lg = lg[copy]
            if cache is not None:
                keep_rows(cache, copy)
        return lg

    step = from_step
    for b in range(n_blocks):
        start, end = p_len + b * block, p_len + (b + 1) * block
        j0 = 0
        if not dynamic:  # step ids follow the schedule; a resumed run enters its first block mid-way
            j0 = max(from_step - b * per_block, 0)
            if j0 >= per_block:
                continue
            step = b * per_block + j0
        if step >= to_step:
            break
        masked = x[:, start:end] == mask_id
        schedule = (ascending_schedule if cfg.schedule == "ascending" else linear_schedule)(masked.sum(-1),
                                                                                           per_block - j0)
        times = torch.linspace(1, cfg.eps, per_block + 1).tolist()
        quota = cfg.threshold is not None and cfg.threshold_rule == "quota"
        even, carry = linear_schedule(masked.sum(-1), per_block - j0), torch.zeros_like(masked[:, 0], dtype=torch.long)
        cache, j = None, j0
        while masked.any() and (dynamic or j < per_block) and step < to_step:
            first = start - shift  # first position fed after the block's full pass (one earlier for Dream)
            busy = masked.any(-1) | (not sits_out)  # the rows fed this step
            rows = None if bool(busy.all()) else busy.nonzero()[:, 0]
            if j == j0 or cache_mode == "none":
                cache = DynamicCache() if cache_mode != "none" else None
                rows = None if cache is not None else rows
                if predict_all:
                    full = logits_full(None)
                    lg = full[:, start:end]
                else:  # logits of the block only: the rest of a 126k-vocabulary canvas would be read by nothing
                    lg = logits_full(torch.arange(start, end, device=x.device), rows, cache)
                if cache_mode == "prefix":
                    truncate(cache, first)
                cached = torch.ones_like(busy)
            else:
                if rows is not None and not torch.equal(cached, busy):
                    keep_rows(cache, busy[cached].nonzero()[:, 0])  # the cache holds the rows fed last
                    cached = busy
                xs, attns, pos = (x, attn, positions) if rows is None else (x[rows], attn[rows], positions[rows])
                if cache_mode == "prefix":
                    lg = family.logits(model, xs[:, first:], attns, cache=cache,
                                       keep=torch.arange(shift, shift + block, device=x.device))
                    truncate(cache, first)
                else:  # dual: hide the stale rows of the block and its vicinity, feed them, move their K/V in place
                    lo, hi = max(first - cfg.vicinity, 0), min(end + cfg.vicinity, x.shape[1])
                    stale = attns.clone()
                    stale[:, lo:hi] = 0
                    lg = family.logits(model, xs[:, lo:hi], torch.cat([stale, attns[:, lo:hi]], 1),
                                       position_ids=pos[:, lo:hi], cache=cache,
                                       key_position_ids=torch.cat([pos, pos[:, lo:hi]], 1),
                                       keep=torch.arange(start - lo, start - lo + block, device=x.device))
                    move_tail(cache, lo, hi)
            if rows is not None:  # rows sitting out get flat logits: none of their positions is masked
                lg = lg.new_zeros((n_rows, *lg.shape[1:])).index_copy_(0, rows, lg)
            out.nfe += 1

            n = _count(cfg, schedule, masked, times, j, j0, per_block, dynamic, generator)
            if quota:  # Dream/Fast-dLLM: this step's even share plus the shortfall carried from earlier steps
                n = ((even[:, j - j0] if j < per_block else 0) + carry).clamp(min=1)
            scale = eos_factor(cfg.eos_early_rejection, step, steps)
            if predict_all:  # propose for every masked position of the canvas, commit inside the block
                region = x[:, p_len:] == mask_id
                inside = torch.zeros_like(region)
                inside[:, start - p_len:end - p_len] = masked
                x0, chosen, _ = decode_step(full[:, p_len:], inside, n, cfg, family.eos_id, generator,
                                            family.mask_id, scale)
                out.predictions.append(torch.where(region, x0, x[:, p_len:]))
                proposal = ban(full[:, p_len:], cfg, family.eos_id, family.mask_id)
                out.confidences.append(CONFIDENCE["low_confidence"](proposal, x0) * region)  # its probability
                x0, chosen = x0[:, start - p_len:end - p_len], chosen[:, start - p_len:end - p_len]
            else:
                x0, chosen, _ = decode_step(lg, masked, n, cfg, family.eos_id, generator, family.mask_id, scale)
            if quota:
                carry = n - chosen.sum(-1)
            x[:, start:end][chosen] = x0[chosen]
            if cfg.record_entropy:
                drawn = proposal_entropy(ban(lg, cfg, family.eos_id, family.mask_id), cfg.temperature, cfg.top_k,
                                         cfg.top_p)
                out.entropy[:, start - p_len:end - p_len][chosen] = drawn[chosen]
            step_map[:, start - p_len:end - p_len][chosen] = step
            block_step[:, start - p_len:end - p_len][chosen] = j
            masked &= ~chosen
            step, j = step + 1, j + 1
            if cfg.record_states:
                out.states.append(x[:, p_len:].clone())
    out.sequences = x[:, p_len:]
    return out


def _count(cfg, schedule, masked, times, j, j0, per_block, dynamic, generator):
    """Tokens to commit at block step ``j`` (the floor for threshold decoding; never 0 past the schedule)."""
    left = masked.sum(-1)
    if j >= per_block:
        return (left > 0).long()
    if cfg.schedule in ("linear", "ascending"):
        n = schedule[:, j - j0]
    elif cfg.remasking == "origin":  # Dream: each masked position flips independently with prob 1 - s/t
        p = 1.0 if j == per_block - 1 else 1 - times[j + 1] / times[j]
        n = torch.binomial(left.double(), torch.full_like(left, p, dtype=torch.double), generator=generator).long()
    else:
        n = dream_count(left, times[j], times[j + 1], last=j == per_block - 1)
    return torch.maximum(n, (left > 0).long()) if dynamic else n
