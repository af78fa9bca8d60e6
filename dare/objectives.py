"""SFT objectives of diffusion LLMs: one masked-diffusion loss, parameterised by the family's ``NoiseRecipe``.

    loss = sft_loss(model, family, input_ids, loss_mask, attention_mask, generator=g)

The recipes (noise range, 1/t weighting, normaliser, which positions are maskable) and every choice made where
DARE's reference deviates from upstream are documented in ``dare.diffusion``. Logits always come from
``Family.logits`` (Dream's shift, the block families' ``[x_t ‖ x_0]`` layout).
"""

import torch
import torch.nn.functional as F

from .diffusion import NoiseRecipe, corrupt, recipe_for, sample_t


def sft_loss(model, family, input_ids: torch.Tensor, loss_mask: torch.Tensor,
             attention_mask: torch.Tensor | None = None, *, recipe: NoiseRecipe | None = None,
             t: torch.Tensor | None = None, masked: torch.Tensor | None = None,
             generator: torch.Generator | None = None, normaliser: torch.Tensor | float | None = None,
             return_parts: bool = False):
    """Masked-diffusion SFT loss of a right-padded batch (a float32 scalar).

    input_ids       ``[B, L]`` prompt + response (+ EOS padding), right-padded
    loss_mask       ``[B, L]`` 1 on the positions the family trains on (response tokens and, if the recipe trains
                    on them, the EOS padding); 0 on the prompt and on excluded padding. These are the maskable
                    positions and the answer length of the normaliser.
    attention_mask  ``[B, L]`` 0 on positions excluded from attention (only LLaDA2 excludes pads); None = all 1
    recipe          defaults to ``recipe_for(family)``
    t, masked       fix the noise levels ``[B]`` and/or the masked positions ``[B, L]`` (must lie in loss_mask);
                    ``masked`` needs ``t`` (the weights). Drawn from ``generator`` when not given.
    normaliser      what the loss divides by (``sft_units`` counts it): the rows (``answer_length`` recipes) or the
                    masked tokens (``masked``). Default: this batch's own. A trainer passes the count of the whole
                    optimiser step (every micro-batch, every process, divided by the processes since DDP averages
                    gradients), so the loss does not depend on how the step is split.
    return_parts    also return a dict: t, masked, noisy ids, n_masked / answer_len per row, per-sequence loss
                    (answer_length normaliser) and the per-token weighted CE, for logging and tests.
    """
    recipe = recipe if recipe is not None else recipe_for(family)
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    _check(family, input_ids, loss_mask, attention_mask, t, masked)
    loss_mask = loss_mask.bool()
    if t is None:
        t, masked = sft_noise(family, input_ids, loss_mask, recipe, generator)
    t = t.to(device=input_ids.device, dtype=torch.float32)
    if masked is None:
        _, masked = corrupt(input_ids, loss_mask, t, family.mask_id, generator, recipe.min_one)
    masked = masked.bool()
    noisy = input_ids.masked_fill(masked, family.mask_id)

    clean = input_ids if family.is_block_diffusion else None
    logits = family.logits(model, noisy, attention_mask, clean_ids=clean)
    ce = F.cross_entropy(logits[masked].float(), input_ids[masked], reduction="none")
    token = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
    token = token.index_put((masked,), ce)
    if recipe.weight == "inverse_t":
        token = token / t[:, None]

    answer_len, n_masked = loss_mask.sum(-1), masked.sum(-1)
    if normaliser is None:
        normaliser = sft_units(family, loss_mask, masked, recipe)
    if recipe.normalizer == "answer_length":
        per_seq = token.sum(-1) / answer_len.clamp(min=1)
        loss = per_seq.sum() / normaliser
    else:
        per_seq = token.sum(-1) / n_masked.clamp(min=1)
        loss = token.sum() / torch.as_tensor(normaliser, dtype=torch.float32).clamp(min=1)
    if not return_parts:
        return loss
    return loss, {"t": t, "masked": masked, "noisy": noisy, "n_masked": n_masked, "answer_len": answer_len,
                  "per_seq": per_seq.detach(), "token_loss": token.detach()}


def sft_noise(family, input_ids: torch.Tensor, loss_mask: torch.Tensor, recipe: NoiseRecipe | None = None,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The noise of one SFT batch: levels ``t`` ``[B]`` and the masked positions ``[B, L]`` (within ``loss_mask``),
    drawn from ``generator`` (default: the global RNG) as ``sft_loss`` draws them."""
    recipe = recipe if recipe is not None else recipe_for(family)
    t = sample_t(input_ids.shape[0], recipe, generator, input_ids.device)
    _, masked = corrupt(input_ids, loss_mask.bool(), t, family.mask_id, generator, recipe.min_one)
    return t, masked


def sft_units(family, loss_mask: torch.Tensor, masked: torch.Tensor, recipe: NoiseRecipe | None = None) -> torch.Tensor:
    """What ``sft_loss`` averages over in a batch: its rows (``answer_length`` recipes, a per-sequence mean) or its
    masked tokens (``masked``: LLaDA2's token mean). Counts add up over micro-batches and processes."""
    recipe = recipe if recipe is not None else recipe_for(family)
    if recipe.normalizer == "answer_length":
        return torch.tensor(float(loss_mask.shape[0]), device=loss_mask.device)
    return masked.sum().float()


def _check(family, input_ids, loss_mask, attention_mask, t, masked):
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
    for name, x in (("loss_mask", loss_mask), ("attention_mask", attention_mask), ("masked", masked)):
        if x is not None and x.shape != input_ids.shape:
            raise ValueError(f"{name} shape {tuple(x.shape)} != input_ids shape {tuple(input_ids.shape)}")
    if t is not None and tuple(t.shape) != (input_ids.shape[0],):
        raise ValueError(f"t must have shape [B] = ({input_ids.shape[0]},), got {tuple(t.shape)}")
    if masked is not None and t is None:
        raise ValueError("masked was given without t: the noise levels are needed for the loss weights")
    if not bool(loss_mask.any()):
        raise ValueError("loss_mask is all zero for the whole batch: no response token to learn from "
                         "(prompt fills the row? response truncated away?)")
    if bool((loss_mask.bool() & ~attention_mask.bool()).any()):
        raise ValueError("loss_mask selects positions that attention_mask excludes")
    if family.shift and bool(loss_mask[:, 0].any()):
        raise ValueError(f"{family.name} predicts token i from position i-1: position 0 cannot be in loss_mask "
                         "(every row needs at least one prompt token)")
    if masked is not None and bool((masked.bool() & ~loss_mask.bool()).any()):
        raise ValueError("masked selects positions outside loss_mask (prompt or excluded padding)")
    if t is not None and not bool(((t > 0) & (t <= 1)).all()):
        raise ValueError(f"t must lie in (0, 1], got {t.tolist()}")
