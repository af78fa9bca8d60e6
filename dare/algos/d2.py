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

from ..likelihood import Trajectory, decoding_path
from ..sampling import step_budget
from . import register
from .base import Algorithm
from .core import masked_stats


def merged_steps(steps: torch.Tensor, total: int, groups: int) -> torch.Tensor:
    """The group of each recorded step (-1 stays -1: never decoded)."""
    starts = torch.div(torch.arange(1, groups, device=steps.device) * total, groups, rounding_mode="floor")
    return torch.where(steps >= 0, torch.bucketize(steps, starts, right=True), steps)


@register("d2")
@dataclass
class D2(Algorithm):
    """d2 StepMerge: the decoding path's steps merged into N groups, each scored from its starting canvas."""

    needs_sampler: ClassVar[str] = "the step at which each token was decoded (it replays the decoding trajectory)"

    merge_groups: int = 8  # N forwards per sample (capped at the rollout's steps)
    advantage: str = "drgrpo"  # the StepMerge code: r - mean
    loss_mask: str = "upto_first_eos"

    def validate(self, family):
        if self.merge_groups < 1:
            raise ValueError(f"merge_groups must be >= 1, got {self.merge_groups}")
        return super().validate(family)

    def rollout_sampling(self, family, config):
        if config.editing_threshold is not None:
            raise ValueError("d2 replays first-unmask steps; LLaDA2.1 editing overwrites decoded tokens, which a step "
                             "map cannot replay (unset editing_threshold)")
        if config.threshold is not None or config.factor is not None:
            raise ValueError("d2 merges a fixed schedule of steps into groups: use a step schedule, not "
                             "threshold/factor decoding")
        return config

    def streams(self, family, sampling) -> int:
        return min(self.merge_groups, step_budget(sampling, family))

    def estimator(self, family, sampling):
        return Trajectory(self.streams(family, sampling))

    def make_batch(self, family, rollout, rewards, group_size, reward_of, step, sampling):
        batch = super().make_batch(family, rollout, rewards, group_size, reward_of, step, sampling)
        ids, steps, loss_mask = decoding_path(family, rollout, self.loss_mask == "upto_first_eos")
        groups = merged_steps(steps, step_budget(sampling, family), self.streams(family, sampling))
        batch.update(completion_ids=ids, completion_mask=(steps >= 0).long(), steps=groups, loss_mask=loss_mask)
        return batch

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        # a forward even without targets: every rank runs the same number of graphs
        est = self.estimator(family, sampling).score(model, family, batch, {}, step=stream)
        target = (batch["steps"] == stream) & batch["loss_mask"].bool()
        old = batch["old"][slot] if "old" in batch else est.logp.detach()
        ref = batch["ref"][slot] if self.beta else None
        per_token, stats = self.surrogate(est.logp, old, batch["advantages"], ref, est.entropy)
        return (per_token * target).sum() / normaliser.clamp(min=1), masked_stats(stats, target)
