"""BGPO (Boundary-Guided Policy Optimization, arXiv 2510.11683; algorithms.md §3.6).

K stratified MC samples of the sequence ELBO (per token of the completion); per sample j a linearised ratio
``rho_j = 1 + Delta_j`` for A > 0 and ``exp(Delta_j)`` otherwise (Delta_j = e_j - e_j^old), each dual-clipped like a
PPO token and averaged over j. The objective is linear in the samples, so they are backpropagated one at a time
(``stream``): memory does not grow with K. ``1 + Delta`` is used directly (the reference's ``exp(log(1 + Delta))``
is NaN once Delta <= -1). Each sequence weighs by its number of loss tokens (the reference's token mean of a
per-sequence constant).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..likelihood import MCElbo
from . import register
from .base import Algorithm, LossMask
from .core import clipped_ratio_loss


@register("bgpo")
@dataclass
class BGPO(Algorithm):
    """BGPO: linearised per-sample ELBO ratios, streamed over K MC samples."""

    objective: ClassVar[str] = r"""$$\Delta_{ij} = \frac{E_j(\theta) - E_j(\theta_{old})}{L_i}$$

    $$\rho_{ij} = \begin{cases} 1 + \Delta_{ij} & A_i > 0 \\ e^{\Delta_{ij}} & A_i \le 0 \end{cases}$$

    $$\mathcal{L}(\theta) = -\frac{1}{K} \sum_{j=1}^{K} \operatorname{mean}_i\, \mathcal{C}(\rho_{ij}, A_i)$$

    $E_j = \sum_{k \in M_j} \log p_\theta(y_k \mid z_j) / p_j$ with stratified mask counts ($p_j = x_j / L$): linear in
    each Monte-Carlo sample, so the $K$ samples are back-propagated one at a time (memory of one)."""

    samples: int = 16  # K: MC samples of the ELBO
    stream: bool = True  # backpropagate one sample at a time (constant memory in K)
    loss_mask: LossMask = "all"  # the reference's masked-diffusion rollouts train the whole canvas

    def streams(self, family, sampling) -> int:
        return self.samples if self.stream else 1

    def estimator(self, family, sampling):
        return MCElbo(self.samples)

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        draws = None if self.streams(family, sampling) == 1 else stream
        value = self.estimator(family, sampling).score(model, family, batch, batch["noise"][slot], draw=draws).logp
        if "old" in batch:
            old = batch["old"][slot] if draws is None else batch["old"][slot][:, draws:draws + 1]
        else:
            old = value.detach()
        delta, adv = value - old, batch["advantages"][:, None]
        ratio = torch.where(adv > 0, 1 + delta, torch.exp(delta))
        per_sample, engaged = clipped_ratio_loss(ratio, adv, self.eps_low, self.eps_high, self.dual_clip)
        tokens = batch["loss_mask"].sum(-1, keepdim=True).to(per_sample.dtype)
        loss = (per_sample * tokens).sum() / normaliser.clamp(min=1) / self.samples
        stats = {"clip_fraction": ((engaged * tokens).sum(), tokens.sum() * engaged.shape[1]),
                 "ratio": ((ratio.detach() * tokens).sum(), tokens.sum() * ratio.shape[1])}
        return loss, stats
