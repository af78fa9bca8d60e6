"""Ulysses sequence parallelism (SP) for every DARE family: each rank of an SP group runs the model on a contiguous
1/sp chunk of the same sequences; inside attention an all-to-all trades the sequence split for a head split, so each
rank attends over the FULL sequence for H/sp heads, with the FULL 4-D mask of the family's layout (bidirectional,
padding exclusion, block-causal, ``[x_t ‖ x_0]``), and a second all-to-all restores the sequence split. Exact
against full attention (no DeepSpeed; gloo and NCCL).

    import torch.distributed as dist
    from dare.parallel import SequenceParallel

    dist.init_process_group("gloo")                 # or accelerate launch / torchrun
    sp = SequenceParallel()                         # the SP group: the whole world (or SequenceParallel(group))
    model.set_attn_implementation("ulysses_sdpa")   # registered by importing this module
    logits = sp.logits(family, model, noisy, attention_mask, clean_ids=clean)  # = family.logits(...)[:, sp.chunk(L)]
    loss = (per_token_loss(logits, sp.shard(targets)) * sp.shard(weights)).sum() / normaliser_of_the_full_rows
    loss.backward()                                 # then SUM the gradients over sp.group

How the model gets the full mask: ``sp.inputs`` builds positions and the 4-D mask of the FULL sequence with the
backbone's own rule (``DiffusionBackbone._positions_and_mask``), then hands the model this rank's tokens, their GLOBAL
positions (RoPE) and the full mask, which the backbone passes through untouched to ``ulysses_sdpa``.

``ulysses_sdpa`` is a drop-in for ``sdpa``: a call whose mask covers as many keys as it holds (rollouts, evaluation,
KV-cached decoding) is plain sdpa; it exchanges only when the mask covers sp times the local keys. So one model serves
sharded training passes and unsharded generation, with no mode to switch (and gradient checkpointing's recompute
takes the same path). Requirements: sequence length divisible by sp (pad with ``attention_mask`` 0), attention heads
divisible by sp (KV heads are repeated only as much as divisibility needs), no KV cache in sharded calls.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

from .models import masks
from .models.common import DiffusionBackbone

ATTENTION = "ulysses_sdpa"
_group = None  # the SP group ulysses_sdpa exchanges over (None = the whole world); set by SequenceParallel


def _size(group) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` on dim 0 (block j goes to rank j, block i arrives from rank i). It is its own adjoint:
    the gradient of received block i is sent back to rank i as the same exchange."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, x = group, x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _AllToAll.apply(grad, ctx.group), None


def _seq_to_heads(x, size, group):
    """``[B, H, L/sp, D]`` (this rank's chunk, all heads) -> ``[B, H/sp, L, D]`` (all chunks, this rank's heads)."""
    b, h, c, d = x.shape
    x = _AllToAll.apply(x.reshape(b, size, h // size, c, d).transpose(0, 1), group)  # [sp: chunk, B, H/sp, c, D]
    return x.permute(1, 2, 0, 3, 4).reshape(b, h // size, size * c, d)


def _heads_to_seq(x, size, group):
    """``[B, H/sp, L, D]`` -> ``[B, H, L/sp, D]``."""
    b, h, n, d = x.shape
    x = _AllToAll.apply(x.reshape(b, h, size, n // size, d).permute(2, 0, 1, 3, 4), group)  # [sp: heads, B, ...]
    return x.transpose(0, 1).reshape(b, size * h, n // size, d)


def ulysses_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers attention interface: ``query [B, H, Lq, D]``, ``key/value [B, Hkv, Lk, D]`` -> ``([B, Lq, H, D],
    None)``. Sharded when ``attention_mask [B|1, 1, L|1, L]`` covers ``L = sp * Lk`` keys (q/k/v are this rank's
    chunk of the sequence); otherwise transformers' sdpa."""
    local = key.shape[-2]
    if attention_mask is None or attention_mask.shape[-1] == local:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    size, name = _size(_group), type(module).__name__
    if attention_mask.shape[-1] != size * local or query.shape[-2] != local:
        raise ValueError(f"{ATTENTION}: the mask covers {attention_mask.shape[-1]} keys, but this rank holds "
                         f"{query.shape[-2]} queries / {local} keys and the SP group has {size} ranks "
                         f"(expected {size} x {local}); a KV cache is not supported in sharded calls")
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % size:
        raise ValueError(f"{ATTENTION}: {name} has {heads} attention heads ({kv_heads} KV heads), not divisible by "
                         f"the sequence-parallel size {size}; choose an SP size that divides {heads}")
    repeat = size // math.gcd(kv_heads, size)  # divides heads / kv_heads since size divides heads
    key, value = repeat_kv(key, repeat), repeat_kv(value, repeat)
    q, k, v = (_seq_to_heads(x, size, _group) for x in (query, key, value))
    k, v = repeat_kv(k, q.shape[1] // k.shape[1]), repeat_kv(v, q.shape[1] // v.shape[1])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask.to(q.dtype), dropout_p=dropout,
                                         scale=scaling)
    return _heads_to_seq(out, size, _group).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, ulysses_sdpa)


