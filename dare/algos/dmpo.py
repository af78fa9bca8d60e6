"""DMPO: distribution matching policy optimisation (Zhu et al., arXiv 2510.08233; code: github.com/yuchen-zhu-zyc/DMPO).

RL as matching the reward-tilted target ``p*(o|q) ∝ p_ref(o|q) exp(r(o) / alpha)`` in forward KL. Importance
sampling from the rollout policy turns ``KL(p* || p_theta)`` into a weighted denoising cross-entropy (WDCE): the
masked-token cross-entropy of each completion, weighted by its self-normalised importance weight. No likelihood
ratio enters the gradient, nothing is clipped, and the target does not move with theta (so inner iterations reuse
the weights). For the G completions of a prompt, with ``z_i = log p_ref(o_i) - log p_old(o_i)`` (sequence ELBOs of
the reference and the rollout policy on the same masks, scored once per rollout without gradients):

    w+_i = softmax_G(c (z_i + r_i / alpha)),    w-_i = softmax_G(c (z_i - r_i / alpha))
    a_i  = w+_i - w-_i          (baseline "negative": the code's main setting, weight baseline by negative samples)
    a_i  = w+_i - 1 / G         (baseline "mean")
    loss = sum_i a_i DCE_theta(o_i),   DCE = -(1/m) sum_{masked j} log p_theta(o^j | o_t), averaged over the draws

``c`` (``coeff``) is the proximal step ``eta alpha / (eta alpha + 1)``; the code's 1 is an unbounded step.
``tilt="policy"`` sets ``z = 0``: the target tilts the rollout policy (``p* ∝ p_old exp(r / alpha)``), so neither a
reference model nor any likelihood estimate is needed before training.

Properties (tests/test_algos.py): each group's ``a`` sums to 0; a group whose rewards are all equal has ``a = 0``
exactly (no gradient); adding a constant to a group's rewards changes nothing; at the target itself
(``log p_old = log p_ref + r / alpha + const``, c = 1) the mean baseline's ``a`` is exactly 0 (the loss is zero).

Masks as the authors' code draws them (read at 96af1a4, ``loss_antithetic`` and ``loss_mask_prob_clamp`` on):
``masks: antithetic`` pairs a Bernoulli mask at rate ``lambda = 0.1 + 0.9 U`` with its complement, each draw scored
``(1/m) sum_masked log p`` (``AntitheticElbo``); ``masks: stratified`` takes DARE's stratified mask counts instead
(``MCElbo``: 1..L tokens per draw, unbiased for the ELBO). Where DARE differs from the authors' code: the same draws
serve the weights and the loss (the code draws K = 4 separate masks for the weights); the loss is averaged over
prompts (the code sums over the device batch: a scale). The paper and code train LLaDA with a LoRA adapter
whose base is the reference; DARE's reference is the frozen start (LoRA: the adapter off).
DARE's rewards are 0/1 where the code's GSM8K rewards reach about 4, so ``alpha`` defaults to 0.1 (the code: 0.04).
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import one_of
from ..likelihood import AntitheticElbo, MCElbo
from . import register
from .base import ADVANTAGES, Algorithm, LossMask, joined, split_into

BASELINES = ("negative", "mean")
TILTS = ("reference", "policy")
MASKS = ("antithetic", "stratified")


def dmpo_advantages(rewards: torch.Tensor, log_ratio: torch.Tensor, group_size: int, alpha: float, coeff: float,
                    baseline: str) -> torch.Tensor:
    """``a_i`` per row (rows are prompt-major groups of ``group_size``) from rewards ``r`` and ``z = log p_ref -
    log p_old`` (see the module docstring)."""
    r = rewards.double().view(-1, group_size) / alpha
    z = log_ratio.double().view(-1, group_size)
    positive = torch.softmax(coeff * (z + r), -1)
    other = torch.softmax(coeff * (z - r), -1) if baseline == "negative" else torch.full_like(r, 1 / group_size)
    return (positive - other).view(-1).to(rewards.dtype)


@register("dmpo")
@dataclass
class DMPO(Algorithm):
    """DMPO: weighted denoising cross-entropy toward the reward-tilted reference, no likelihood ratio."""

    objective: ClassVar[str] = r"""$$\mathcal{L}(\theta) = \operatorname{mean}_q \sum_{i=1}^{G} a_i\,
    \mathrm{DCE}_\theta(o_i)$$

    $$a_i = \operatorname{softmax}_G\big(c\,(z_i + r_i / \alpha)\big) - \operatorname{softmax}_G\big(c\,(z_i - r_i /
    \alpha)\big)$$

    $$\mathrm{DCE}_\theta(o) = -\frac{1}{m} \sum_{j \text{ masked}} \log p_\theta(o^j \mid o_t)$$

    $$z_i = \log
    p_{ref}(o_i) - \log p_{old}(o_i)$$

    Forward KL to the reward-tilted target $p^* \propto p_{ref}\, e^{r / \alpha}$ by a weighted denoising cross-entropy:
    no likelihood ratio in the gradient, nothing clipped."""

    alpha: float = 0.1  # temperature of the tilt exp(r / alpha) (the code: 0.04 on rewards up to ~4)
    coeff: float = 1.0  # c = eta alpha / (eta alpha + 1) in (0, 1]: the proximal step (1: the code's default)
    baseline: one_of(*BASELINES) = "negative"  # negative: a = w+ - w- (the code's main) | mean: a = w+ - 1/G
    tilt: one_of(*TILTS) = "reference"  # reference: p* ∝ p_ref exp(r/alpha) (paper) | policy: p* ∝ p_old exp(r/alpha)
    samples: int = 4  # mask draws per completion (the code: 4 replicates), one backward each; antithetic: even
    # antithetic: Bernoulli masks and their complements (the code's) | stratified: MCElbo
    masks: one_of(*MASKS) = "antithetic"
    num_iterations: int = 1  # the code: 8 optimiser steps per rollout
    loss_mask: LossMask = "all"  # the code masks the whole canvas, EOS padding included
    own_advantages: ClassVar[tuple[str, ...]] = ("dmpo",)
    advantage: one_of(*own_advantages, *ADVANTAGES) = "dmpo"  # a = w+ - w- (or w+ - 1/G), set after scoring

    uses_ratio: ClassVar[bool] = False

    def validate(self, family):
        if self.alpha <= 0 or not 0 < self.coeff <= 1 or self.samples < 1:
            raise ValueError(f"dmpo needs alpha > 0, coeff in (0, 1] and samples >= 1; got {self.alpha}, "
                             f"{self.coeff}, {self.samples}")
        if self.masks == "antithetic" and self.samples % 2:
            raise ValueError(f"dmpo's antithetic masks come in pairs: samples must be even, got {self.samples}")
        if self.beta:
            raise ValueError("dmpo has no KL term (the tilt toward the reference regularises it): beta must be 0")
        return super().validate(family)

    @property
    def needs_old(self) -> bool:
        return self.tilt == "reference"

    @property
    def needs_reference(self) -> bool:
        return self.tilt == "reference"

    def estimator(self, family, sampling):  # per draw: the mean masked log-prob, -DCE
        return (AntitheticElbo if self.masks == "antithetic" else MCElbo)(self.samples)

    def streams(self, family, sampling):
        return self.samples

    def advantages(self, rewards, group_size):
        """The "policy" tilt's ``a`` (z = 0); ``after_scoring`` replaces it under the "reference" tilt."""
        return dmpo_advantages(rewards, torch.zeros_like(rewards), group_size, self.alpha, self.coeff, self.baseline)

    def make_batch(self, family, rollout, rewards, group_size, reward_of, step, sampling):
        batch = super().make_batch(family, rollout, rewards, group_size, reward_of, step, sampling)
        # the weight is a times G, so that dividing by the mini-batch's rows (the normaliser) averages over prompts
        batch.update(rewards=rewards, weight=batch["advantages"] * group_size, log_ref_ratio=torch.zeros_like(rewards))
        return batch

    def after_scoring(self, parts, group_size):
        if self.tilt != "reference":
            return
        whole = joined(parts, "rewards", "loss_mask")
        # per-token ELBOs [N, draws] of every noise slot, times the maskable length: sequence ELBOs
        old, ref = (torch.cat([torch.cat(part[key], -1) for part in parts]).mean(-1) for key in ("old", "ref"))
        log_ratio = (ref - old) * whole["loss_mask"].sum(-1)
        advantages = dmpo_advantages(whole["rewards"], log_ratio, group_size, self.alpha, self.coeff, self.baseline)
        split_into(parts, advantages=advantages, weight=advantages * group_size, log_ref_ratio=log_ratio)

    def normaliser(self, family, batch, sampling):
        return torch.tensor(len(batch["rewards"]))

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        value = self.estimator(family, sampling).score(model, family, batch, batch["noise"][slot], draw=stream).logp
        loss = -(batch["weight"] * value[:, 0]).sum() / self.samples / normaliser.clamp(min=1)
        rows = torch.tensor(float(len(value)))
        stats = {"denoising_ce": (-value.detach().sum(), rows)}
        if stream == 0:
            stats["log_ref_ratio"] = (batch["log_ref_ratio"].detach().float().sum(), rows)
        return loss, stats
