"""Block-diffusion decoding (SDAR, LLaDA2): blocks of the model's block size, aligned to position 0 of each
unpadded sequence, decoded left to right; inside a block, denoising steps commit the scheduled number of most
confident tokens (static) or the tokens a confidence threshold admits (dynamic, ``threshold_rule``). The one thing to
know: the k-th decoded block owns the global steps ``k * S .. (k + 1) * S - 1`` (S = steps per block, or the block
size with a threshold), so step ids do not depend on the other prompts of the batch and a fixed-schedule decoding
resumes exactly. How it follows the official samplers: ``generate_block``.
"""

import torch

from .cache import FixedBlocks, GrowingBlocks
from .config import Generation, plan_block
from .primitives import (
    CONFIDENCE,
    after_first,
    ascending_schedule,
    ban,
    decode_step,
    eos_factor,
    linear_schedule,
    proposal_entropy,
)


def generate_block(model, family, prompt_ids, prompt_mask, cfg, generator, canvas=None, from_step=0, to_step=None,
                   fixed_shapes=False):
    """Decode ``cfg.gen_length`` tokens after each left-padded prompt, as the official samplers (SDAR
    ``generate.py``, LLaDA2 ``generate``) do:

    * the canvas is rounded up to whole blocks with masks everywhere after the prompt, the last block is decoded
      whole (the model was trained on full blocks of masks) and the output is cut to ``gen_length``;
    * a block's schedule counts from the block size, ``n_j`` = the even split of the block over the steps, capped by
      the masks left (LLaDA2's ``min(n_j, left)``; SDAR's uncapped ``topk`` would overwrite a decoded token when a
      prompt fills part of the first block, a bug not copied), so a resumed block keeps its counts;
    * stopping: after a block, a sequence that holds a stop token (EOS or the turn terminator) is finished and
      leaves the batch (the model and its cache see only the rows still decoding); the batch stops once all are.
      Tokens after a sequence's first stop token are padding (step -1). The sampling draws stay those of the whole
      batch, so a fixed schedule draws what it drew with the finished rows riding along; a threshold (a block runs
      while any live row has masks) may run fewer steps, so later blocks draw other, equally distributed, numbers.

    Batching: every prompt is laid out so that its block grid coincides with the canvas grid (left padding by whole
    blocks); the last, partial prompt block is the first block decoded. Committed blocks live in a KV cache; a
    finished block's K/V are appended during the next block's first forward (no extra pass); the full prompt
    blocks are prefilled once per distinct prompt and their K/V copied to its rows (block-causal attention: a
    prompt's K/V do not depend on what follows it). LLaDA2.1 editing
    (``editing_threshold``): every step also overwrites already decoded tokens of the block whose new proposal
    differs with confidence above the threshold; once the block has no masks it keeps refining for up to
    ``max_post_steps`` steps while anything changes. ``step_map`` keeps the step of the first unmasking (edits
    cannot be replayed from it). ``fixed_shapes`` (a compiled model): the block cache is one tensor as wide as the
    canvas and finished rows stay in the batch (``cache.FixedBlocks``), so the forwards take a few shapes only."""
    block, length, cache_mode = family.block_size, cfg.gen_length, cfg.cache or "block"
    steps = plan_block(cfg, family)
    dynamic = cfg.threshold is not None or cfg.factor is not None
    editing = cfg.editing_threshold is not None
    if (from_step or to_step is not None) and (dynamic or editing):
        raise ValueError("resuming from / stopping at a step needs a fixed step schedule (no threshold, factor or "
                         "editing)")
    stop_after = float("inf") if to_step is None else to_step

    x, attn, gen_start, n_full = _layout(prompt_ids, prompt_mask, length, block, family, canvas)
    n_rows, total = x.shape
    if to_step is not None and not 0 <= from_step <= to_step:
        raise ValueError(f"need 0 <= from_step ({from_step}) <= to_step ({to_step})")
    region = gen_start[:, None] + torch.arange(length, device=x.device)  # canvas index of each output token
    step_map = torch.full_like(x, -1)
    block_step = torch.full_like(x, -1)
    entropy = torch.zeros(x.shape, device=x.device) if cfg.record_entropy else None
    out = Generation(None, None, None)
    quota = (ascending_schedule if cfg.schedule == "ascending" else linear_schedule)(
        torch.full((n_rows,), block, device=x.device), steps)  # counted from the block size (official)
    cache = (FixedBlocks if fixed_shapes else GrowingBlocks)(model, total, n_rows) if cache_mode == "block" else None
    if cache is not None and n_full:  # the full prompt blocks
        cache.prefill(model, x, attn, n_full)
        out.nfe += 1
    slot = block if dynamic else steps  # global steps owned by each block (a threshold commits >= 1 per step)
    pending, step = None, 0  # pending: start of the first finished block whose K/V are not cached yet
    stop_ids = torch.tensor(family.stop_ids, device=x.device)
    live = torch.ones(n_rows, dtype=torch.bool, device=x.device)  # rows still decoding (the cache holds these)
    decodable = attn.bool() & (torch.arange(total, device=x.device)[None] >= gen_start[:, None])  # not prompt
    for b, start in enumerate(range(n_full, total, block)):
        end = start + block
        j = max(from_step - b * slot, 0)
        step = b * slot + j
        if j >= steps or step >= stop_after:
            if step >= stop_after:
                break
            pending = start if pending is None else pending  # decoded before the resume: cache it with the next
            continue
        masked = (x[:, start:end] == family.mask_id) & live[:, None]
        rows = None if bool(live.all()) or (cache is not None and not cache.drops_rows) else live.nonzero()[:, 0]
        generated = masked.clone()  # positions of this block that are decoded (not prompt, not padding)
        post, edited, carry = 0, True, torch.zeros(n_rows, dtype=torch.long, device=x.device)
        while ((masked.any() and (dynamic or j < steps)) or (editing and edited and post < cfg.max_post_steps)) \
                and step < stop_after:
            xs, attns = (x, attn) if rows is None else (x[rows], attn[rows])
            if cache is None:
                lg = family.logits(model, xs[:, :end], attns[:, :end])[:, start:]
            else:
                first = start if pending is None else pending
                lg = family.logits(model, xs[:, first:end], **cache.inputs(attns, first, end))[:, -block:]
                cache.keep(start)
                pending = None
            if rows is not None:  # finished rows get flat logits: nothing of theirs is masked, so nothing commits
                lg = lg.new_zeros((n_rows, *lg.shape[1:])).index_copy_(0, rows, lg)
            out.nfe += 1
            left = masked.sum(-1)
            n = (quota[:, j] if j < steps else torch.zeros_like(left)) + carry
            n = torch.maximum(n.minimum(left), (left > 0).long()) if dynamic or j >= steps else n.minimum(left)
            post += int(not masked.any())
            x0, chosen, conf = decode_step(lg, masked, n, cfg, family.eos_id, generator, family.mask_id,
                                           eos_factor(cfg.eos_early_rejection, j, steps))
            if cfg.threshold is not None and cfg.threshold_rule == "quota":
                carry = n - chosen.sum(-1)
            if cfg.record_states:  # the block's proposal at every masked position, and its probability
                proposal = ban(lg, cfg, family.eos_id, family.mask_id)
                prediction, probability = x.clone(), torch.zeros(x.shape, device=x.device)
                prediction[:, start:end] = torch.where(masked, x0, x[:, start:end])
                probability[:, start:end] = CONFIDENCE["low_confidence"](proposal, x0) * masked
                out.predictions.append(prediction.gather(1, region))
                out.confidences.append(probability.gather(1, region))
            if editing:  # LLaDA2.1: overwrite decoded tokens the model now confidently replaces
                edit = generated & ~masked & (x0 != x[:, start:end]) & (conf > cfg.editing_threshold)
                edited = bool(edit.any() or chosen.any())
                x[:, start:end][edit] = x0[edit]
            x[:, start:end][chosen] = x0[chosen]
            if cfg.record_entropy:
                drawn = proposal_entropy(ban(lg, cfg, family.eos_id, family.mask_id), cfg.temperature, cfg.top_k,
                                         cfg.top_p)
                entropy[:, start:end][chosen] = drawn[chosen]
            step_map[:, start:end][chosen] = step
            block_step[:, start:end][chosen] = j
            masked &= ~chosen
            step, j = step + 1, j + 1
            if cfg.record_states:
                out.states.append(x.gather(1, region))
        pending = start if pending is None else pending
        if cfg.stop_at_eos:
            finished = (torch.isin(x[:, :end], stop_ids) & decodable[:, :end]).any(-1)
            if bool(finished.all()):
                break
            if cache is not None and cache.drops_rows and bool((finished & live).any()):
                cache.keep_rows((~finished[live]).nonzero()[:, 0])  # the cache's rows are the live ones
            live &= ~finished

    seq, steps_taken, blk = (t.gather(1, region) for t in (x, step_map, block_step))
    # the replay view (cj-grpo): every decoded token, the whole last block and the whole block of the stop token
    # included (those tokens were decoded and seen by the other tokens of their block)
    offsets = torch.arange(length + block - 1, device=x.device)
    wide = gen_start[:, None] + offsets
    inside = wide < total
    wide = wide.clamp(max=total - 1)
    replay_ids, replay_step = x.gather(1, wide), block_step.gather(1, wide)
    if cfg.stop_at_eos:  # everything after the first stop token is padding
        stops = torch.isin(seq, stop_ids)
        first = torch.where(stops.any(-1), stops.long().argmax(-1), length)
        stop_block_end = ((gen_start + first) // block + 1) * block - gen_start  # region index after the stop's block
        inside &= offsets[None] < stop_block_end[:, None]
        after = after_first(stops)
        seq = seq.masked_fill(after, family.pad_id)
        steps_taken, blk = steps_taken.masked_fill(after, -1), blk.masked_fill(after, -1)
        out.states = [s.masked_fill(after, family.pad_id) for s in out.states]
        out.predictions = [s.masked_fill(after, family.pad_id) for s in out.predictions]
        out.confidences = [s.masked_fill(after, 0.0) for s in out.confidences]
    kept = inside & (replay_step >= 0)
    out.replay_ids, out.replay_step = replay_ids.masked_fill(~kept, family.pad_id), replay_step.masked_fill(~kept, -1)
    if entropy is not None:
        out.replay_entropy = entropy.gather(1, wide).masked_fill(~kept, 0.0)
    leftover = seq == family.mask_id  # blocks never reached after an early stop of the whole batch
    if to_step is not None:  # a partial decoding keeps its masks for the resume
        leftover = torch.zeros_like(leftover)
    out.sequences = seq.masked_fill(leftover, family.pad_id)
    out.step_map, out.block_step = steps_taken.masked_fill(leftover, -1), blk.masked_fill(leftover, -1)
    if entropy is not None:
        out.entropy = entropy.gather(1, region).masked_fill(out.step_map < 0, 0.0)
    return out


def _layout(prompt_ids, prompt_mask, length, block, family, canvas=None):
    """Canvas ``[N, T]`` with each prompt left-padded by whole blocks so all block grids coincide, masks (or the
    resumed ``canvas``) from the end of the prompt to the end of the block holding its ``length``-th generated
    token, padding after; returns canvas, attention mask, first generated index, and the number of canvas positions
    made only of full prompt blocks (prefilled into the cache)."""
    real = prompt_mask.sum(-1)
    full_blocks = real // block
    n_full = int(full_blocks.max()) * block
    gen_start = n_full + real % block
    ends = -(-(gen_start + length) // block) * block
    n_rows = prompt_ids.shape[0]
    x = prompt_ids.new_full((n_rows, int(ends.max())), family.pad_id)
    attn = torch.zeros_like(x)
    for r in range(n_rows):
        tokens = prompt_ids[r][prompt_mask[r].bool()]
        begin, stop, end = n_full - int(full_blocks[r]) * block, int(gen_start[r]), int(ends[r])
        x[r, begin:stop] = tokens
        x[r, stop:end] = family.mask_id
        if canvas is not None:
            x[r, stop:stop + length] = canvas[r]
        attn[r, begin:end] = 1
    return x, attn, gen_start, n_full
