"""Attention rules of every family, in one place.

A token is described by its position (counted from 0 of the unpadded sequence), whether it is a real token
(not padding) and, in the block-diffusion training layout ``[x_t ‖ x_0]``, whether it belongs to the clean half.
Block ids are ``position // block_size`` (the "global" block origin). One rule covers all layouts:

* ``block_size is None`` (LLaDA, Dream): every query sees every real key.
* plain layout (every token counts as clean): block-causal, ``block(q) >= block(k)``.
* doubled layout ``[x_t ‖ x_0]`` (SDAR / LLaDA2 training, BD3LM):
  - same block and same half, or
  - noisy query, clean key, ``block(q) > block(k)`` (a noisy block sees the clean earlier blocks), or
  - clean query, clean key, ``block(q) >= block(k)`` (the clean half is block-causal; ``clean_causal``: the clean
    half reads left to right, ``pos(q) >= pos(k)``, as Nemotron-Labs-Diffusion's ``block_diff`` training does).
* packed rows (several SFT examples per row, ``segment_ids``): any of the above AND the same segment. Positions (so
  blocks too) restart at 0 at each example's first token, so every example sees exactly what it would see alone.
  The padding after the last example is a segment of its own (-1) that sees only itself, so no query row is fully
  masked (some attention kernels return NaN for such rows, and 0 * NaN would reach the gradients).

Masks are additive float tensors ``[B, 1, Q, K]`` (0 = visible, dtype minimum = hidden) built in the query dtype:
transformers' eager path adds a bool mask as 0/1, and torch's CPU sdpa mixes dtypes wrongly in float64. A model
loaded with ``attn_implementation="flex_attention"`` gets a FlexAttention ``BlockMask`` of the same rule instead
(``for_attention``): tiles hidden whole (another example of a packed row, the hidden quadrants of ``[x_t ‖ x_0]``,
later blocks) are skipped rather than scored and masked, and no float mask is built.
"""

import torch
from torch.nn.attention.flex_attention import BlockMask

FLEX = "flex_attention"  # transformers' name of the FlexAttention path (``AttentionInterface``)


def fixed_width(cache) -> int | None:
    """The key columns of a fixed-size cache (transformers' ``StaticCache``, compiled decoding: every call returns all
    of them, valid or not), None for a cache that grows (``DynamicCache``) or none."""
    return cache.layers[0].max_cache_len if getattr(cache, "is_compileable", False) else None


def positions_from_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions of a (left- or right-) padded batch: real tokens count 0, 1, 2, ...; pads repeat a neighbour."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def segment_starts(segment_ids: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, L]``: True where a segment (an example of a packed row, or the padding run) begins."""
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    return starts


def segment_positions(segment_ids: torch.Tensor) -> torch.Tensor:
    """Positions of packed rows ``[B, L]``: 0, 1, 2, ... from the first token of each segment."""
    index = torch.arange(segment_ids.shape[1], device=segment_ids.device).expand_as(segment_ids)
    return index - torch.where(segment_starts(segment_ids), index, 0).cummax(-1).values


