"""SFT objectives of diffusion LLMs: one masked-diffusion loss, parameterised by the family's ``NoiseRecipe``.

    loss = sft_loss(model, family, input_ids, loss_mask, attention_mask, generator=g)
    loss = sft_loss(model, family, input_ids, loss_mask, segment_ids=segment_ids, generator=g)  # packed rows

Packed rows (``SFTDataConfig.pack``) hold several examples; ``segment_ids`` says which example each position belongs
to, and everything per sequence (t, the masks, min_one, the answer-length normaliser, the unit count) is per example,
so a packed batch has exactly the loss of the same examples unpacked (without an EOS tail: ``dare.diffusion``).

The recipes (noise range, 1/t weighting, normaliser, which positions are maskable) and every choice made where
DARE's reference deviates from upstream are documented in ``dare.diffusion``. Logits always come from
``Family.logits`` (Dream's shift, the block families' ``[x_t ‖ x_0]`` layout, packed rows).
"""

import torch
import torch.nn.functional as F

from .diffusion import NoiseRecipe, corrupt, recipe_for, sample_t
from .models import masks


def sft_loss(model, family, input_ids: torch.Tensor, loss_mask: torch.Tensor,
             attention_mask: torch.Tensor | None = None, *, segment_ids: torch.Tensor | None = None,
             recipe: NoiseRecipe | None = None, t: torch.Tensor | None = None, masked: torch.Tensor | None = None,
             generator: torch.Generator | None = None, normaliser: torch.Tensor | float | None = None,
             sp=None, return_parts: bool = False):
    """Masked-diffusion SFT loss of a right-padded or packed batch (a float32 scalar).

    input_ids       ``[B, L]`` prompt + response (+ EOS padding), right-padded; or packed rows (``segment_ids``)
    loss_mask       ``[B, L]`` 1 on the positions the family trains on (response tokens and, if the recipe trains
                    on them, the EOS padding); 0 on the prompt and on excluded padding. These are the maskable
                    positions and the answer length of the normaliser.
    attention_mask  ``[B, L]`` 0 on positions excluded from attention (only LLaDA2 excludes pads); None = all 1
    segment_ids     packed rows ``[B, L]``: the example (0..N-1 over the batch, each one contiguous run) of every
                    position, -1 on padding. None: each row is one example (N = B). Attention stays inside each
                    example (``Family.logits``); attention_mask, if given, must be ``segment_ids >= 0``.
    recipe          defaults to ``recipe_for(family)``
    t, masked       fix the noise levels ``[N]`` (one per example) and/or the masked positions ``[B, L]`` (must lie
                    in loss_mask); ``masked`` needs ``t`` (the weights). Drawn from ``generator`` when not given.
    normaliser      what the loss divides by (``sft_units`` counts it): the examples (``answer_length`` recipes) or the
                    masked tokens (``masked``). Default: this batch's own. A trainer passes the count of the whole
                    optimiser step (every micro-batch, every process, divided by the processes since DDP averages
                    gradients), so the loss does not depend on how the step is split.
    sp              a ``dare.parallel.SequenceParallel``: this process holds 1/sp of every row (the same batch and
                    noise on every process of the group); the loss is its share, and the group's shares add up to
                    the loss (sum the gradients over the group). Normalisers count the whole rows.
    return_parts    also return a dict: t, masked, noisy ids, n_masked / answer_len per example, per-sequence loss
                    (answer_length normaliser) and the per-token weighted CE ``[B, L]``, for logging and tests.
    """
    recipe = recipe if recipe is not None else recipe_for(family)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids) if segment_ids is None else (segment_ids >= 0).long()
    _check(family, input_ids, loss_mask, attention_mask, t, masked, segment_ids)
    loss_mask = loss_mask.bool()
    if masked is None:
        t, masked = sft_noise(family, input_ids, loss_mask, recipe, generator, segment_ids=segment_ids, t=t)
    t = t.to(device=input_ids.device, dtype=torch.float32)
    masked = masked.bool()
    noisy = input_ids.masked_fill(masked, family.mask_id)

    clean = input_ids if family.is_block_diffusion else None
    padding = attention_mask if segment_ids is None else None
    if sp is None:
        logits = family.logits(model, noisy, padding, clean_ids=clean, segment_ids=segment_ids)
        mine = local = masked
    else:  # this process scores its chunk of every row; the group's losses add up to the whole loss
        logits = sp.logits(family, model, noisy, padding, clean_ids=clean, segment_ids=segment_ids)
        part = sp.chunk(input_ids.shape[1])
        mine, local = torch.zeros_like(masked), masked[:, part]  # mine: the whole row's positions of this chunk
        mine[:, part] = local
    ce = F.cross_entropy(logits[local].float(), input_ids[mine], reduction="none")
    token = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    token = token.index_put((mine,), ce)
    if recipe.weight == "inverse_t":
        token = token / (t[:, None] if segment_ids is None else t[segment_ids.clamp(min=0)])

    def per_example(x):  # sums over each example's positions [N]
        if segment_ids is None:
            return x.sum(-1)
        real = segment_ids >= 0
        return torch.zeros(len(t), dtype=x.dtype, device=x.device).index_add_(0, segment_ids[real], x[real])

    answer_len, n_masked = per_example(loss_mask.long()), per_example(masked.long())
    if normaliser is None:
        normaliser = sft_units(family, loss_mask, masked, recipe, segment_ids)
    if recipe.normalizer == "answer_length":
        per_seq = per_example(token) / answer_len.clamp(min=1)
        loss = per_seq.sum() / normaliser
    else:
        per_seq = per_example(token) / n_masked.clamp(min=1)
        loss = token.sum() / torch.as_tensor(normaliser, dtype=torch.float32).clamp(min=1)
    if not return_parts:
        return loss
    return loss, {"t": t, "masked": masked, "noisy": noisy, "n_masked": n_masked, "answer_len": answer_len,
                  "per_seq": per_seq.detach(), "token_loss": token.detach()}


