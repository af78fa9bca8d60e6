"""VRPO (LLaDA 1.5, arXiv 2505.19223; algorithms.md §3.3): offline DPO on fixed (prompt, chosen, rejected) pairs with
each log-likelihood replaced by a K-sample ELBO, variance-reduced as the paper says: one mask per timestep, the K mask
counts stratified over 1..L, and antithetic sampling (the policy and the reference score a response under the same
masks, so at theta = ref the margin is exactly 0). Chosen and rejected draw independently.

    B(y)  = (1/K) sum_j (L / x_j) sum_{k masked in draw j} log p(y_k | z_j)      (prompt and padding never masked)
    loss  = -log sigmoid(beta [(B_theta(y_w) - B_ref(y_w)) - (B_theta(y_l) - B_ref(y_l))]),  mean over pairs

``normalise="padded_length"`` divides each B by the padded response length R first, as DARE does (finding 8:
beta_eff = beta / R); the default is the paper's unnormalised ELBO. No rollout, no reward, no ratio: trained by
``dare.trainers.preference`` (``train_rl.py --algo vrpo``). The ELBO goes through ``Family.logits``, so block
families (the ``[x_t ‖ x_0]`` layout) are supported too (DARE: LLaDA and Dream only).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..config import check_choices, one_of
from ..likelihood import MCElbo
from . import register
from .base import Declared

NORMALISE = ("none", "padded_length")


@register("vrpo")
@dataclass
class VRPO(Declared):
    """VRPO: DPO on stratified K-sample ELBOs with masks shared by the policy and the reference (offline pairs)."""

    objective: ClassVar[str] = r"""$$\mathcal{L}(\theta) = -\log\sigma\Big(\beta\big[(\hat B_\theta(y_w) - \hat
    B_{ref}(y_w)) - (\hat B_\theta(y_l) - \hat B_{ref}(y_l))\big]\Big)$$

    $$\hat B(y) = \frac{1}{K}\sum_{j=1}^{K} \frac{L}{x_j} \sum_{k \in M_j} \log p(y_k \mid z_j)$$

    $x_j$: stratified mask counts over $[1, L]$, $M_j$ a uniform subset of that size; the same masks score the policy
    and the reference (antithetic: at $\theta = \theta_{ref}$ the margin is exactly 0)."""

    beta: float = 0.2  # DPO beta (DARE 0.2)
    samples: int = 4  # K: masks per response, one per stratified timestep (DARE mc_num 4)
    normalise: one_of(*NORMALISE) = "none"  # none: the paper's ELBO | padded_length: each ELBO / R (DARE, finding 8)
    stream: bool = True  # one draw's activations alive at a time (recomputed in backward); False: all K in one graph

    trainer: ClassVar[str] = "preference"  # fixed pairs instead of rollouts (dare.trainers.preference)
    uses_ratio: ClassVar[bool] = False
    advantage: ClassVar[str] = "dpo"  # what the algorithm matrix shows: no advantage, a DPO logit
    loss_mask: ClassVar[str] = "all"  # every valid response token is maskable

    def validate(self, family) -> "VRPO":
        self.check_family(family)
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        check_choices(self)
        return self

    def estimator(self, family, sampling=None) -> MCElbo:
        """``sampling`` is unused: there is no rollout."""
        return MCElbo(self.samples, per_token=False)

    def corrupt(self, family, batch: dict, generators: list[torch.Generator]) -> dict:
        """Masks ``[N, K, R]`` and ``p`` ``[N, K]``; row i is drawn from ``generators[i]`` on its own valid tokens, so
        its masks depend neither on the other rows nor on the padding (hence not on the micro-batch size)."""
        valid = batch["loss_mask"].bool()
        masks = torch.zeros(len(valid), self.samples, valid.shape[1], dtype=torch.bool)
        p = torch.zeros(len(valid), self.samples, dtype=torch.float64)  # float64: the weights L / x_j exact
        for i, generator in enumerate(generators):
            length = int(valid[i].sum())
            row = {"loss_mask": torch.ones(1, length, dtype=torch.long)}
            drawn = self.estimator(family).corrupt(family, row, generator)
            masks[i][:, valid[i].cpu()] = drawn["masks"][0]
            p[i] = drawn["masks"][0].sum(-1).double() / max(length, 1)  # an empty response: 0, not NaN
        return {"masks": masks.to(valid.device), "p": p.to(valid.device)}

    def elbo(self, model, family, batch: dict, noise: dict) -> torch.Tensor:
        """``B(y)`` per row ``[N]`` (divided by ``batch["padded_length"]`` under ``normalise="padded_length"``). With
        ``stream`` and gradients on, each draw is a checkpointed segment: the forward keeps no activations and the
        backward recomputes one draw at a time, so memory does not grow with K (one extra forward per draw)."""
        estimator = self.estimator(family)
        if self.stream and torch.is_grad_enabled():
            draws = [checkpoint(lambda j=j: estimator.score(model, family, batch, noise, draw=j).logp[:, 0],
                                use_reentrant=False) for j in range(self.samples)]
            value = torch.stack(draws, -1).mean(-1)
        else:
            value = estimator.score(model, family, batch, noise).logp.mean(-1)
        return value / batch["padded_length"].to(value.dtype) if self.normalise == "padded_length" else value

    def loss(self, policy: torch.Tensor, reference: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """Per-pair DPO losses ``[m]`` from the ELBOs ``[2m]`` (chosen rows first) and per-pair metrics."""
        pairs = len(policy) // 2
        log_ratio = policy - reference.detach()
        chosen, rejected = log_ratio[:pairs], log_ratio[pairs:]
        margin = chosen - rejected
        stats = {"margin": margin, "accuracy": (margin > 0).float(), "rewards/chosen": self.beta * chosen,
                 "rewards/rejected": self.beta * rejected, "elbo/chosen": policy[:pairs],
                 "elbo/rejected": policy[pairs:]}
        return -F.logsigmoid(self.beta * margin), {k: v.detach() for k, v in stats.items()}
