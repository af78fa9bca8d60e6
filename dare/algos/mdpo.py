"""MDPO, Masked Diffusion Policy Optimization (arXiv 2508.13148; algorithms.md §3.4).

Denoising as a multi-step decision process rewarded at every step: the rollout records, for each step s, the
input canvas x_s, the whole-canvas prediction x̂0_s (masked positions filled with that step's proposals) and the
probability c_s of each proposal. Step rewards ρ_s = reward(x̂0_s); score q_s = d_s + f_s with d_0 = ρ_0 + 1,
d_s = ρ_s - ρ_{s-1} + 1 and f_s the mean of the later rewards (f_{S-1} = ρ_{S-1}); advantages are normalised per
step across the prompt's completions; the K steps with the largest total |advantage| are trained, one step per
backward: ``-min(r A, clip(r) A) λ_s c`` on the positions masked at that step, ``λ_s = R / #masked``, token mean
over the batch (one optimiser step per rollout, the paper's accumulation over the K steps). Block families: a
step predicts only its current block, so x̂0_s is the decoded blocks, the current block completed by the step's
proposals and masks after it (the reward sees the answer so far); the trained positions are those the step
proposed for, scored through ``[x_t ‖ x_0]`` like the sampler's block cache.
"""

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from ..config import one_of
from ..likelihood import StepPrediction
from ..sampling import schedule_length
from . import register
from .base import ADVANTAGES, KL, Algorithm, LossMask
from .core import masked_stats


def step_scores(rho: torch.Tensor) -> torch.Tensor:
    """``[..., S]`` step rewards -> scores ``q_s = d_s + f_s``: d_0 = ρ_0 + 1, d_s = ρ_s - ρ_{s-1} + 1; f_s the
    mean of the later rewards (f_{S-1} = ρ_{S-1})."""
    d = torch.cat([rho[..., :1], rho[..., 1:] - rho[..., :-1]], -1) + 1
    later = rho.flip(-1).cumsum(-1).flip(-1) - rho  # sum of rho_{s+1..S-1}
    count = torch.arange(rho.shape[-1] - 1, -1, -1, device=rho.device, dtype=rho.dtype)
    f = torch.where(count > 0, later / count.clamp(min=1), rho)
    return d + f