def sft_noise(family, input_ids: torch.Tensor, loss_mask: torch.Tensor, recipe: NoiseRecipe | None = None,
              generator: torch.Generator | None = None, *, segment_ids: torch.Tensor | None = None,
              t: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The noise of one SFT batch: levels ``t`` ``[N]`` (one per example; drawn unless given) and the masked positions
    ``[B, L]`` (within ``loss_mask``), drawn from ``generator`` (default: the global RNG) as ``sft_loss`` draws them.
    Packed rows (``segment_ids``) are drawn on their examples laid out as the rows of an unpacked batch padded to the
    longest example, so they get the very draws of that batch."""
    recipe = recipe if recipe is not None else recipe_for(family)
    if segment_ids is not None:
        rows, cols, real = unpacked_index(segment_ids)
        t, masked = sft_noise(family, input_ids[rows, cols], loss_mask.bool()[rows, cols] & real, recipe, generator,
                              t=t)
        return t, torch.zeros_like(loss_mask, dtype=torch.bool).index_put_((rows[real], cols[real]), masked[real])
    if t is None:
        t = sample_t(input_ids.shape[0], recipe, generator, input_ids.device)
    _, masked = corrupt(input_ids, loss_mask.bool(), t, family.mask_id, generator, recipe.min_one)
    return t, masked


def sft_units(family, loss_mask: torch.Tensor, masked: torch.Tensor, recipe: NoiseRecipe | None = None,
              segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """What ``sft_loss`` averages over in a batch: its examples (``answer_length`` recipes, a per-sequence mean; the
    rows, or the segments of packed rows) or its masked tokens (``masked``: LLaDA2's token mean). Counts add up over
    micro-batches and processes."""
    recipe = recipe if recipe is not None else recipe_for(family)
    if recipe.normalizer == "answer_length":
        examples = loss_mask.shape[0] if segment_ids is None else int(segment_ids.max()) + 1
        return torch.tensor(float(examples), device=loss_mask.device)
    return masked.sum().float()


def unpacked_index(segment_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where the examples of packed rows lie: ``rows, cols, real`` ``[N, W]`` (W = the longest example) such that
    ``x[rows, cols]`` lays example n out on row n from column 0, as an unpacked batch would; ``real`` is False past
    its end (those slots point at position (0, 0))."""
    r, c = (segment_ids >= 0).nonzero(as_tuple=True)
    example = segment_ids[r, c]
    n = int(example.max()) + 1
    first = torch.full((n,), segment_ids.shape[1], device=c.device).scatter_reduce(0, example, c, "amin")
    k = c - first[example]
    shape = (n, int(k.max()) + 1)
    rows, cols = (torch.zeros(shape, dtype=torch.long, device=c.device) for _ in range(2))
    real = torch.zeros(shape, dtype=torch.bool, device=c.device)
    rows[example, k], cols[example, k], real[example, k] = r, c, True
    return rows, cols, real


def _check(family, input_ids, loss_mask, attention_mask, t, masked, segment_ids):
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
    for name, x in (("loss_mask", loss_mask), ("attention_mask", attention_mask), ("masked", masked),
                    ("segment_ids", segment_ids)):
        if x is not None and x.shape != input_ids.shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} != input_ids shape {tuple(input_ids.shape)}")
    examples, first = input_ids.shape[0], torch.zeros_like(input_ids, dtype=torch.bool)
    first[:, 0] = True
    if segment_ids is not None:
        examples, first = _check_segments(segment_ids, attention_mask)
    if t is not None and tuple(t.shape) != (examples,):
        raise ValueError(f"t must have shape [N] = ({examples},) (one per example), got {tuple(t.shape)}")
    if masked is not None and t is None:
        raise ValueError("masked was given without t: the noise levels are needed for the loss weights")
    if not bool(loss_mask.any()):
        raise ValueError("loss_mask is all zero for the whole batch: no response token to learn from "
                         "(prompt fills the row? response truncated away?)")
    if bool((loss_mask.bool() & ~attention_mask.bool()).any()):
        raise ValueError("loss_mask selects positions that attention_mask excludes")
    if family.shift and bool((loss_mask.bool() & first).any()):
        raise ValueError(f"{family.name} predicts token i from position i-1: an example's position 0 (its first "
                         "position) cannot be in loss_mask (every example needs at least one prompt token)")
    if masked is not None and bool((masked.bool() & ~loss_mask.bool()).any()):
        raise ValueError("masked selects positions outside loss_mask (prompt or excluded padding)")
    if t is not None and not bool(((t > 0) & (t <= 1)).all()):
        raise ValueError(f"t must lie in (0, 1], got {t.tolist()}")


def _check_segments(segment_ids, attention_mask):
    """The number of examples and their first positions; each example one contiguous run, ids 0..N-1, -1 = padding."""
    real = segment_ids >= 0
    if not bool(real.any()) or bool((segment_ids < -1).any()):
        raise ValueError("segment_ids must number the examples 0..N-1 and mark padding -1")
    first = masks.segment_starts(segment_ids) & real
    examples = int(segment_ids.max()) + 1
    if int(first.sum()) != examples or len(segment_ids[real].unique()) != examples:
        raise ValueError(f"segment_ids must number {examples} examples 0..{examples - 1}, each one contiguous run "
                         "within a row")
    if not torch.equal(attention_mask.bool(), real):
        raise ValueError("with segment_ids, attention_mask must be segment_ids >= 0 (or None)")
    return examples, first