class SequenceParallel:
    """The SP group (default: the whole world) and the helpers that shard a batch along the sequence. Constructing
    it also makes ``ulysses_sdpa`` exchange over ``group``: one SP group per process."""

    def __init__(self, group=None):
        global _group
        self.group = _group = group
        self.size = _size(group)
        self.rank = dist.get_rank(group) if self.size > 1 else 0

    def chunk(self, length: int) -> slice:
        """This rank's positions of a length-``length`` sequence."""
        if length % self.size:
            raise ValueError(f"sequence length {length} is not divisible by the sequence-parallel size {self.size}: "
                             "pad the batch (attention_mask 0 on the added positions)")
        n = length // self.size
        return slice(self.rank * n, (self.rank + 1) * n)

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's chunk of ``x`` along ``dim`` (targets, loss masks, weights: sliced like the logits)."""
        part = self.chunk(x.shape[dim])
        return x.narrow(dim, part.start, part.stop - part.start)

    def gather(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim`` in rank order (autograd-aware: gradients flow back)."""
        if self.size == 1:
            return x
        parts = _AllToAll.apply(x.unsqueeze(0).expand(self.size, *x.shape), self.group)
        return torch.cat(parts.unbind(0), dim=dim)

    def inputs(self, model, input_ids, attention_mask=None, position_ids=None, order=None) -> dict:
        """Keyword arguments of ``model(**...)`` for this rank: its chunk of ``input_ids`` (taken in ``order``, a
        permutation of the positions, if given), their global positions and the 4-D mask of the full sequence. The
        masks and positions are the ones the backbone builds for the whole ``input_ids`` (2-D padding mask or a
        ready 4-D mask with ``position_ids``)."""
        backbone = next(m for m in model.modules() if isinstance(m, DiffusionBackbone))
        if backbone.config._attn_implementation != ATTENTION:
            raise ValueError(f"sequence-parallel inputs need the model's attention to be {ATTENTION!r}, got "
                             f"{backbone.config._attn_implementation!r}: call model.set_attn_implementation("
                             f"{ATTENTION!r})")
        batch, length = input_ids.shape
        dtype = next(model.parameters()).dtype
        stub = input_ids.new_empty((batch, length, 0), dtype=dtype)  # the mask builder reads only shape/dtype/device
        position_ids, mask = backbone._positions_and_mask(attention_mask, position_ids, stub, 0)
        if mask is None:  # every key visible: a [1, 1, 1, L] zero mask (still tells ulysses_sdpa the full length)
            mask = torch.zeros(1, 1, 1, length, dtype=dtype, device=input_ids.device)
        position_ids = position_ids.expand(batch, -1)
        if order is not None:
            input_ids, position_ids = input_ids[:, order], position_ids[:, order]
            mask = mask[..., order] if mask.shape[-2] == 1 else mask[:, :, order][:, :, :, order]
        return dict(input_ids=self.shard(input_ids), position_ids=self.shard(position_ids), attention_mask=mask)

    def logits(self, family, model, input_ids, attention_mask=None, *, clean_ids=None,
               segment_ids=None) -> torch.Tensor:
        """This rank's rows ``chunk(L)`` of ``family.logits(model, input_ids, attention_mask, clean_ids=clean_ids,
        segment_ids=segment_ids)`` ``[B, L/sp, V]``, for both layouts and packed rows. The ``[x_t ‖ x_0]`` layout
        gives each rank its chunk of BOTH halves (``2L/sp`` tokens, the noisy chunk first), so every rank scores the
        same number of noisy positions."""
        length = input_ids.shape[1]
        part = self.chunk(length)
        dtype = next(model.parameters()).dtype
        if clean_ids is None:
            if segment_ids is None:
                out = model(**self.inputs(model, input_ids, attention_mask)).logits
            else:
                pos, ok = masks.packed_layout(segment_ids, family.block_size)
                out = model(**self.inputs(model, input_ids, masks.additive(ok, dtype), pos)).logits
            if family.shift:  # Dream: row i reads position i-1, which for the first row lives on the previous rank
                # (rank 0 repeats its own first row, as family.logits does; every rank uses the gathered rows, so
                # the backward exchange runs on all of them)
                first = torch.cat([out[:, :1], self.gather(out[:, -1:])[:, :-1]], dim=1)[:, self.rank:self.rank + 1]
                shifted = torch.cat([first, out[:, :-1]], dim=1)
                # packed rows: an example's first position reads itself, never the previous example
                out = shifted if segment_ids is None else torch.where(self.shard(pos)[..., None] == 0, out, shifted)
            return out
        if family.block_size is None:
            raise ValueError(f"{family.name} is a masked-diffusion family: the [x_t ‖ x_0] layout needs a block size")
        ids, pos, ok = masks.doubled_layout(input_ids, clean_ids, attention_mask, family.block_size, segment_ids)
        order = torch.arange(2 * length, device=ids.device).view(2, self.size, -1).transpose(0, 1).reshape(-1)
        kwargs = self.inputs(model, ids, masks.additive(ok, dtype), pos, order)
        rows = torch.arange(part.stop - part.start, device=ids.device)
        return model(**kwargs, logits_to_keep=rows).logits


class SequenceParallelFamily:
    """``family`` with its ``logits`` run sequence-parallel over ``sp`` and returned whole: every process of the group
    gets all rows (gathered; the gather's backward sends each row's gradient to the process that computed it, summed
    over the group, which DDP's average over the group then undoes). The likelihood estimators score through it
    unchanged. Rows are padded on the right (attention 0) to a multiple of the group size and cut back after.
    Packed rows (``segment_ids``, e.g. from ``dare.packing.PackedFamily``) are sharded the same way."""

    def __init__(self, family, sp: SequenceParallel):
        self._family, self.sp = family, sp

    def __getattr__(self, name):
        return getattr(self._family, name)

    def clean_cache(self, *args, **kwargs):
        return None  # the ranks shard both halves: no whole clean half to cache

    def logits(self, model, input_ids, attention_mask=None, *, clean_ids=None, keep=None, segment_ids=None,
               **unsupported):
        if any(v is not None for v in unsupported.values()):
            raise ValueError(f"sequence-parallel scoring takes no {sorted(unsupported)} (no cache, its own positions)")
        if segment_ids is not None and attention_mask is not None:
            raise ValueError("segment_ids define the attention of packed rows: pass no attention_mask with them")
        length = input_ids.shape[1]
        pad = -length % self.sp.size
        if attention_mask is None and segment_ids is None:
            attention_mask = torch.ones_like(input_ids)
        if pad:  # packed rows: the added positions join (or start) the padding segment
            input_ids = F.pad(input_ids, (0, pad), value=self._family.pad_id)
            if segment_ids is None:
                attention_mask = F.pad(attention_mask, (0, pad), value=0)
            else:
                segment_ids = F.pad(segment_ids, (0, pad), value=-1)
            clean_ids = None if clean_ids is None else F.pad(clean_ids, (0, pad), value=self._family.pad_id)
        rows = self.sp.gather(self.sp.logits(self._family, model, input_ids, attention_mask, clean_ids=clean_ids,
                                             segment_ids=segment_ids))
        rows = rows[:, :length]
        if keep is None:
            return rows
        if torch.is_tensor(keep) and keep.dtype == torch.bool:  # packed rows' kept positions: [M, V]
            return rows[keep]
        return rows[:, length - keep:] if isinstance(keep, int) else rows[:, keep]
