"""Coupled-GRPO (DiffuCoder, Gong et al., arXiv 2506.20639; algorithms.md §3.2).

GRPO on the coupled estimate: a full-mask pass plus a complementary pair of masks at ``t ~ U[0.2, 0.8]`` weighted
``1/t`` and ``1/(1-t)``, so every completion token is scored exactly once in the pair (three forwards, batched into
one). Paper defaults: leave-one-out advantages, loss up to the first stop, no prompt masking, a fresh ``t`` and
``u`` per inner iteration from a local generator — never the global RNG (the reference reseeds it with 42 every
step, freezing t at 0.5837).
"""

from dataclasses import dataclass
from typing import ClassVar

from ..likelihood import Coupled
from . import register
from .base import Advantage, Algorithm


@register("coupled-grpo")
@dataclass
class CoupledGRPO(Algorithm):
    """Coupled-GRPO: complementary-mask pair + full-mask pass."""

    objective: ClassVar[str] = r"""$$\hat\ell_\theta(k) = \frac{1}{2}\Big[\log\pi_\theta(y_k \mid z^{full}) +
    \frac{\mathbb{1}[u_k < t]}{t}\log\pi_\theta(y_k \mid z^{a})
    + \frac{\mathbb{1}[u_k > t]}{1 - t}\log\pi_\theta(y_k \mid z^{b})\Big]$$

    $$\mathcal{L}(\theta) = -\frac{1}{\sum_{i,k} m_{ik}} \sum_{i,k} m_{ik}\,
    \mathcal{C}\big(e^{\hat\ell_\theta(i,k) - \hat\ell_{\theta_{old}}(i,k)}, A_i\big)$$

    $t \sim U(0.2, 0.8)$, $u_k \sim U[0, 1)$; $z^{full}$ masks the whole completion, $z^{a}$ the tokens with $u_k < t$
    and $z^{b}$ their complement: every token is scored once in $z^a$ or $z^b$ (the coupling)."""

    t_min: float = 0.2  # the pair's mask ratio t ~ U[t_min, t_max]
    t_max: float = 0.8
    p_prompt: float = 0.0  # probability of masking each prompt token (paper recipe: 0)
    advantage: Advantage = "rloo"  # paper: leave-one-out, no std (DARE: grpo)

    def validate(self, family):
        if not 0.0 < self.t_min <= self.t_max < 1.0:
            raise ValueError(f"need 0 < t_min <= t_max < 1, got [{self.t_min}, {self.t_max}]")
        return super().validate(family)

    def estimator(self, family, sampling):
        return Coupled(self.t_min, self.t_max, self.p_prompt)
