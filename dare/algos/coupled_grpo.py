"""Coupled-GRPO (DiffuCoder, Gong et al., arXiv 2506.20639; algorithms.md §3.2).

GRPO on the coupled estimate: a full-mask pass plus a complementary pair of masks at ``t ~ U[0.2, 0.8]`` weighted
``1/t`` and ``1/(1-t)``, so every completion token is scored exactly once in the pair (three forwards, batched into
one). Paper defaults: leave-one-out advantages, loss up to the first stop, no prompt masking, a fresh ``t`` and
``u`` per inner iteration from a local generator — never the global RNG (the reference reseeds it with 42 every
step, freezing t at 0.5837).
"""

from dataclasses import dataclass

from ..likelihood import Coupled
from . import register
from .base import Advantage, Algorithm


@register("coupled-grpo")
@dataclass
class CoupledGRPO(Algorithm):
    """Coupled-GRPO: complementary-mask pair + full-mask pass."""

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
