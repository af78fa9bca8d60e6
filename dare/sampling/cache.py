"""The operations on a transformers ``DynamicCache`` that the samplers need, and the block sampler's two caches of
committed blocks: one that grows (eager decoding) and one of fixed size (compiled decoding)."""

import torch
from transformers.cache_utils import DynamicCache, StaticCache

from ..models.masks import positions_from_padding


def truncate(cache, length: int) -> None:
    """Keep the first ``length`` cached positions."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def move_tail(cache, start: int, end: int) -> None:
    """Dual cache: the last ``end - start`` cached positions were just computed for positions ``start:end``;
    write them there (in place) and drop the tail."""
    n = end - start
    for layer in cache.layers:
        layer.keys[..., start:end, :] = layer.keys[..., -n:, :]
        layer.values[..., start:end, :] = layer.values[..., -n:, :]
    cache.crop(-n)


def keep_rows(cache, rows) -> None:
    """Keep (or repeat) the batch rows ``rows`` of every layer; unlike ``batch_select_indices``, also of a layer
    cropped to no positions, which keeps its batch size for the next ``update``."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys.dim() == 4:
            layer.keys, layer.values = layer.keys[rows], layer.values[rows]


class GrowingBlocks:
    """The committed blocks' keys and values in a ``DynamicCache`` that grows a block at a time, its columns the
    canvas's; rows that finish leave it (no more work on them)."""

    drops_rows = True

    def __init__(self, model, width: int, rows: int):
        self.cache = DynamicCache()

    def prefill(self, model, canvas: torch.Tensor, attn: torch.Tensor, end: int) -> None:
        """The canvas's columns before ``end`` (the full prompt blocks), once per distinct prompt (a GRPO group
        shares one)."""
        ids, attn = canvas[:, :end], attn[:, :end]
        distinct, copy = torch.unique(torch.cat([ids, attn], 1), dim=0, return_inverse=True)
        if len(distinct) < len(ids):  # (unique sorts its rows: the copy puts each back in its place)
            model(distinct[:, :ids.shape[1]], attention_mask=distinct[:, ids.shape[1]:], cache=self.cache)
            keep_rows(self.cache, copy)
        else:
            model(ids, attention_mask=attn, cache=self.cache)

    def inputs(self, attn: torch.Tensor, first: int, end: int) -> dict:
        """What a forward over canvas columns ``first:end`` takes besides its tokens (``attn``: the whole canvas's
        padding mask), its cache holding the columns before ``first``."""
        return {"attention_mask": attn[:, :end], "cache": self.cache}

    def keep(self, start: int) -> None:
        """Keep the columns before ``start`` (the current block's keys are recomputed at every step)."""
        truncate(self.cache, start)

    def keep_rows(self, rows: torch.Tensor) -> None:
        keep_rows(self.cache, rows)


class FixedBlocks(GrowingBlocks):
    """The same as one tensor per layer as wide as the canvas (transformers' ``StaticCache``, written at its fill
    counter, cropped by moving the counter back), every call reading all its columns with the unfilled ones masked:
    a forward's shapes depend only on how many columns it feeds (the prompt blocks, a block, or a block and the one
    before it), not on which block it decodes, so a compiled model traces three graphs instead of two per block.
    Finished rows stay in the batch, their masks already committed (nothing of theirs changes)."""

    drops_rows = False

    def __init__(self, model, width: int, rows: int):
        config, weight = model.config, next(model.parameters())
        self.cache = StaticCache(config=config, max_cache_len=width)
        # allocated here, outside the compiled forward, so that their addresses are marked static (a CUDA graph then
        # reads them in place instead of being skipped for mutating its inputs)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache.early_initialization(rows, config.num_key_value_heads, head_dim, weight.dtype, weight.device)

    def prefill(self, model, canvas, attn, end):
        model(canvas[:, :end], **self.inputs(attn, 0, end))

    def inputs(self, attn, first, end):
        position = positions_from_padding(attn)
        filled = torch.arange(attn.shape[1], device=attn.device) < end  # the cached columns and this call's
        return {"attention_mask": attn * filled, "position_ids": position[:, first:end],
                "key_position_ids": position, "cache": self.cache}

    def keep(self, start):
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(start)
