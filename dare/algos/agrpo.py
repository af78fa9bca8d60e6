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

As the authors' code (github.com/probablyabot/agrpo at 98f1182, ``agrpo_trainer.py``), by default: only the steps
up to the row's last step that committed a token other than a stop token can be drawn (``steps: content``; T counts
those), so the EOS-only steps that end a long canvas take no weight; each draw picks a step with probability
proportional to the entropy it committed (``proposal: entropy``: the summed entropies of its tokens under the
distribution the sampler drew them from, recorded by the sampler, plus 1e-8), weighted ``1 / (T q)``; the batch's
draws are low-discrepancy (``low_discrepancy``); a step's tokens are scored with the sampler's temperature and its
top-k / top-p filter renormalised (``truncate``). ``steps: all``, ``proposal: uniform`` and ``truncate: false`` give
the earlier DARE behaviour.

Where DARE still differs: the first pass's ratio is exactly 1 (old log-probs are the detached current ones, not the
sampler's float32 ones); the filter's kept set is re-derived from the policy being scored, the drawn token always in
it (the code stores the rollout's mask, ``[N, R, V]``: the same set on the first pass); "stop token" is any of the
family's stop ids (the code checks the tokenizer's EOS id only); the loss is averaged over rows, not divided by the
group size (the same on one device holding one group). Position choices by confidence depend on the parameters and
are ignored, as in the paper (exact for ``remasking: random``). The entropy proposal needs DARE's own sampler (the
SGLang engine records no entropies: ``proposal: uniform`` there).
"""

from dataclasses import dataclass, replace
from functools import partial
from typing import ClassVar

import torch

from ..config import one_of
from ..likelihood import SampledSteps, trajectory_blocks
from ..sampling.primitives import filter_logits
from . import register
from .base import Advantage, LossMask, StepGroups
from .core import masked_stats

STEP_WEIGHTS = ("mean", "sum")
STEP_SETS = ("content", "all")
PROPOSALS = ("entropy", "uniform")


def content_steps(steps: torch.Tensor, ids: torch.Tensor, blocks: torch.Tensor, stop_ids) -> torch.Tensor:
    """``steps`` with every step after the last one that committed a non-stop token (per row and block: per row for
    masked families, whose steps are global) set to -1: the authors' stop rule."""
    content = (steps >= 0) & ~torch.isin(ids, torch.tensor(stop_ids, device=ids.device))
    key = blocks.clamp(min=0)
    last = torch.full((len(steps), int(key.max()) + 1 if key.numel() else 1), -1, dtype=steps.dtype,
                      device=steps.device)
    last = last.scatter_reduce(1, key, torch.where(content, steps, -1), "amax")
    return torch.where(steps > last.gather(1, key), -1, steps)


@register("agrpo")
@dataclass
class AGRPO(StepGroups):
    """AGRPO: K decoding steps per row, drawn by the entropy they committed, each scored exactly from its canvas."""

    objective: ClassVar[str] = r"""$$\mathcal{L}(\theta) = -\frac{1}{K} \sum_{j=1}^{K} \operatorname{mean}_i\,
    \frac{1}{T_i\, q_i(t_{ij})} \sum_{k \in U_{i,t_{ij}}} \mathcal{C}(\rho_{ik}, A_i)$$

    $$t_{ij} \sim q_i$$

    An unbiased estimate of $\frac{1}{T_i}\sum_t \sum_{k \in U_{i,t}} \mathcal{C}$ over the row's $T_i$ decoding steps:
    each draw scores one step's tokens $U_{i,t}$ exactly from its canvas; $q_i$: steps drawn in proportion to the
    entropy they committed."""

    needs_steps: ClassVar[str] = "it replays sampled decoding steps"

    samples: int = 8  # K steps drawn per row and inner iteration (one forward and backward each); paper: 24
    # mean: (1/T) sum over steps (the authors') | sum: the trajectory log-probability
    step_weight: one_of(*STEP_WEIGHTS) = "mean"
    # content: steps up to the last that committed a non-stop token (the authors') | all
    steps: one_of(*STEP_SETS) = "content"
    # entropy: q proportional to the entropy a step committed (the authors') | uniform
    proposal: one_of(*PROPOSALS) = "entropy"
    low_discrepancy: bool = True  # stratify the batch's draws (the authors') instead of independent uniforms
    truncate: bool = True  # score with the sampler's top-k / top-p filter renormalised (the authors')
    advantage: Advantage = "drgrpo"  # paper: r - mean
    loss_mask: LossMask = "all"  # every decoded token is an action
    dual_clip: float | None = None

    def validate(self, family):
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")
        return super().validate(family)

    def rollout_sampling(self, family, config):
        config = super().rollout_sampling(family, config)
        return replace(config, record_entropy=True) if self.proposal == "entropy" else config

    def streams(self, family, sampling) -> int:
        return self.samples

    def estimator(self, family, sampling):
        banned = (family.mask_id,) + ((family.eos_id,) if sampling.suppress_eos else ())
        filtered = self.truncate and (sampling.top_k is not None or sampling.top_p is not None)
        keep = partial(filter_logits, top_k=sampling.top_k, top_p=sampling.top_p) if filtered else None
        return SampledSteps(self.samples, sampling.temperature or 1.0, banned, self.step_weight, self.proposal,
                            self.low_discrepancy, keep)

    def groups(self, steps, family, sampling):
        return steps  # the recorded steps themselves; a draw picks one of them

    def make_batch(self, family, rollout, rewards, group_size, reward_of, step, sampling):
        batch = super().make_batch(family, rollout, rewards, group_size, reward_of, step, sampling)
        if self.proposal == "entropy":
            replay = family.is_block_diffusion and rollout.replay_ids is not None
            batch["entropy"] = rollout.replay_entropy if replay else rollout.entropy
        if self.steps == "content":
            steps = content_steps(batch["steps"], batch["completion_ids"], trajectory_blocks(family, batch),
                                  family.stop_ids)
            batch.update(steps=steps, loss_mask=batch["loss_mask"] * (steps >= 0))
        return batch

    def normaliser(self, family, batch, sampling):
        """Rows with at least one loss token."""
        return (batch["loss_mask"].sum(-1) > 0).sum()

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        noise = batch["noise"][slot]
        est = self.estimator(family, sampling).score(model, family, batch, noise, draw=stream)
        target = (batch["steps"] == noise["at"][:, stream]) & batch["loss_mask"].bool()
        old = batch["old"][slot][:, stream] if "old" in batch else est.logp.detach()
        ref = batch["ref"][slot][:, stream] if "ref" in batch else None
        per_token, stats = self.surrogate(est.logp, old, batch["advantages"], ref, est.entropy)
        weight = noise["weight"][:, stream].to(per_token.dtype) * target
        return (per_token * weight).sum() / (self.samples * normaliser.clamp(min=1)), masked_stats(stats, target)
