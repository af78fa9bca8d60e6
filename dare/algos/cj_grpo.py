"""CJ-GRPO, consistency-trajectory GRPO (arXiv 2509.23924; algorithms.md §3.5, models-and-sampling.md §4.8).

The likelihood is the rollout's own decoding path: step s of the sampler committed some tokens from a state
where exactly the tokens of steps < s were visible; training replays that state and scores those tokens, so the
learner's transitions are the sampler's ("consistency"). One forward per step, streamed (one step's graph at a
time). Masked families replay global steps (state = prompt + tokens of earlier steps); block families replay
block-local step j in every block at once through the ``[x_t ‖ x_0]`` layout (block b's noisy copy shows its
tokens of local steps < j, the clean copy gives the finished earlier blocks, as the block cache did), and keep
the whole block of the stop token and the whole last block (their tokens past the stop or past gen_length were
decoded and seen). Never mixing the two step numberings is what the reference gets wrong (spec finding 1). The
paper's EOS early rejection and ascending step sizes are sampler options: ``--rollout.eos-early-rejection 0.01
--rollout.schedule ascending``.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import one_of
from ..likelihood import trajectory_blocks
from ..sampling import step_budget
from . import register
from .base import Advantage, LossMask, StepGroups

AGGREGATIONS = ("step", "transition")


@register("cj-grpo")
@dataclass
class CJGRPO(StepGroups):
    """CJ-GRPO: exact per-step transition log-probs along the recorded decoding trajectory."""

    objective: ClassVar[str] = r"""$$\mathcal{L}(\theta) = -\frac{1}{S} \sum_{s=1}^{S} \frac{1}{\sum_{i,k} U_{isk}}
    \sum_{i,k} U_{isk}\, \mathcal{C}(\rho_{isk}, A_i)$$

    $$\rho_{isk} = \frac{\pi_\theta(y_{ik} \mid z_{i,s})}{\pi_{\theta_{old}}(y_{ik} \mid z_{i,s})}$$

    $U_{isk} = 1$ when token $k$ of row $i$ was committed at decoding step $s$; $z_{i,s}$: the canvas the sampler saw
    before step $s$ (the exact trajectory likelihood, one forward per step; block families replay block-local step $s$
    of every block at once)."""

    advantage: Advantage = "drgrpo"  # paper: r - mean (DARE: grpo with std)
    loss_mask: LossMask = "all"  # every decoded token is an action, the EOS tail included (paper and DARE)
    # step: token mean per step, averaged over steps (paper) | transition: every sample's (block, step) transitions
    # weigh 1 in all, mean over samples (DARE's block families)
    aggregation: one_of(*AGGREGATIONS) = "step"

    def streams(self, family, sampling) -> int:
        return step_budget(sampling, family)  # one per decoding step (block families: per step of a block)

    def groups(self, steps, family, sampling):
        return steps  # every step its own group

    def make_batch(self, family, rollout, rewards, group_size, reward_of, step, sampling):
        batch = super().make_batch(family, rollout, rewards, group_size, reward_of, step, sampling)
        if self.aggregation == "transition":
            batch["weights"] = self._transition_weights(family, batch, self.streams(family, sampling))
        return batch

    def _transition_weights(self, family, batch, steps_per_block: int):
        """1 / (tokens of the token's (block, step) transition) / (transitions of its sample), on loss tokens."""
        steps, mask = batch["steps"], batch["loss_mask"].bool()
        block = trajectory_blocks(family, batch)  # blocks on the global grid; one for masked families
        key = (block * (steps_per_block + 1) + steps.clamp(min=0)) * mask
        counts = torch.zeros(len(steps), int(key.max()) + 1, device=steps.device).scatter_add_(1, key, mask.float())
        transitions = (counts > 0).sum(-1, keepdim=True).clamp(min=1)
        return torch.where(mask, 1.0 / (counts.gather(1, key) * transitions).clamp(min=1), 0.0)

    def normaliser(self, family, batch, sampling):
        mask = batch["loss_mask"].bool()
        if self.aggregation == "transition":
            return mask.any(-1).sum()
        steps = self.streams(family, sampling)
        return torch.bincount(batch["steps"][mask], minlength=steps)[:steps]

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        per_token, target, stats = self.group_surrogate(model, family, batch, slot, stream, sampling)
        if self.aggregation == "transition":
            loss = (per_token * batch["weights"] * target).sum() / normaliser.clamp(min=1)
        else:  # token mean of this step over the whole batch, averaged over the steps that exist
            loss = (per_token * target).sum() / normaliser[stream].clamp(min=1) / (normaliser > 0).sum().clamp(min=1)
        return loss, stats