def step_advantages(q: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """``[N, S]`` scores -> advantages normalised per step over each prompt's ``group_size`` completions (unbiased
    std; a group of one has mean 0 and std 1)."""
    g = q.double().view(-1, group_size, q.shape[-1])
    if group_size == 1:
        return q
    adv = (g - g.mean(1, keepdim=True)) / (g.std(1, keepdim=True) + eps)
    return adv.view_as(q).to(q.dtype)


def select_steps(adv: torch.Tensor, k: int) -> torch.Tensor:
    """The ``k`` steps with the largest ``sum_i |A_is|``, in increasing order (all steps when S <= k)."""
    total = adv.abs().sum(0)
    return total.topk(min(k, len(total))).indices.sort().values


@register("mdpo")
@dataclass
class MDPO(Algorithm):
    """MDPO: step rewards from intermediate predictions, confidence-weighted clipped loss on the top-K steps."""

    objective: ClassVar[str] = r"""$$\mathcal{L}(\theta) = -\frac{1}{\sum m} \sum_{s \in S_K} \sum_{i,k} m_{s,ik}\,
    c_{s,ik}\, \lambda_{s,i}\, \mathcal{C}(\rho_{s,ik}, \hat A_{i,s})$$

    $$\lambda_{s,i} = \frac{L_{max}}{\sum_k m_{s,ik}}$$

    $$\hat A_{i,s} = \operatorname{zscore}_G\big(d_{i,s} + f_{i,s}\big)$$

    $$d_{i,s} = R_{i,s} - R_{i,s-1} + 1$$

    $$f_{i,s} = \operatorname{mean}(R_{i,s+1}, \dots, R_{i,S-1})$$

    $R_{i,s}$: the reward of step $s$'s full prediction; $m_{s,ik}$: the positions masked at step $s$, each scored as
    the sampled prediction from the step's canvas; $c$: the sampler's confidence; $S_K$: the $K$ steps with the largest
    $\sum_i |\hat A_{i,s}|$."""

    needs_sampler: ClassVar[str] = "the canvas, whole-canvas prediction and confidences after every denoising step"

    train_steps: int = 16  # K: denoising steps trained per rollout (those with the largest total |advantage|)
    adv_eps: float = 1e-4  # per-step normalisation epsilon (paper 1e-4; DARE 1e-6)
    own_advantages: ClassVar[tuple[str, ...]] = ("step",)
    advantage: one_of(*own_advantages, *ADVANTAGES) = "step"  # MDPO's own per-step normalised scores
    loss_mask: LossMask = "all"  # positions masked at the step, EOS tail included
    dual_clip: float | None = None  # plain PPO clip (the paper has no dual clip)
    kl: KL = "k2"  # the paper's (ℓ_ref - ℓ)² / 2, with beta (paper 0)

    def validate(self, family):
        if self.train_steps < 1:
            raise ValueError(f"train_steps must be >= 1, got {self.train_steps}")
        return super().validate(family)

    def rollout_sampling(self, family, config):
        if config.threshold is not None or config.factor is not None:
            raise ValueError("mdpo trains a fixed number of steps per rollout: use a step schedule, not "
                             "threshold/factor decoding")
        # the Fast-dLLM prefix/dual caches compute only the current block's logits: no whole-canvas prediction
        cache = "none" if config.cache in ("prefix", "dual") else config.cache
        return replace(config, record_states=True, cache=cache)

    def streams(self, family, sampling) -> int:
        return min(self.train_steps, schedule_length(sampling, family))

    def estimator(self, family, sampling):
        return StepPrediction()

    def advantages(self, rewards, group_size):
        return torch.zeros_like(rewards)  # MDPO's advantages are per step (make_batch), not per completion

    def make_batch(self, family, rollout, rewards, group_size, reward_of, step, sampling):
        batch = super().make_batch(family, rollout, rewards, group_size, reward_of, step, sampling)
        trained = self.streams(family, sampling)
        n, length = rollout.completion_ids.shape
        predictions = torch.stack(rollout.predictions, 1)  # [N, S, R]
        steps = predictions.shape[1]
        rho = reward_of(predictions.reshape(n * steps, length), [i for i in range(n) for _ in range(steps)])
        adv = step_advantages(step_scores(rho.view(n, steps)), group_size, self.adv_eps)
        keep = select_steps(adv, trained)
        missing = trained - len(keep)  # a decoding that took fewer steps: repeat the last one, train nothing
        keep = torch.cat([keep, keep[-1:].repeat(missing)])
        blank = torch.full_like(rollout.completion_ids, family.mask_id)
        states = torch.stack([blank] + rollout.states[:-1], 1)[:, keep]
        proposed = predictions[:, keep] != family.mask_id  # block families: only the current block has proposals
        masked = (states == family.mask_id) & proposed & batch["loss_mask"].bool()[:, None]
        masked[:, len(keep) - missing:] = False
        confidence = torch.stack(rollout.confidences, 1)[:, keep]
        batch.update(states=states, targets=predictions[:, keep], confidence=confidence,
                     step_advantages=adv[:, keep], train_mask=masked,
                     scale=length / masked.sum(-1).clamp(min=1), step_reward=rho.view(n, steps).mean(-1))
        return batch

    def normaliser(self, family, batch, sampling):
        return batch["train_mask"].sum()

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        est = self.estimator(family, sampling).score(model, family, batch, {}, step=stream)
        mask = batch["train_mask"][:, stream]
        old = batch["old"][slot][:, stream] if "old" in batch else est.logp.detach()
        ref = batch["ref"][slot][:, stream] if "ref" in batch else None
        per_token, stats = self.surrogate(est.logp, old, batch["step_advantages"][:, stream], ref, est.entropy,
                                          scale=batch["scale"][:, stream, None])
        loss = (per_token * batch["confidence"][:, stream] * mask).sum() / normaliser.clamp(min=1)
        stats = masked_stats(stats, mask)
        if stream == 0:
            stats["step_reward"] = (batch["step_reward"].sum(), torch.tensor(float(len(batch["step_reward"]))))
        return loss, stats
