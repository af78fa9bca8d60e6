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

import math

import torch
import torch.nn.functional as F

from .diffusion import NoiseRecipe, corrupt, corrupt_uniform, random_subset, recipe_for, sample_t, uniform
from .models import diffusion_gemma, masks

SELF_CONDITIONING = 0.5  # uniform-noise SFT: the share of examples trained with a previous pass's logits
ENCODER_LOSS_WEIGHT = 1.0  # uniform-noise SFT: the encoder's next-token loss beside the denoising loss (Google's)


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
                    masked tokens (``masked``); ``[that, trained tokens]`` with the recipe's causal loss. Default:
                    this batch's own. A trainer passes the count of the whole
                    optimiser step (every micro-batch, every process, divided by the processes since DDP averages
                    gradients), so the loss does not depend on how the step is split.
    sp              a ``dare.parallel.SequenceParallel``: this process holds 1/sp of every row (the same batch and
                    noise on every process of the group); the loss is its share, and the group's shares add up to
                    the loss (sum the gradients over the group). Normalisers count the whole rows.
    return_parts    also return a dict: t, masked, noisy ids, n_masked / answer_len per example, per-sequence loss
                    (answer_length normaliser), the per-token weighted CE ``[B, L]`` and the diffusion term; with a
                    causal loss, that term and its per-token CE ``[B, L]`` (at each target), for logging and tests.

    The recipe's ``causal_loss`` (Nemotron-Labs-Diffusion) adds the next-token CE of the clean half of ``[x_t ‖ x_0]``
    (read left to right) at every trained position, divided by the step's trained tokens; the diffusion term is
    weighted by ``diffusion_weight``.
    """
    recipe = recipe if recipe is not None else recipe_for(family)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids) if segment_ids is None else (segment_ids >= 0).long()
    if family.noise == "uniform":
        if segment_ids is not None or sp is not None:
            raise ValueError(f"{family.name}: packed rows and sequence parallelism are not supported (its encoder "
                             "reads each whole row causally)")
        _check(family, input_ids, loss_mask, attention_mask, t, masked, segment_ids)
        return uniform_sft_loss(model, family, input_ids, loss_mask, attention_mask, recipe=recipe, t=t,
                                masked=masked, generator=generator, normaliser=normaliser, return_parts=return_parts)
    _check(family, input_ids, loss_mask, attention_mask, t, masked, segment_ids, recipe.causal_loss)
    if recipe.causal_loss and family.causal_block is None:
        raise ValueError(f"{family.name}: the recipe's causal loss reads the clean half left to right, which only a "
                         "family that decodes against a causal context does")
    if recipe.causal_loss and sp is not None:
        raise ValueError(f"{family.name}: sequence parallelism does not support the joint causal + diffusion loss")
    loss_mask = loss_mask.bool()
    if masked is None:
        t, masked = sft_noise(family, input_ids, loss_mask, recipe, generator, segment_ids=segment_ids, t=t)
    t = t.to(device=input_ids.device, dtype=torch.float32)
    masked = masked.bool()
    noisy = input_ids.masked_fill(masked, family.mask_id)

    clean = input_ids if family.is_block_diffusion or recipe.causal_loss else None
    padding = attention_mask if segment_ids is None else None
    reads = {}
    if recipe.causal_loss:  # its targets: the trained positions after the first, each read at the position before
        targets = torch.zeros_like(loss_mask)
        targets[:, 1:] = loss_mask[:, 1:]
        reads = {"clean_keep": targets.roll(-1, 1)}
    if sp is None:  # the masked positions' logits only: the output layer and the logits skip every other position
        logits = family.logits(model, noisy, padding, clean_ids=clean, segment_ids=segment_ids, keep=masked, **reads)
        logits, causal = logits if recipe.causal_loss else (logits, None)
        mine = masked
    else:  # this process scores its chunk of every row; the group's losses add up to the whole loss
        part = sp.chunk(input_ids.shape[1])
        logits = sp.logits(family, model, noisy, padding, clean_ids=clean, segment_ids=segment_ids)[masked[:, part]]
        mine = torch.zeros_like(masked)  # the whole row's positions of this chunk
        mine[:, part] = masked[:, part]
    ce = F.cross_entropy(logits.float(), input_ids[mine], reduction="none")
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
    normaliser = torch.as_tensor(normaliser, dtype=torch.float32, device=input_ids.device)
    units = normaliser[0] if recipe.causal_loss else normaliser
    if recipe.normalizer == "answer_length":
        per_seq = per_example(token) / answer_len.clamp(min=1)
        diffusion = per_seq.sum() / units
    else:
        per_seq = per_example(token) / n_masked.clamp(min=1)
        diffusion = token.sum() / units.clamp(min=1)
    loss = recipe.diffusion_weight * diffusion
    parts = {"t": t, "masked": masked, "noisy": noisy, "n_masked": n_masked, "answer_len": answer_len,
             "per_seq": per_seq.detach(), "token_loss": token.detach(), "diffusion_loss": diffusion.detach()}
    if recipe.causal_loss:  # the clean half's next-token CE over the trained positions, per the step's count of them
        ce = F.cross_entropy(causal.float(), input_ids[targets], reduction="none")
        causal_token = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        causal_token = causal_token.index_put((targets,), ce)
        causal_term = causal_token.sum() / normaliser[1].clamp(min=1)
        loss = loss + causal_term
        parts.update(causal_loss=causal_term.detach(), causal_token_loss=causal_token.detach())
    return (loss, parts) if return_parts else loss


def uniform_sft_loss(model, family, input_ids, loss_mask, attention_mask, *, recipe=None, t=None, masked=None,
                     generator=None, normaliser=None, return_parts: bool = False):
    """Uniform-state diffusion SFT (DiffusionGemma), as Google's fine-tuning code defines it (google-deepmind/gemma
    ``gemma/diffusion/hackable_diffusion_adapter/sft_model.py``), with every canvas scored at once:

    * the rows are ``prompt + response`` EOS-filled to whole canvases (``loss_mask``: the canvases, which start at
      the first loss position), right-padded; one t per example, each canvas position replaced with probability t
      by a uniformly random token (``masked`` marks them);
    * self-conditioning: a first pass without gradient; its logits feed the second pass for a random half of the
      examples (``SELF_CONDITIONING``), the others get none (the decoder's zero signal, what the first decoding step
      sees; Google's code feeds them zero logits, i.e. the mean embedding, which decoding never shows the model);
    * denoising loss: the cross-entropy of every canvas position, noised or not, averaged per canvas, then over the
      example's canvases. Google scores one uniformly chosen canvas per example: this is that loss's expectation
      over the choice, so the same objective with less variance;
    * plus ``ENCODER_LOSS_WEIGHT`` x the encoder's next-token cross-entropy over the row (its mean per example);
    * the sum over examples divided by ``normaliser`` (default: the examples of this batch).
    """
    recipe = recipe if recipe is not None else recipe_for(family)
    loss_mask = loss_mask.bool()
    if masked is None:
        t, masked = sft_noise(family, input_ids, loss_mask, recipe, generator, t=t)
    start = loss_mask.float().argmax(-1)
    canvas = family.block_size
    width = input_ids.shape[1] - int(start.min())
    noisy = corrupt_uniform(input_ids, masked, family.vocab_size, generator)
    with torch.no_grad():
        previous = family.logits(model, noisy, attention_mask, clean_ids=input_ids, start=start, keep=width)
    coin = uniform((input_ids.shape[0],), generator, input_ids.device) < SELF_CONDITIONING
    logits, encoder_logits = diffusion_gemma.layout_logits(
        model, noisy, input_ids, attention_mask, start, width, previous.detach(), coin, with_encoder=True)
    region = loss_mask[:, -width:]
    ce = F.cross_entropy(logits[region].float(), input_ids[:, -width:][region], reduction="none")
    token = torch.zeros(region.shape, dtype=torch.float32, device=input_ids.device).index_put((region,), ce)
    col = torch.arange(width, device=input_ids.device) + input_ids.shape[1] - width
    index = ((col[None] - start[:, None]).clamp(min=0) // canvas).masked_fill(~region, 0)  # canvas of each position
    n_canvases = int(index.max()) + 1
    per_canvas = torch.zeros(len(start), n_canvases, device=token.device).scatter_add_(1, index, token)
    sizes = torch.zeros_like(per_canvas).scatter_add_(1, index, region.float())
    used = sizes > 0
    denoise = (per_canvas / sizes.clamp(min=1)).sum(-1) / used.sum(-1).clamp(min=1)
    real = attention_mask.bool()
    pairs = real[:, :-1] & real[:, 1:]
    nll = F.cross_entropy(encoder_logits[:, :-1][pairs], input_ids[:, 1:][pairs], reduction="none")
    per_pair = torch.zeros(pairs.shape, device=nll.device).index_put((pairs,), nll)
    encoder = per_pair.sum(-1) / pairs.sum(-1).clamp(min=1)
    per_seq = denoise + ENCODER_LOSS_WEIGHT * encoder
    if normaliser is None:
        normaliser = float(len(start))
    loss = per_seq.sum() / torch.as_tensor(normaliser, dtype=torch.float32, device=per_seq.device).clamp(min=1)
    if not return_parts:
        return loss
    return loss, {"t": t, "masked": masked, "noisy": noisy, "n_masked": masked.sum(-1), "answer_len": loss_mask.sum(-1),
                  "per_seq": per_seq.detach(), "denoise": denoise.detach(), "encoder": encoder.detach(),
                  "self_conditioned": coin}


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
    if recipe.schedule == "cosine":  # in float32, as MaskGIT's mask_schedule: exactly this many of each row
        share = torch.cos(t.to(device=input_ids.device, dtype=torch.float32) * (math.pi / 2))
        counts = (loss_mask.sum(-1) * share).round().clamp(min=1).long()
        return t, random_subset(loss_mask, counts, generator)
    _, masked = corrupt(input_ids, loss_mask.bool(), t, family.mask_id, generator, recipe.min_one)
    return t, masked


def sft_units(family, loss_mask: torch.Tensor, masked: torch.Tensor, recipe: NoiseRecipe | None = None,
              segment_ids: torch.Tensor | None = None) -> torch.Tensor:
    """What ``sft_loss`` averages over in a batch: its examples (``answer_length`` recipes, a per-sequence mean; the
    rows, or the segments of packed rows) or its masked tokens (``masked``: LLaDA2's token mean); with a causal loss,
    ``[that, trained tokens]``. Counts add up over micro-batches and processes."""
    recipe = recipe if recipe is not None else recipe_for(family)
    if recipe.normalizer == "answer_length":
        examples = loss_mask.shape[0] if segment_ids is None else int(segment_ids.max()) + 1
        units = torch.tensor(float(examples), device=loss_mask.device)
    else:
        units = masked.sum().float()
    if recipe.causal_loss:  # and the causal term's: the trained tokens (NeMo AutoModel's supervised-token count)
        return torch.stack([units, loss_mask.sum().float()])
    return units


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


def _check(family, input_ids, loss_mask, attention_mask, t, masked, segment_ids, causal_loss=False):
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
    if (family.shift or causal_loss) and bool((loss_mask.bool() & first).any()):
        reader = "its causal loss predicts" if causal_loss else "predicts"
        raise ValueError(f"{family.name} {reader} token i from position i-1: an example's position 0 (its first "
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
