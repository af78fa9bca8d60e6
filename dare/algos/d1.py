"""d1 / diffu-GRPO (Zhao et al., arXiv 2504.12216; algorithms.md §3.1).

GRPO on the one-step mean-field log-likelihood: the whole completion masked, real prompt tokens masked with
probability ``p_prompt``, one forward per inner iteration. Paper defaults where DARE differs: mean-centred
advantages (no std), loss on tokens up to the first stop token, a new prompt mask per inner iteration, old and
reference log-probs under the same mask. Block families go through the ``[x_t ‖ x_0]`` layout.
"""

from dataclasses import dataclass
from typing import ClassVar

from ..likelihood import MeanField
from . import register
from .base import Advantage, Algorithm, LossMask


@register("d1")
@dataclass
class D1(Algorithm):
    """d1 (diffu-GRPO): one-step mean-field estimate with random prompt masking."""

    objective: ClassVar[str] = r"""$$\mathcal{L}(\theta) = -\frac{1}{\sum_{i,k} m_{ik}} \sum_{i=1}^{G} \sum_{k} m_{ik}\,
    \mathcal{C}(\rho_{ik}, A_i)$$

    $$\rho_{ik} = \frac{\pi_\theta(y_{ik} \mid z_i)}{\pi_{\theta_{old}}(y_{ik} \mid z_i)}$$

    $z_i$: the whole completion masked and each real prompt token masked with probability $p_{prompt}$, one forward (the
    one-step mean-field estimate)."""

    noises: ClassVar[tuple[str, ...]] = ("mask", "uniform")

    p_prompt: float = 0.15  # probability of masking each real prompt token
    advantage: Advantage = "drgrpo"  # paper: r - mean (DARE: grpo with std)
    loss_mask: LossMask = "upto_first_eos"  # paper: completion up to and including the first stop (DARE: "all")

    def validate(self, family):
        if not 0.0 <= self.p_prompt < 1.0:
            raise ValueError(f"p_prompt must be in [0, 1), got {self.p_prompt}")
        return super().validate(family)

    def estimator(self, family, sampling):
        return MeanField(self.p_prompt)
