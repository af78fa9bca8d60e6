"""The plug-in contract of an RL algorithm, with plain GRPO on a per-token likelihood estimate as its behaviour.

The trainer (``dare.trainers.rl``) runs one step as: ``rollout`` -> rewards -> ``advantages`` -> for each inner
iteration: ``corrupt`` (noise, stored and shared by old / reference / current policy) -> ``score`` -> ``loss``.
An algorithm file subclasses :class:`Algorithm` and overrides only the hooks where it differs. Its dataclass
fields are its knobs: they become ``--algo-config.*`` flags and the ``algo_config:`` section of a recipe.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..likelihood import Estimate, rollout_attention
from ..sampling import SamplingConfig
from .core import clipped_token_loss, group_advantages, kl_estimate, token_mean

ADVANTAGES = ("drgrpo", "grpo", "rloo")
LOSS_MASKS = ("all", "upto_first_eos")
KL_ESTIMATORS = ("abs", "k1", "k2", "k3")


@dataclass
class Algorithm:
    """GRPO-family defaults (DARE's generic recipe values)."""

    num_iterations: int = 1  # mu: optimiser steps per rollout batch (old log-probs come from the rollout policy)
    resample_noise: bool = True  # draw new noise for each inner iteration (papers) instead of once per rollout (DARE)
    eps_low: float = 0.2  # PPO clip: ratio floor 1 - eps_low
    eps_high: float = 0.2  # PPO clip: ratio ceiling 1 + eps_high
    dual_clip: float | None = 3.0  # verl's dual clip c for A < 0 (None: off); inactive when num_iterations = 1
    beta: float = 0.0  # KL weight to the frozen reference (0: no reference model is kept)
    kl: str = "k3"  # KL estimator: k1 | abs | k2 | k3
    advantage: str = "grpo"  # grpo (r - mean) / std | drgrpo r - mean | rloo leave-one-out
    loss_mask: str = "upto_first_eos"  # train on tokens up to and including the first stop, or "all" the canvas

    name: ClassVar[str] = ""
    families: ClassVar[tuple[str, ...] | None] = None  # the families the math allows (None: every family)

    def validate(self, family) -> "Algorithm":
        if self.families is not None and family.name not in self.families:
            raise ValueError(f"{self.name} does not apply to {family.name}; it supports: {', '.join(self.families)}")
        if self.num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {self.num_iterations}")
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"clip epsilons must be >= 0, got {self.eps_low}, {self.eps_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        for knob, value, allowed in (("advantage", self.advantage, ADVANTAGES), ("loss_mask", self.loss_mask, LOSS_MASKS),
                                     ("kl", self.kl, KL_ESTIMATORS)):
            if value not in allowed:
                raise ValueError(f"Unknown {knob} {value!r}; known: {list(allowed)}")
        return self

    # -- rollout ------------------------------------------------------------------------------------------------
    def sampling(self, config: SamplingConfig) -> SamplingConfig:
        """The sampling config the rollout needs (e.g. recorded states); default: as given."""
        return config

    def rollout(self, engine, prompts: list, n: int, config: SamplingConfig, seed: int):
        return engine.generate(prompts, n, config, seed)

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.advantage)

    def loss_mask_for(self, family, rollout) -> torch.Tensor:
        """``upto_first_eos``: the rollout's completion mask; ``all``: every completion position the model attends
        (the whole canvas for masked diffusion, EOS tail included)."""
        if self.loss_mask == "upto_first_eos":
            return rollout.completion_mask
        return rollout_attention(family, rollout.prompt_mask, rollout.completion_mask)[:, rollout.prompt_ids.shape[1]:]

    # -- likelihood ---------------------------------------------------------------------------------------------
    def estimator(self):
        raise NotImplementedError(f"{type(self).__name__} must choose a likelihood estimator")

    def corrupt(self, family, batch: dict, generator: torch.Generator) -> dict:
        return self.estimator().corrupt(family, batch, generator)

    def score(self, model, family, batch: dict, noise: dict) -> Estimate:
        return self.estimator().score(model, family, batch, noise)

    # -- objective ----------------------------------------------------------------------------------------------
    def normaliser(self, batch: dict) -> torch.Tensor:
        """What the loss is averaged over (summed over the whole rollout batch on every rank): loss tokens."""
        return batch["loss_mask"].sum()

    def loss(self, estimate: Estimate, batch: dict, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
             normaliser: torch.Tensor):
        """Token-level clipped surrogate (+ beta * KL). Returns the loss and ``{metric: (sum, count)}``."""
        mask = batch["loss_mask"]
        per_token, engaged = clipped_token_loss(estimate.logp, old_logp, batch["advantages"], self.eps_low,
                                                self.eps_high, self.dual_clip)
        stats = {"clip_fraction": engaged, "entropy": estimate.entropy,
                 "ratio": torch.exp(estimate.logp.detach() - old_logp)}
        if self.beta:
            kl = kl_estimate(estimate.logp, ref_logp, self.kl)
            per_token = per_token + self.beta * kl
            stats["kl"] = kl.detach()
        tokens = mask.sum()
        return token_mean(per_token, mask, normaliser), {k: ((v.float() * mask).sum(), tokens) for k, v in stats.items()}
