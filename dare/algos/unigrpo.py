"""UniGRPO (MMaDA, Yang et al., arXiv 2505.15809; code: github.com/Gen-Verse/dLLM-RL): GRPO on randomly re-masked
completions, the question kept clean.

MMaDA's UniGRPO scores a completion from copies of it whose answer tokens are hidden at a random mask ratio, the
question never masked, and averages the PPO surrogate over the hidden tokens. Its authors have not released the
MMaDA training code; their RL framework, which post-trains MMaDA and LLaDA-V, implements it as ``random_masking``
(dLLM-RL at 10b4fd1, ``train/rl_mmada.py`` / ``rl_mmada_v.py``, ``configs/rl_mmada_v.yaml`` / ``rl_lladav.yaml``),
which this follows: ``draws`` (``mask_times_per_sample``: 2) copies of each completion, copy j hiding each token up to
and including the first stop (``post_num``: 1) w.p. its own ``t_j ~ U[0.1, 0.9]``, the later padding always hidden and
never scored; per copy the clipped surrogate averaged over its hidden tokens, then the copies averaged; a k3 KL with
beta 0.01 to the policy that decoded the batch, summed over the hidden tokens of a copy; clip 0.2, no dual clip,
group z-score advantages, groups with accuracy outside [0.2, 0.8] left out. Where DARE differs: a copy with no hidden
token counts as a copy (the code drops it: rare, it needs every token kept at t >= 0.1); the copies of one completion
share a forward (the code: one per row).
"""

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..config import one_of
from ..likelihood import RandomMasking
from . import register
from .base import KL_TARGETS, Advantage, Algorithm, DynamicSampling
from .core import clipped_token_loss, kl_estimate, masked_stats


@register("unigrpo")
@dataclass
class UniGRPO(Algorithm):
    """UniGRPO (MMaDA): the surrogate averaged over randomly re-masked answer tokens, the question clean."""

    objective: ClassVar[str] = r"""$$\ell_\theta(i, j, k) = \log\pi_\theta(y_{ik} \mid z_{ij}), \qquad
    z_{ij}: \text{answer token } k \text{ hidden w.p. } t_{ij} \sim U[t_{min}, t_{max}] \;(M_{ijk} = 1)$$

    $$\mathcal{L}(\theta) = \frac{1}{NJ} \sum_{i,j} \Big[-\frac{\sum_k M_{ijk}\, \mathcal{C}(\rho_{ijk}, A_i)}
    {\max(1, \sum_k M_{ijk})} + \beta \sum_k M_{ijk}\, \mathrm{KL}_{k3}(\pi_\theta \,\|\, \pi_{rollout})_{ijk}\Big]$$

    $J$ copies of each completion, the question clean; $\rho_{ijk} = e^{\ell_\theta(i,j,k) -
    \ell_{\theta_{old}}(i,j,k)}$, old and new scored on the same copies."""

    draws: int = 2  # J: re-masked copies of each completion (the code's mask_times_per_sample)
    t_min: float = 0.1  # each copy's mask ratio t ~ U[t_min, t_max] (the code's lower_p, upper_p)
    t_max: float = 0.9
    dual_clip: float | None = None  # the code: none
    beta: float = 0.01  # the code's k3 KL ...
    kl_to: one_of(*KL_TARGETS) = "rollout"  # ... to the rollout policy, summed over a copy's hidden tokens
    advantage: Advantage = "grpo"  # the code: group z-score
    # the code: groups with accuracy above 0.8 or below 0.2 leave the loss (no refill)
    dynamic_sampling: DynamicSampling = field(default_factory=lambda: DynamicSampling(mode="drop", keep="accuracy"))

    def validate(self, family):
        if self.draws < 1 or not 0.0 < self.t_min <= self.t_max <= 1.0:
            raise ValueError(f"unigrpo needs draws >= 1 and 0 < t_min <= t_max <= 1, got {self.draws}, "
                             f"[{self.t_min}, {self.t_max}]")
        return super().validate(family)

    def estimator(self, family, sampling):
        return RandomMasking(self.draws, self.t_min, self.t_max)

    def normaliser(self, family, batch, sampling):
        return (batch["loss_mask"].sum(-1) > 0).sum() * self.draws  # the copies of completions with a scored token

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        noise = batch["noise"][slot]
        estimate = self.score(model, family, batch, noise, sampling)
        logp, hidden = estimate.logp, noise["masks"].to(estimate.logp.dtype)
        old = batch["old"][slot] if "old" in batch else logp.detach()
        ref = old if self.kl_to == "rollout" else batch["ref"][slot] if "ref" in batch else None
        surrogate, engaged = clipped_token_loss(logp, old, batch["advantages"][:, None, None], self.eps_low,
                                                self.eps_high, self.dual_clip)
        per_copy = (surrogate * hidden).sum(-1) / hidden.sum(-1).clamp(min=1)
        stats = {"clip_fraction": engaged, "ratio": torch.exp(logp.detach() - old)}
        if self.beta and ref is not None:
            kl = kl_estimate(logp, ref, self.kl)
            per_copy = per_copy + self.beta * (kl * hidden).sum(-1)
            stats["kl"] = kl.detach()
        stats = masked_stats(stats, hidden) | masked_stats({"entropy": estimate.entropy}, hidden[:, 0])
        return per_copy.sum() / normaliser.clamp(min=1), stats
