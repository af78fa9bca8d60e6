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

    objective: ClassVar[str] = r"""$$\mathcal{L}(\theta) = -\frac{\sum_i A_i L_i\, \hat\ell_i}{\sum_i L_i}$$

    $$\hat\ell_i = \begin{cases} E_i & A_i > 0 \\ w\, U_i + (1 - w)\, E_i & A_i \le 0 \end{cases}$$

    $$E_i = \frac{1}{J}\sum_{j} \operatorname{mean}_{k \in M_j} \log p_\theta(y_k \mid z_j)$$

    $$U_i = \frac{1}{\beta}\operatorname{mean}_k \log \frac{1}{J}\sum_{j}
    \frac{\mathbb{1}[k \in M_j]\, p_\theta(y_k \mid z_j)^{\beta}}{\hat t_j}$$

    A lower bound where the advantage is positive, an upper (or mixed) bound where it is not: no ratio, no clip. $z_j$:
    a block-wise random mask (clean earlier blocks, a partly masked block, masked later ones)."""

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
