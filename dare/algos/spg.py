"""SPG (Sandwiched Policy Gradient, arXiv 2510.09541; algorithms.md §3.7).

REINFORCE on a bound of the sequence log-likelihood, no ratio and no clipping: the lower bound (mean masked
log-prob) for sequences with A > 0, the upper bound (Renyi-type, beta) mixed with the lower one for A <= 0, so
``A x bound`` stays below ``A x log-likelihood`` on both sides. Masks: a random block of the completion partly
masked, later blocks fully masked, everything else masked with probability 0.15. Paper defaults: mean-centred
advantages, loss up to the first stop; inner iterations are separate optimiser steps with fresh masks (the
reference instead sums them into one step).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..likelihood import Sandwich
from . import register
from .base import Advantage, Algorithm


@register("spg")
@dataclass
class SPG(Algorithm):
    """SPG: lower bound for A > 0, upper / mixed bound for A <= 0, no ratio."""

    samples: int = 2  # mask draws per sequence (paper num_t 2; the reference 1)
    block_length: int = 32  # block of the block-random masks (masked-diffusion families; block families: their own)
    renyi_beta: float = 1.5  # order of the upper bound (paper: 1.0 for sudoku)
    upper_weight: float = 0.5  # A <= 0 uses upper_weight * upper + (1 - upper_weight) * lower (1: pure upper bound)
    p_prompt: float = 0.15
    advantage: Advantage = "drgrpo"

    uses_ratio: ClassVar[bool] = False

    def validate(self, family):
        if self.renyi_beta <= 0 or not 0.0 <= self.upper_weight <= 1.0:
            raise ValueError(f"need renyi_beta > 0 and upper_weight in [0, 1], got {self.renyi_beta}, "
                             f"{self.upper_weight}")
        if self.beta:
            raise ValueError("spg has no KL term: beta must be 0")
        return super().validate(family)

    def estimator(self, family, sampling):
        return Sandwich(self.samples, self.block_length, self.renyi_beta, self.upper_weight, self.p_prompt)

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        bounds = self.score(model, family, batch, batch["noise"][slot], sampling).logp  # [N, 2]: lower, upper/mix
        adv = batch["advantages"]
        value = torch.where(adv > 0, bounds[:, 0], bounds[:, 1])
        tokens = batch["loss_mask"].sum(-1).to(value.dtype)
        loss = -(adv * tokens * value).sum() / normaliser.clamp(min=1)
        count = torch.tensor(float(len(adv)))
        return loss, {"bound_lower": (bounds[:, 0].detach().sum(), count),
                      "bound_upper": (bounds[:, 1].detach().sum(), count)}
