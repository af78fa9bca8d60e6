"""ESPO (ELBO-based Sequence-level Policy Optimization, arXiv 2512.03759; algorithms.md §3.11).

The whole completion is one action: ratio ``exp((ELBO - ELBO_old) / L)`` of a per-token-normalised sequence ELBO
(mask counts stratified across the batch in [0, L], the complementary positions scored in a second forward),
PPO-clipped per sequence, k2 KL on the raw ELBOs, leave-one-out advantages, ``num_iterations`` optimiser steps per
rollout, each on its own pre-drawn masks.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..likelihood import SequenceElbo
from . import register
from .base import KL, Advantage, LossMask, SequenceLevel
from .core import clipped_ratio_loss


@register("espo")
@dataclass
class ESPO(SequenceLevel):
    """ESPO: sequence-level ratio of the normalised ELBO."""

    objective: ClassVar[str] = r"""$$s_i = \frac{\bar E_i}{L}$$

    $$r_i = e^{s_i(\theta) - s_i(\theta_{old})}$$

    $$\mathcal{L}(\theta) = \operatorname{mean}_i \max\big(-A_i r_i,\, -A_i \operatorname{clip}(r_i, 1 - \epsilon, 1 +
    \epsilon)\big)
    + \beta\, \operatorname{mean}_i \frac{(\bar E_i - \bar E_{ref,i})^2}{2L}$$

    $\bar E$: the ELBO over $K$ draws whose mask counts are stratified across the batch, each with its complementary
    half; the whole sequence is one action."""

    samples: int = 2  # MC samples of the ELBO per inner iteration (each two forwards with `coupled`)
    coupled: bool = True  # score the complementary positions too (the reference's reduce_var)
    num_iterations: int = 8
    beta: float = 1e-3  # k2 on the raw ELBO, divided by L (math; code 1e-2, countdown 3e-3, sudoku 1e-2)
    kl: KL = "k2"
    advantage: Advantage = "rloo"
    loss_mask: LossMask = "all"
    dual_clip: float | None = None

    def validate(self, family):
        if self.kl != "k2":
            raise ValueError("espo's KL is k2 on the raw ELBO: set kl: k2")
        return super().validate(family)

    def estimator(self, family, sampling):
        return SequenceElbo(self.samples, self.coupled)

    def sequence_loss(self, value, old, ref, batch):
        ratio = torch.exp(value - old)  # value = ELBO / L
        loss, engaged = clipped_ratio_loss(ratio, batch["advantages"], self.eps_low, self.eps_high, self.dual_clip)
        stats = {"clip_fraction": engaged, "ratio": ratio}
        if self.beta:
            length = batch["loss_mask"].sum(-1).clamp(min=1).to(value.dtype)
            kl = 0.5 * (length * (value - ref)) ** 2 / length
            loss = loss + self.beta * kl
            stats["kl"] = kl
        return loss, stats