def visible(
    q_pos: torch.Tensor,
    k_pos: torch.Tensor,
    block_size: int | None,
    k_valid: torch.Tensor | None = None,
    q_clean: torch.Tensor | None = None,
    k_clean: torch.Tensor | None = None,
    q_seg: torch.Tensor | None = None,
    k_seg: torch.Tensor | None = None,
    causal: bool = False,
    clean_causal: bool = False,
    block_origin: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Boolean ``[B, Q, K]``: may query q attend to key k?  None when every key is visible to every query.
    ``causal``: also only keys at positions up to the query's (a model that reads left to right).
    ``clean_causal`` (doubled layout): a clean query sees the clean keys at its position and before.
    ``block_origin`` ``[B]``: the position where each row's block 0 starts (default 0: the global grid)."""
    if block_size is None and k_valid is None and q_seg is None and not causal:
        return None
    batch = max(q_pos.shape[0], k_pos.shape[0], 1 if k_valid is None else k_valid.shape[0])
    ok = torch.ones(batch, q_pos.shape[-1], k_pos.shape[-1], dtype=torch.bool, device=q_pos.device)
    if block_size is not None:
        origin = 0 if block_origin is None else block_origin[:, None]
        qb = ((q_pos - origin) // block_size)[:, :, None]
        kb = ((k_pos - origin) // block_size)[:, None, :]
        if q_clean is None:
            ok = ok & (qb >= kb)
        else:
            qc, kc = q_clean[:, :, None], k_clean[:, None, :]
            same_half = qc == kc
            clean_rule = (q_pos[:, :, None] >= k_pos[:, None, :]) if clean_causal else (qb >= kb)
            ok = ok & (((qb == kb) & same_half & ~qc) | (~qc & kc & (qb > kb)) | (qc & kc & clean_rule))
    if causal:
        ok = ok & (q_pos[:, :, None] >= k_pos[:, None, :])
    if q_seg is not None:
        ok = ok & (q_seg[:, :, None] == k_seg[:, None, :])
    if k_valid is not None:
        ok = ok & k_valid.bool()[:, None, :]
    return ok


def additive(ok: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``[B, Q, K]`` bool -> ``[B, 1, Q, K]`` additive float mask (None stays None)."""
    if ok is None:
        return None
    bias = torch.zeros(ok.shape, dtype=dtype, device=ok.device)
    return bias.masked_fill_(~ok, torch.finfo(dtype).min)[:, None]


def block_mask(ok: torch.Tensor, tile: int = 128) -> BlockMask:
    """``[B, Q, K]`` bool -> FlexAttention ``BlockMask`` of ``tile`` x ``tile`` tiles: hidden tiles are skipped, fully
    visible ones run without reading the mask, partly visible ones read ``ok``. Built from tile summaries of ``ok``
    (``create_block_mask`` would re-materialise the mask through int64 index tensors: 8x its size)."""
    batch, q_len, k_len = ok.shape
    if ok.device.type == "cpu":  # torch's CPU FlexAttention kernel miscompiles a key length made dynamic by a recompile
        torch._dynamo.config.automatic_dynamic_shapes = False  # (C++ error: cur_kvSplitSize5 undeclared): static shapes
    padded = torch.nn.functional.pad(ok, (0, -k_len % tile, 0, -q_len % tile))  # mask_mod reads padded tiles too
    tiles = padded.view(batch, padded.shape[1] // tile, tile, padded.shape[2] // tile, tile)
    seen, full = tiles.any(4).any(2), tiles.all(4).all(2)  # [B, Q tiles, K tiles]

    def ordered(blocks):  # per query tile: how many key tiles, and their indices first
        counts = blocks.sum(-1, dtype=torch.int32)
        indices = blocks.to(torch.int8).argsort(dim=-1, descending=True, stable=True).to(torch.int32)
        return counts[:, None], indices[:, None]

    def mask_mod(b, h, q, k):
        return padded[b, q, k]

    return BlockMask.from_kv_blocks(*ordered(seen & ~full), *ordered(full), BLOCK_SIZE=tile, mask_mod=mask_mod,
                                    seq_lengths=(q_len, k_len))


def for_attention(ok: torch.Tensor | None, dtype: torch.dtype, implementation: str | None):
    """The mask a model's attention path takes: a ``BlockMask`` for FlexAttention, else the additive float mask."""
    if ok is None:
        return None
    return block_mask(ok) if implementation == FLEX else additive(ok, dtype)


def packed_layout(segment_ids: torch.Tensor, block_size: int | None):
    """Positions ``[B, L]`` and the boolean visibility ``[B, L, L]`` of packed rows in the plain layout."""
    pos = segment_positions(segment_ids)
    return pos, visible(pos, pos, block_size, q_seg=segment_ids, k_seg=segment_ids)


def doubled_layout(x_t: torch.Tensor, x_0: torch.Tensor, attention_mask: torch.Tensor | None, block_size: int,
                   segment_ids: torch.Tensor | None = None, clean_causal: bool = False,
                   block_origin: torch.Tensor | None = None):
    """Inputs for the ``[x_t ‖ x_0]`` layout: ids ``[B, 2L]``, positions ``[B, 2L]`` (duplicated) and the boolean
    visibility ``[B, 2L, 2L]``. ``segment_ids`` (packed rows) replaces ``attention_mask``; ``clean_causal``: the clean
    half reads left to right instead of block-causally; ``block_origin``: where each row's blocks start."""
    if x_t.shape != x_0.shape:
        raise ValueError(f"x_t and x_0 must have the same shape, got {tuple(x_t.shape)} and {tuple(x_0.shape)}")
    batch, length = x_t.shape
    seg2 = None
    if segment_ids is not None:
        pos, valid, seg2 = segment_positions(segment_ids), None, torch.cat([segment_ids, segment_ids], dim=1)
    elif attention_mask is None:
        pos = torch.arange(length, device=x_t.device).expand(batch, length)
        valid = None
    else:
        pos, valid = positions_from_padding(attention_mask), attention_mask.bool()
        valid = torch.cat([valid, valid], dim=1)
    pos2 = torch.cat([pos, pos], dim=1)
    clean = torch.zeros(batch, 2 * length, dtype=torch.bool, device=x_t.device)
    clean[:, length:] = True
    ok = visible(pos2, pos2, block_size, k_valid=valid, q_clean=clean, k_clean=clean, q_seg=seg2, k_seg=seg2,
                 clean_causal=clean_causal, block_origin=block_origin)
    return torch.cat([x_t, x_0], dim=1), pos2, ok


def unread_noisy_columns(attention_mask: torch.Tensor | None, rows: torch.Tensor, width: int, block_size: int,
                         block_origin: torch.Tensor | None = None) -> int:
    """How many leading columns of the ``[x_t ‖ x_0]`` layout's noisy half no kept row ``rows`` (1-D columns of the
    noisy half) can read: a noisy query reads noisy keys of its own block only and clean keys of earlier blocks, and
    clean queries read clean keys only, so a row's noisy columns in blocks before its first kept block (the prompt's
    whole blocks, in RL scoring) change no kept logit. The count is the same for every row (the batch's minimum).
    ``rows`` may also be a boolean ``[B, L]`` keep: the columns any row keeps."""
    if rows.dtype == torch.bool:
        rows = rows.any(0).nonzero()[:, 0]
    if rows.numel() == 0:
        return 0
    device = rows.device
    valid = (torch.ones(1, width, dtype=torch.bool, device=device) if attention_mask is None
             else attention_mask.bool())
    block = (positions_from_padding(valid) - (0 if block_origin is None else block_origin[:, None])) // block_size
    first_kept = torch.where(valid[:, rows], block[:, rows], torch.iinfo(block.dtype).max).min(-1).values
    needed = valid & (block >= first_kept[:, None])
    first = torch.where(needed, torch.arange(width, device=device), width).min(-1).values
    return min(int(first.min()), int(rows.min()))
