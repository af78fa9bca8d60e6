"""d2 StepMerge (Wang et al., arXiv 2509.21474; code: github.com/kuleshov-group/d2): the trajectory likelihood of
the sampler actually used, at a cost the user chooses.

The S steps of the rollout's decoding path are cut into N contiguous groups, group n holding the steps
``[floor(n S / N), floor((n+1) S / N))`` (the authors' boundaries). Every token committed in group n is scored from
the canvas at the start of that group (the tokens of earlier groups visible, the rest masked): N forwards instead of
CJ-GRPO's S. ``merge_groups = S`` is the exact per-step trajectory likelihood (CJ-GRPO's replay); ``merge_groups = 1``
is d1's one-step mean-field estimate with the prompt unmasked. The loss is GRPO's token-level clipped surrogate,
a token mean over the whole batch (the N streams add up to it). Block families merge the block-local steps, every
block at once, as CJ-GRPO replays them.

Where DARE differs from the authors' code: the prompt stays unmasked when scoring (the paper's text; the code still
masks 15 % of it, a leftover of d1); the loss is a token mean over the batch (the code's is per prompt group because of
its batch layout). d2's AnyOrder variant needs a model trained to decode in a causal any-order layout and its own
sampler; no DARE family is such a model, so it is not here.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..sampling import step_budget
from . import register
from .base import Advantage, LossMask, StepGroups


def merged_steps(steps: torch.Tensor, total: int, groups: int) -> torch.Tensor:
    """The group of each recorded step (-1 stays -1: never decoded)."""
    starts = torch.div(torch.arange(1, groups, device=steps.device) * total, groups, rounding_mode="floor")
    return torch.where(steps >= 0, torch.bucketize(steps, starts, right=True), steps)


@register("d2")
@dataclass
class D2(StepGroups):
    """d2 StepMerge: the decoding path's steps merged into N groups, each scored from its starting canvas."""

    objective: ClassVar[str] = r"""$$\ell_\theta(i, k) = \log\pi_\theta\big(y_{ik} \mid z_{i, n(k)}\big)$$

    $$n(k) = \Big\lfloor \frac{N\, s(k)}{S} \Big\rfloor\text{-th group}$$

    $$\mathcal{L}(\theta) = -\frac{1}{\sum m} \sum_{i,k} m_{ik}\, \mathcal{C}(\rho_{ik}, A_i)$$

    The $S$ decoding steps cut into $N$ contiguous groups $[\lfloor nS/N \rfloor, \lfloor (n+1)S/N \rfloor)$; token $k$,
    committed at step $s(k)$, is scored from the canvas $z_{i,n}$ at the start of its group: $N$ forwards ($N = S$:
    CJ-GRPO's replay)."""

    merge_groups: int = 8  # N forwards per sample (capped at the rollout's steps)
    advantage: Advantage = "drgrpo"  # the StepMerge code: r - mean
    loss_mask: LossMask = "upto_first_eos"

    def validate(self, family):
        if self.merge_groups < 1:
            raise ValueError(f"merge_groups must be >= 1, got {self.merge_groups}")
        return super().validate(family)

    def rollout_sampling(self, family, config):
        if config.threshold is not None or config.factor is not None:
            raise ValueError("d2 merges a fixed schedule of steps into groups: use a step schedule, not "
                             "threshold/factor decoding")
        return super().rollout_sampling(family, config)

    def streams(self, family, sampling) -> int:
        return min(self.merge_groups, step_budget(sampling, family))

    def groups(self, steps, family, sampling):
        return merged_steps(steps, step_budget(sampling, family), self.streams(family, sampling))
