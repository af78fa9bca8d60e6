"""Log-likelihood estimators of completions under a diffusion LM, by name.

The contract every estimator follows (so an algorithm file only picks one and its knobs):

* ``corrupt(family, batch, generator) -> noise``: draw the noise (a dict of tensors whose first dimension is the
  batch row). The trainer stores it so the old, reference and current policy score exactly the same noisy input.
* ``score(model, family, batch, noise) -> Estimate``: log-likelihoods of the completion — per token ``[N, R]``
  (or per sequence for ELBO-style estimators) — through ``Family.logits`` so Dream's shift and the block families'
  ``[x_t ‖ x_0]`` layout are handled once.

``batch`` holds ``prompt_ids``/``prompt_mask`` ``[N, P]`` (left-padded) and ``completion_ids``/``completion_mask``
``[N, R]`` (the rollout's mask: up to and including the first stop token).

mean_field (d1 / diffu-GRPO): every completion position is masked and each real prompt token is masked
independently with probability ``p_prompt``; ONE forward gives ``log p(y_k | masked input)`` for every completion
token. No 1/t weighting (the completion is at t = 1), untempered logits.
"""

from dataclasses import dataclass

import torch

from .diffusion import corrupt


@dataclass
class Estimate:
    logp: torch.Tensor  # per-token [N, R] (or per-sequence for ELBO-type estimators), differentiable
    entropy: torch.Tensor  # [N, R], detached: entropy of the predictive distribution at each completion position


def rollout_attention(family, prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Attention over ``prompt ‖ completion`` as the sampler saw it: a masked-diffusion canvas is attended in full
    (its EOS tail included); a block-diffusion completion ends at its stop token (later positions are padding)."""
    tail = completion_mask if family.is_block_diffusion else torch.ones_like(completion_mask)
    return torch.cat([prompt_mask, tail], dim=1).long()


def score_tokens(model, family, batch, noisy: torch.Tensor) -> Estimate:
    """``log p(y_k | noisy)`` for every completion position of ``prompt ‖ completion`` given the noisy version."""
    prompt, completion = batch["prompt_ids"], batch["completion_ids"]
    attention = rollout_attention(family, batch["prompt_mask"], batch["completion_mask"])
    clean = torch.cat([prompt, completion], dim=1) if family.is_block_diffusion else None
    logits = family.logits(model, noisy, attention, clean_ids=clean, keep=completion.shape[1]).float()
    logp = logits.log_softmax(-1)
    with torch.no_grad():
        entropy = -(logp.exp() * logp).sum(-1)
    return Estimate(logp.gather(-1, completion[..., None])[..., 0], entropy)


@dataclass
class MeanField:
    """d1's one-step mean-field estimate (fully masked completion, prompt tokens masked w.p. ``p_prompt``)."""

    p_prompt: float = 0.15

    def corrupt(self, family, batch, generator: torch.Generator | None = None) -> dict:
        noisy_prompt, _ = corrupt(batch["prompt_ids"], batch["prompt_mask"].bool(), self.p_prompt, family.mask_id,
                                  generator)
        return {"noisy": torch.cat([noisy_prompt, torch.full_like(batch["completion_ids"], family.mask_id)], dim=1)}

    def score(self, model, family, batch, noise) -> Estimate:
        return score_tokens(model, family, batch, noise["noisy"])


ESTIMATORS = {"mean_field": MeanField}


def estimator(name: str, **knobs):
    """A registered estimator, configured with ``knobs``."""
    if name not in ESTIMATORS:
        raise ValueError(f"Unknown likelihood estimator {name!r}; known: {sorted(ESTIMATORS)}")
    return ESTIMATORS[name](**knobs)
