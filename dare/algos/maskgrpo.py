"""MaskGRPO (Ma et al., arXiv 2510.02880, ICLR 2026; code: github.com/martian422/MaskGRPO): GRPO whose importance
ratios come from the completion re-masked at a ratio that grows with the inner iteration, the question clean.

As the authors' text recipe (``scripts/train/t2t_grpo_train.sh``, ``grpo/mask_grpo_trainer.py``, version ``uni``):
at inner iteration i of mu the completion is re-masked at ratio ``r_i = min(c + (1 - c)(i + 1) / mu, 0.999)``
(``min_mask_rate`` c = 0.6, mu = 12), one draw shared by the old, reference and current policy; the AR-like
("fading") re-masking keeps position j of R w.p. ``min(1, 2 (1 - r_i)(1 - j / (R - 1)))``, so the late tokens are
hidden most (``remasking: random``: each token w.p. r_i, UniGRPO's way). Per-token log-probabilities of the hidden
tokens, the token-level clipped surrogate plus a k3 KL to the reference (beta 0.01), clip 0.2, no dual clip, averaged
over the hidden tokens; group z-score advantages. The code re-masks the whole generated canvas (the tokens after
the stop included: ``loss_mask: all``) and averages over the hidden tokens of each micro-batch; DARE over those of the
whole mini-batch (the same when it is one micro-batch). Not taken: its periodic copy of the policy into the
reference (TRL's ``ref_model_sync_steps``: 64).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import one_of
from ..likelihood import Remasking
from . import register
from .base import Advantage, Algorithm, LossMask
from .core import masked_stats, token_mean


@register("maskgrpo")
@dataclass
class MaskGRPO(Algorithm):
    """MaskGRPO: ratios from the completion re-masked ever more with each inner iteration (fading, AR-like)."""

    objective: ClassVar[str] = r"""$$r_i = \min\Big(c + (1 - c)\frac{i + 1}{\mu},\ 0.999\Big), \qquad
    P(\text{keep } k) = \min\Big(1,\ 2(1 - r_i)\big(1 - \tfrac{k}{R - 1}\big)\Big)$$

    $$\mathcal{L}_i(\theta) = \frac{1}{\sum M} \sum_{n,k} M_{nk} \Big[-\mathcal{C}(\rho_{nk}, A_n) + \beta\,
    \mathrm{KL}_{k3}(\pi_\theta \,\|\, \pi_{ref})_{nk}\Big]$$

    Inner iteration $i$ of $\mu$ hides the completion tokens $M$ (fading: the later, the likelier hidden; the question
    clean); $\rho_{nk} = \pi_\theta(y_{nk} \mid z_n) / \pi_{\theta_{old}}(y_{nk} \mid z_n)$ on the same $z_n$."""

    min_mask_rate: float = 0.6  # c: the mask ratio's start (the authors' text script: 0.6; rl.yaml 0.5)
    remasking: one_of("fading", "random") = "fading"  # the authors' arlike (text) | random (UniGRPO's)
    num_iterations: int = 12  # mu: the authors' text script
    dual_clip: float | None = None  # the code: none
    beta: float = 0.01  # the code's k3 KL to the reference
    advantage: Advantage = "grpo"  # the code: (r - mean) / (std + 1e-5)
    loss_mask: LossMask = "all"  # the code re-masks the whole generated canvas

    def validate(self, family):
        if not 0.0 <= self.min_mask_rate < 1.0:
            raise ValueError(f"min_mask_rate must be in [0, 1), got {self.min_mask_rate}")
        if not self.resample_noise:
            raise ValueError("maskgrpo re-masks more at each inner iteration: resample_noise must stay true")
        return super().validate(family)

    def ratio(self, iteration: int) -> float:
        """The mask ratio of inner iteration ``iteration`` (0-based)."""
        c = self.min_mask_rate
        return min(c + (1 - c) * (iteration + 1) / self.num_iterations, 0.999)

    def estimator(self, family, sampling, iteration: int = 0):
        return Remasking(self.ratio(iteration), self.remasking == "fading")

    def corrupt(self, family, batch, generator, sampling, iteration=0):
        return self.estimator(family, sampling, iteration).corrupt(family, batch, generator)

    def normaliser(self, family, batch, sampling):
        """The hidden tokens of each inner iteration's draw (a vector over iterations)."""
        return torch.stack([noise["masks"].sum() for noise in batch["noise"]])

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        noise = batch["noise"][slot]
        estimate = self.score(model, family, batch, noise, sampling)
        old = batch["old"][slot] if "old" in batch else estimate.logp.detach()
        ref = batch["ref"][slot] if "ref" in batch else None
        per_token, stats = self.surrogate(estimate.logp, old, batch["advantages"], ref, estimate.entropy)
        hidden = noise["masks"][:, 0]
        total = normaliser.reshape(-1)[slot] if normaliser.numel() > 1 else normaliser
        return token_mean(per_token, hidden, total), masked_stats(stats, hidden.to(per_token.dtype))
