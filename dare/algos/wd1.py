"""wd1: weighted policy optimisation (Tang et al., arXiv 2507.08838, ICLR 2026; code: github.com/xiaohangt/wd1).

Ratio-free: the policy is fitted to the reward-tilted rollout policy ``pi*(o|q) ∝ pi_old(o|q) exp(psi A(q, o))`` by
weighted maximum likelihood, so the old policy only supplies the samples and no ``pi_theta / pi_old`` ratio (nor old
log-probs) appears. With ``A_i = r_i - mean(r)`` over the G completions of a prompt and the group softmaxes

    w+_i = exp(psi A_i) / sum_j exp(psi A_j),    w-_i = exp(-psi A_i) / sum_j exp(-psi A_j)    (each sums to 1)

the loss of a prompt is ``-sum_i (w+_i - w-_i) log pi_theta(o_i | q)``: likelihood pushed up on the better half of
the group and, by the negative-sample term, down on the worse (``negative=False``: the positive term alone, the
paper's PSR ablation). ``log pi_theta(o|q)`` is d1's one-step mean-field estimate (the completion masked, prompt
tokens masked with ``p_prompt``), summed over the tokens up to the first stop; the loss is averaged over prompts.
An all-equal group has ``w+ = w-``: no gradient.

Where DARE follows the paper rather than the authors' code: the softmax runs over each prompt's group (the code takes
it over the device micro-batch, equal to the group only when a micro-batch is one group); the prompt mask covers real
prompt tokens only, with new noise per inner iteration. ``psi`` is the code's 1 (rewards scale it: d1's GSM8K rewards
reach about 4, DARE's are 0/1). ``beta > 0`` adds DARE's per-token KL to the reference (the paper has none; off by
default). The paper trains LLaDA only; the estimate serves every family as d1's does (block families through
``[x_t ‖ x_0]``, where the prompt mask is nearly inert).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..likelihood import MeanField
from . import register
from .base import Advantage, Algorithm, LossMask
from .core import kl_estimate, masked_stats, token_mean


def group_weights(advantages: torch.Tensor, group_size: int, psi: float, negative: bool) -> torch.Tensor:
    """``w+ - w-`` (or ``w+`` alone) per row; rows are prompt-major groups of ``group_size``."""
    scaled = psi * advantages.double().view(-1, group_size)
    weight = torch.softmax(scaled, -1)
    if negative:
        weight = weight - torch.softmax(-scaled, -1)
    return weight.view(-1).to(advantages.dtype)


@register("wd1")
@dataclass
class WD1(Algorithm):
    """wd1: group-softmax weighted likelihood, positive and negative terms, no ratio."""

    objective: ClassVar[str] = r"""$$\mathcal{L}(\theta) = -\operatorname{mean}_q \sum_{i=1}^{G} \big(w^+_i - w^-_i\big)
    \log\pi_\theta(o_i \mid q)$$

    $$w^{\pm}_i = \frac{e^{\pm\psi A_i}}{\sum_{j} e^{\pm\psi A_j}}$$

    No ratio: the policy is fitted to the reward-tilted rollout policy by weighted likelihood; $\log\pi_\theta$ is d1's
    one-step estimate."""

    noises: ClassVar[tuple[str, ...]] = ("mask", "uniform")

    p_prompt: float = 0.15  # probability of masking each real prompt token (d1's estimate)
    psi: float = 1.0  # inverse temperature of the group softmax over advantages
    negative: bool = True  # the negative-sample term -w- (False: the positive term alone, the paper's PSR)
    advantage: Advantage = "drgrpo"  # paper: r - mean
    loss_mask: LossMask = "upto_first_eos"

    uses_ratio: ClassVar[bool] = False

    def validate(self, family):
        if not 0.0 <= self.p_prompt < 1.0:
            raise ValueError(f"p_prompt must be in [0, 1), got {self.p_prompt}")
        if self.psi <= 0:
            raise ValueError(f"psi must be > 0, got {self.psi}")
        return super().validate(family)

    def estimator(self, family, sampling):
        return MeanField(self.p_prompt)

    def make_batch(self, family, rollout, rewards, group_size, reward_of, step, sampling):
        batch = super().make_batch(family, rollout, rewards, group_size, reward_of, step, sampling)
        # times G, so that dividing by the rows of the mini-batch (the normaliser) averages over its prompts
        batch["weight"] = group_weights(batch["advantages"], group_size, self.psi, self.negative) * group_size
        return batch

    def normaliser(self, family, batch, sampling):
        """[rows (G per prompt), loss tokens (for the KL term)]."""
        return torch.stack([torch.tensor(len(batch["weight"])), batch["loss_mask"].sum()])

    def loss(self, estimate, batch, old_logp, ref_logp, normaliser):
        mask = batch["loss_mask"].to(estimate.logp.dtype)
        sequence = (estimate.logp * mask).sum(-1)
        loss = -(batch["weight"] * sequence).sum() / normaliser[0].clamp(min=1)
        stats = {}
        if estimate.entropy is not None:
            stats["entropy"] = estimate.entropy
        if self.beta:
            kl = kl_estimate(estimate.logp, ref_logp, self.kl)
            loss = loss + self.beta * token_mean(kl, mask, normaliser[1])
            stats["kl"] = kl.detach()
        metrics = masked_stats(stats, mask)
        rows = torch.tensor(float(len(sequence)))
        metrics["sequence_logp"] = (sequence.detach().sum(), rows)
        return loss, metrics
