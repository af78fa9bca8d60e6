"""Packed scoring rows (``train_rl.py --pack N``): a family whose ``logits`` moves the attended positions of every row
into as few rows as fit (first fit, longest first, into rows of N tokens, or of the batch's width if wider), scores
them as packed rows (``Family.logits(..., segment_ids=)``: attention inside each row's own tokens, positions and
blocks from its first attended token, Dream's shift inside it) and puts the logits back where the rows had them. The
likelihood estimators score through it unchanged, as through ``dare.parallel.SequenceParallelFamily`` (which it may
wrap).

Why the logits are the unpacked ones: a padded row's positions count its attended tokens only
(``masks.positions_from_padding``) and its queries see only attended keys, which is what a packed segment gets. What
differs are the positions the row does not attend (left padding, a block completion after its stop block): their
logits are returned as zeros. No estimator reads them: every loss, weight and metric is masked by the loss mask or
the noise, which lie inside the attended completion (``tests/test_packing.py`` checks per-token log-probs and losses
of several algorithms, both layouts). For Dream, a row's first attended token reads itself instead of the padding
before it: a prompt token, never a target.
"""

import torch


def first_fit(lengths: list[int], width: int) -> tuple[list[int], list[int]]:
    """``(row, offset)`` of each length, placed longest first into the first row of ``width`` with room."""
    rows, offsets, room = [0] * len(lengths), [0] * len(lengths), []
    for n in sorted(range(len(lengths)), key=lambda n: -lengths[n]):
        r = next((r for r, left in enumerate(room) if left >= lengths[n]), len(room))
        if r == len(room):
            room.append(width)
        rows[n], offsets[n] = r, width - room[r]
        room[r] -= lengths[n]
    return rows, offsets


class PackedFamily:
    """``family`` (or a wrapper of it) with its ``logits`` computed on packed rows of ``max(width, L)`` tokens and
    returned in the unpacked layout ``[N, L | keep, V]`` (zeros where a row attends nothing). Both layouts; ``keep``
    as in ``Family.logits``. Masked-diffusion rows attend their whole canvas, so only rows wider than the batch
    (``width`` > L) hold two of them; where no two rows share one, the rows are scored as they are."""

    def __init__(self, family, width: int = 0):
        self._family, self.width = family, width

    def __getattr__(self, name):
        return getattr(self._family, name)

    def clean_cache(self, *args, **kwargs):
        return None  # packed rows take their own positions: the unpacked clean half's cache does not apply

    def logits(self, model, input_ids, attention_mask=None, *, clean_ids=None, keep=None, **unsupported):
        if any(v is not None for v in unsupported.values()):
            raise ValueError(f"packed scoring takes no {sorted(unsupported)} (no cache, its own positions)")
        if attention_mask is None:  # nothing to pack away
            return self._family.logits(model, input_ids, clean_ids=clean_ids, keep=keep)
        batch, width = input_ids.shape
        device, attended = input_ids.device, attention_mask.bool()
        lengths = attended.sum(-1).tolist()
        rows, offsets = first_fit(lengths, max(self.width, width))
        if max(rows) + 1 == batch:  # nothing shares a row: the rows as they are cost less
            return self._family.logits(model, input_ids, attention_mask, clean_ids=clean_ids, keep=keep)
        used = max(o + n for o, n in zip(offsets, lengths, strict=True)) or 1
        src_n, src_c = attended.nonzero(as_tuple=True)  # row-major: each row's attended tokens in order
        dst_r = torch.tensor(rows, device=device)[src_n]
        dst_c = torch.tensor(offsets, device=device)[src_n] + attended.long().cumsum(-1)[src_n, src_c] - 1
        shape = (max(rows) + 1, used)
        ids = input_ids.new_full(shape, self._family.pad_id).index_put_((dst_r, dst_c), input_ids[src_n, src_c])
        segments = input_ids.new_full(shape, -1).index_put_((dst_r, dst_c), src_n)
        clean = None
        if clean_ids is not None:
            clean = clean_ids.new_full(shape, self._family.pad_id).index_put_((dst_r, dst_c), clean_ids[src_n, src_c])
        cols = torch.arange(width, device=device)
        if keep is not None:
            cols = keep if torch.is_tensor(keep) else cols[width - keep:]
        where = torch.full((batch, width), -1, device=device).index_put_((src_n, src_c), dst_r * used + dst_c)
        where = where[:, cols]  # [N, K]: the packed (flat) index of every kept position, -1 where not attended
        n, k = (where >= 0).nonzero(as_tuple=True)
        wanted = torch.zeros(shape, dtype=torch.bool, device=device)
        wanted.view(-1)[where[n, k]] = True  # only these packed positions get logits (not prompts, not padding)
        packed = self._family.logits(model, ids, clean_ids=clean, segment_ids=segments, keep=wanted)
        rank = wanted.view(-1).cumsum(0) - 1  # each wanted position's row of ``packed`` (row-major)
        return packed.new_zeros(batch, len(cols), packed.shape[-1]).index_put((n, k), packed[rank[where[n, k]]])
