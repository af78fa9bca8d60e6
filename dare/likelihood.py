"""Log-likelihood estimators of completions under a diffusion LM, by name. Every estimator is split in two:
``corrupt_*`` draws the noise (returned, so the old, reference and current policy reuse it exactly) and the
estimator scores the clean tokens given that noisy input through ``Family.logits`` (Dream's shift and the
block-diffusion ``[x_t ‖ x_0]`` layout included, so masked-diffusion estimators reach block families too).

d1 (diffu-GRPO) one-step mean-field: every completion position is masked and each real prompt token is masked
independently with probability ``p_prompt`` (0.15); one forward gives ``log p(y_k | masked input)`` for every
completion token. No 1/t weighting (completion t = 1), untempered logits.
"""

import torch

from .diffusion import corrupt


def rollout_attention(family, prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Attention over ``prompt ‖ completion`` as the sampler saw it: a masked-diffusion canvas is attended in full
    (its EOS tail included); a block-diffusion completion ends at its stop token (later positions are padding)."""
    tail = completion_mask if family.is_block_diffusion else torch.ones_like(completion_mask)
    return torch.cat([prompt_mask, tail], dim=1).long()


def corrupt_mean_field(family, prompt_ids, prompt_mask, completion_ids, p_prompt: float = 0.15,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """Noisy ``prompt ‖ completion`` ``[N, P+R]``: completion fully masked, real prompt tokens masked w.p. p_prompt."""
    noisy_prompt, _ = corrupt(prompt_ids, prompt_mask.bool(), p_prompt, family.mask_id, generator)
    return torch.cat([noisy_prompt, torch.full_like(completion_ids, family.mask_id)], dim=1)


def mean_field_logp(model, family, prompt_ids, prompt_mask, completion_ids, completion_mask, noisy) -> torch.Tensor:
    """``log p(y_k | noisy)`` ``[N, R]`` for every completion position (float32)."""
    clean = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = rollout_attention(family, prompt_mask, completion_mask)
    logits = family.logits(model, noisy, attention, clean_ids=clean if family.is_block_diffusion else None)
    completion_logits = logits[:, -completion_ids.shape[1]:].float()
    return completion_logits.log_softmax(-1).gather(-1, completion_ids[..., None])[..., 0]


ESTIMATORS = {"mean_field": (corrupt_mean_field, mean_field_logp)}


def estimator(name: str):
    """``(corrupt, score)`` of a registered estimator."""
    if name not in ESTIMATORS:
        raise ValueError(f"Unknown likelihood estimator {name!r}; known: {sorted(ESTIMATORS)}")
    return ESTIMATORS[name]
