"""Block-diffusion decoding (SDAR, LLaDA2): blocks of the model's block size, aligned to position 0 of each
unpadded sequence, decoded left to right; inside a block, denoising steps commit the scheduled number of most
confident tokens (static) or every token above a confidence threshold (dynamic; SDAR / SGLang LowConfidence).

Batching: every prompt is laid out so that its block grid coincides with the canvas grid (left padding by whole
blocks); the last, partial prompt block is the first block decoded. Committed blocks live in a KV cache; a
finished block's K/V are appended during the next block's first forward (no extra pass). Generation stops once
every sequence holds a stop token; tokens after a sequence's first stop token are padding (step -1).

LLaDA2.1 editing (``editing_threshold``): every step also overwrites already decoded tokens of the block whose
new proposal differs with confidence above the threshold; once the block has no masks it keeps refining for up to
``max_post_steps`` steps while anything changes. ``step_map`` keeps the step of the first unmasking (edits cannot
be replayed from it).
"""

import torch
from transformers.cache_utils import DynamicCache

from .cache import truncate
from .primitives import after_first, ascending_schedule, ascending_steps, decode_step, eos_factor, linear_schedule


def generate_block(model, family, prompt_ids, prompt_mask, cfg, generator):
    from . import Generation
    block, length = family.block_size, cfg.gen_length
    if cfg.block_length not in (None, block):
        raise ValueError(f"{family.name} attends in blocks of {block}; block_length={cfg.block_length} needs a "
                         "checkpoint trained with that block size (set config.block_size)")
    cache_mode = cfg.cache or "block"
    if cache_mode not in ("block", "none"):
        raise ValueError(f"{family.name} is a block-diffusion family: cache must be 'block' or 'none'")
    steps = cfg.steps or (ascending_steps(block) if cfg.schedule == "ascending" else block)
    if steps > block:
        raise ValueError(f"steps per block ({steps}) is larger than the block size ({block})")
    dynamic = cfg.threshold is not None or cfg.factor is not None
    editing = cfg.editing_threshold is not None

    x, attn, gen_start, n_full = _layout(prompt_ids, prompt_mask, length, block, family)
    n_rows, total = x.shape
    region = gen_start[:, None] + torch.arange(length, device=x.device)  # canvas index of each generated token
    step_map = torch.full_like(x, -1)
    block_step = torch.full_like(x, -1)
    out = Generation(None, None, None)
    cache = DynamicCache() if cache_mode == "block" else None
    if cache is not None and n_full:
        model(x[:, :n_full], attention_mask=attn[:, :n_full], cache=cache)
        out.nfe += 1
    pending, step = None, 0  # pending: start of a finished block whose K/V are not cached yet
    stop_ids = torch.tensor(family.stop_ids, device=x.device)
    for start in range(n_full, total, block):
        end = start + block
        masked = x[:, start:end] == family.mask_id
        generated = masked.clone()  # positions of this block that are decoded (not prompt, not padding)
        schedule = (ascending_schedule if cfg.schedule == "ascending" else linear_schedule)(masked.sum(-1), steps)
        j, post, edited = 0, 0, True
        while (masked.any() and (dynamic or j < steps)) or (editing and edited and post < cfg.max_post_steps):
            if cache is None:
                lg = family.logits(model, x[:, :end], attn[:, :end])[:, start:]
            else:
                first = start if pending is None else pending
                lg = family.logits(model, x[:, first:end], attn[:, :end], cache=cache)[:, -block:]
                truncate(cache, start)
                pending = None
            out.nfe += 1
            left = masked.sum(-1)
            n = schedule[:, j] if j < steps else (left > 0).long()
            if dynamic:
                n = torch.maximum(n, (left > 0).long())
            post += int(not masked.any())
            x0, chosen, conf = decode_step(lg, masked, n, cfg, family.eos_id, generator, family.mask_id,
                                           eos_factor(cfg.eos_early_rejection, j, steps))
            if editing:  # LLaDA2.1: overwrite decoded tokens the model now confidently replaces
                edit = generated & ~masked & (x0 != x[:, start:end]) & (conf > cfg.editing_threshold)
                edited = bool(edit.any() or chosen.any())
                x[:, start:end][edit] = x0[edit]
            x[:, start:end][chosen] = x0[chosen]
            step_map[:, start:end][chosen] = step
            block_step[:, start:end][chosen] = j
            masked &= ~chosen
            step, j = step + 1, j + 1
            if cfg.record_states:
                out.states.append(x.gather(1, region))
        pending = start
        if cfg.stop_at_eos and bool(torch.isin(x.gather(1, region.clamp(max=end - 1)), stop_ids).any(-1).all()):
            break

    seq, steps_taken, blk = (t.gather(1, region) for t in (x, step_map, block_step))
    if cfg.stop_at_eos:  # everything after the first stop token is padding
        stops = torch.isin(seq, stop_ids)
        first = torch.where(stops.any(-1), stops.long().argmax(-1), length)
        stop_block_end = ((gen_start + first) // block + 1) * block - gen_start  # region index after the stop's block
        kept = (torch.arange(length, device=x.device)[None] < stop_block_end[:, None]) & (seq != family.mask_id)
        out.replay_ids, out.replay_step = seq.masked_fill(~kept, family.pad_id), blk.masked_fill(~kept, -1)
        after = after_first(stops)
        seq = seq.masked_fill(after, family.pad_id)
        steps_taken, blk = steps_taken.masked_fill(after, -1), blk.masked_fill(after, -1)
        out.states = [s.masked_fill(after, family.pad_id) for s in out.states]
    leftover = seq == family.mask_id  # blocks never reached after an early stop of the whole batch
    out.sequences = seq.masked_fill(leftover, family.pad_id)
    out.step_map, out.block_step = steps_taken.masked_fill(leftover, -1), blk.masked_fill(leftover, -1)
    return out


def _layout(prompt_ids, prompt_mask, length, block, family):
    """Canvas ``[N, T]`` with each prompt left-padded by whole blocks so all block grids coincide, masks for the
    ``length`` generated tokens, padding after them; returns canvas, attention mask, first generated index, and
    the number of canvas positions made only of full prompt blocks (prefilled into the cache)."""
    real = prompt_mask.sum(-1)
    full_blocks = real // block
    n_full = int(full_blocks.max()) * block
    gen_start = n_full + real % block
    total = -(-(int(gen_start.max()) + length) // block) * block
    n_rows = prompt_ids.shape[0]
    x = prompt_ids.new_full((n_rows, total), family.pad_id)
    attn = torch.zeros_like(x)
    for r in range(n_rows):
        tokens = prompt_ids[r][prompt_mask[r].bool()]
        begin = n_full - int(full_blocks[r]) * block
        stop = begin + len(tokens)
        x[r, begin:stop] = tokens
        x[r, stop:stop + length] = family.mask_id
        attn[r, begin:stop + length] = 1
    return x, attn, gen_start, n_full
