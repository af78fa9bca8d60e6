"""AGRPO, amortised group relative policy optimisation (arXiv 2510.04019, ICML 2026; code:
github.com/probablyabot/agrpo): an unbiased Monte-Carlo policy gradient over the real decoding trajectory.

A rollout's decoding is a sequence of steps; step t committed the tokens ``U_t`` from the canvas ``z_t`` (the tokens
of earlier steps visible). With positions chosen independently of the parameters (random unmasking), the trajectory's
log-probability is ``sum_t sum_{k in U_t} log pi(y_k | z_t)`` under the sampler's own distribution (its temperature
and banned tokens). Instead of CJ-GRPO's forward per step, each of K draws picks one step per row uniformly and scores
that step's tokens only, weighted so the estimate is unbiased: for the mean over the row's T steps (the authors'
objective: ``(1/T) sum_t``, a per-sequence mean) or, with ``step_weight="sum"``, for the full sum (the trajectory's
log-probability). Each token of a drawn step has GRPO's token-level clipped surrogate with advantage ``r - mean``; the
loss is ``(1/K) sum_j`` over draws, averaged over rows. Block families (a DARE extension; the paper trains LLaDA)
draw one block-local step in every block and replay all of them in one ``[x_t ‖ x_0]`` forward.

Where DARE differs from the authors' code: every recorded step can be drawn (the code stops at the last step that
committed a non-EOS token, so EOS-only steps the model chose are never trained); draws are independent uniform ones
(the code's entropy-proportional proposal needs per-token entropies the sampler does not record, and its
low-discrepancy draws only stratify); the ratio of the first pass is exactly 1 (old log-probs are the detached
current ones, not the sampler's float32 ones); the loss is averaged over rows, not divided by the group size; top-k /
top-p are not applied when scoring (the tempered distribution over the whole vocabulary, as JustGRPO). Position
choices by confidence depend on the parameters and are ignored, as in the paper (exact for ``remasking: random``).
"""

from dataclasses import dataclass
from typing import ClassVar

from ..likelihood import SampledSteps
from . import register
from .base import StepGroups
from .core import masked_stats

STEP_WEIGHTS = ("mean", "sum")


@register("agrpo")
@dataclass
class AGRPO(StepGroups):
    """AGRPO: K uniformly drawn decoding steps per row, each scored exactly from its recorded canvas."""

    needs_steps: ClassVar[str] = "it replays sampled decoding steps"

    samples: int = 8  # K steps drawn per row and inner iteration (one forward and backward each); paper: 24
    step_weight: str = "mean"  # mean: (1/T) sum over steps (the authors') | sum: the trajectory log-probability
    advantage: str = "drgrpo"  # paper: r - mean
    loss_mask: str = "all"  # every decoded token is an action
    dual_clip: float | None = None

    def validate(self, family):
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        if self.step_weight not in STEP_WEIGHTS:
            raise ValueError(f"Unknown step_weight {self.step_weight!r}; known: {list(STEP_WEIGHTS)}")
        return super().validate(family)

    def streams(self, family, sampling) -> int:
        return self.samples

    def estimator(self, family, sampling):
        banned = (family.mask_id,) + ((family.eos_id,) if sampling.suppress_eos else ())
        return SampledSteps(self.samples, sampling.temperature or 1.0, banned, self.step_weight)

    def groups(self, steps, family, sampling):
        return steps  # the recorded steps themselves; a draw picks one of them

    def normaliser(self, family, batch, sampling):
        """Rows with at least one loss token."""
        return (batch["loss_mask"].sum(-1) > 0).sum()

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        noise = batch["noise"][slot]
        est = self.estimator(family, sampling).score(model, family, batch, noise, draw=stream)
        target = (batch["steps"] == noise["at"][:, stream]) & batch["loss_mask"].bool()
        old = batch["old"][slot][:, stream] if "old" in batch else est.logp.detach()
        ref = batch["ref"][slot][:, stream] if self.beta else None
        per_token, stats = self.surrogate(est.logp, old, batch["advantages"], ref, est.entropy)
        weight = noise["weight"][:, stream].to(per_token.dtype) * target
        return (per_token * weight).sum() / (self.samples * normaliser.clamp(min=1)), masked_stats(stats, target)
