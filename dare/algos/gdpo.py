"""GDPO, group diffusion policy optimisation (Rojas et al., arXiv 2510.08554, ICLR 2026; not the multi-reward GDPO
of arXiv 2601.05242).

A sequence-level GRPO whose log-likelihood is the masked-diffusion ELBO
``L(y|q) = int_0^1 (1/t) E_{y_t}[sum_i 1[y_t^i = M] log p(y^i | y_t, q)] dt`` (each token masked with probability
t), estimated by semi-deterministic Monte Carlo (SDMC): the time integral on a fixed N-point Gauss-Legendre grid of
[0, 1], only the masks at each node drawn (K per node). The paper's variance analysis: the time dimension dominates
plain Monte Carlo's variance (the 1/t weight explodes near 0), and 2-3 nodes with one mask each match double MC
with 100+ samples. The ratio of a sequence is ``exp((L - L_old) / |y|)``, PPO-clipped; advantages ``r - mean``.

Where DARE differs from the reference code (NeMo RL's research/gdpo port, built on d1): masks are Bernoulli(t_n) per
token as the paper defines the forward process (the code masks exactly ``max(1, floor(t L))`` tokens but keeps the
``1/t`` weight, biased by the factor ``sum_n w_n k_n / (t_n L)``: 0.94 at L = 10); new masks every inner iteration
(the code seeds them from a hash of the tokens: the same masks for every update); the ratio is per token of the
sequence (NeMo's form; the paper's page writes the raw ``exp(L - L_old)``: the same gradient on-policy). The paper
trains LLaDA; the ELBO reaches every family (block families: one global t per node, every block masked at it, one
``[x_t ‖ x_0]`` forward per draw).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..likelihood import QuadratureElbo
from . import register
from .base import Advantage, LossMask, SequenceLevel
from .core import clipped_ratio_loss, kl_estimate


@register("gdpo")
@dataclass
class GDPO(SequenceLevel):
    """GDPO: sequence-level ratio of the SDMC (Gauss-Legendre) ELBO."""

    objective: ClassVar[str] = r"""$$\hat{\mathcal{E}}_\theta(y) = \sum_{n=1}^{N} \frac{w_n}{t_n}
    \frac{1}{K}\sum_{j=1}^{K} \sum_{k} \mathbb{1}[z^{(nj)}_k = M] \log p_\theta(y_k \mid z^{(nj)})$$

    $$r_i = \exp\frac{\hat{\mathcal{E}}_\theta(y_i) - \hat{\mathcal{E}}_{\theta_{old}}(y_i)}{|y_i|}$$

    $$\mathcal{L}(\theta) = -\frac{1}{\sum_{i,k} m_{ik}} \sum_{i,k} m_{ik}\, \mathcal{C}(r_i, A_i)$$

    $(t_n, w_n)$: Gauss-Legendre nodes and weights of $[0, 1]$; $z^{(nj)}$ masks each token with probability $t_n$."""

    noises: ClassVar[tuple[str, ...]] = ("mask", "uniform")

    points: int = 3  # quadrature nodes of the time integral (the paper: 2-3; its published recipe: 3)
    per_point: int = 1  # masks drawn per node (forwards per ELBO = points x per_point)
    advantage: Advantage = "drgrpo"  # paper: r - mean
    loss_mask: LossMask = "upto_first_eos"
    dual_clip: float | None = None

    def validate(self, family):
        if not 1 <= self.points <= 16 or self.per_point < 1:
            raise ValueError(f"points must be in 1..16 and per_point >= 1, got {self.points}, {self.per_point}")
        return super().validate(family)

    def estimator(self, family, sampling):
        return QuadratureElbo(points=self.points, per_point=self.per_point)

    def sequence_loss(self, value, old, ref, batch):
        ratio = torch.exp(value - old)  # value = ELBO / L
        loss, engaged = clipped_ratio_loss(ratio, batch["advantages"], self.eps_low, self.eps_high, self.dual_clip)
        stats = {"clip_fraction": engaged, "ratio": ratio}
        if self.beta:
            kl = kl_estimate(value, ref, self.kl)
            loss = loss + self.beta * kl
            stats["kl"] = kl
        return loss, stats
