"""d-TreeRPO (arXiv 2512.09675; algorithms.md §3.9).

Tree rollouts: each prompt's root (all masks) gets ``num_generations / branch`` children, each decoded for the
first ``split`` of the steps; each child gets ``branch`` children that finish the decoding (the sampler resumed
from the child's canvas). Leaf value = reward; inner value = mean of its children; an edge's advantage is its
child's value minus the mean of its siblings' (no std). An edge is one transition: its tokens (masked in the
parent, decoded in the child, up to the child's first stop) are scored from the parent state in one forward —
and since siblings share the parent, one forward per parent scores all its edges. Loss per edge: token mean of
the clipped surrogate (+ beta k3), averaged over edges; plus self-distillation of the parent's prediction toward
the tokens its better-than-average children chose (weights softmax(A / tau_t)), ramped in with training progress.
Prompt padding is never attended (the reference attends it in training only, finding 10). Block families: the
tree splits the block schedule (block k owns steps k*S..), and an edge's tokens are scored with the parent as the
noisy copy and the child as the clean one (``[x_t ‖ x_0]``: a block is predicted from the finished blocks before
it, as the sampler's block cache did).
"""

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from ..config import one_of
from ..likelihood import EdgeTransition
from ..sampling import schedule_length
from ..sampling.primitives import after_first
from . import register
from .base import ADVANTAGES, Algorithm, LossMask
from .core import masked_stats


def sibling_advantages(values: torch.Tensor) -> torch.Tensor:
    """``[..., C]`` sibling values -> ``V - mean of the other siblings`` (a lone child keeps its value)."""
    c = values.shape[-1]
    if c == 1:
        return values
    return values - (values.sum(-1, keepdim=True) - values) / (c - 1)


def sd_schedule(progress: float, weight: float, gamma: float, temperature: float, power: float):
    """Self-distillation weight ``weight (e^{gamma p} - 1) / (e^gamma - 1)`` and temperature
    ``max(temperature (1 - p)^power, 1e-6)`` at training progress ``p`` in [0, 1]."""
    p = min(max(progress, 0.0), 1.0)
    return weight * math.expm1(gamma * p) / math.expm1(gamma), max(temperature * (1 - p) ** power, 1e-6)


def distillation_targets(children: torch.Tensor, active: torch.Tensor, adv: torch.Tensor, valid: torch.Tensor,
                         tau: float):
    """For each parent (row) with >= 2 children: positive children weighted by softmax(A / tau); at each position
    the target q is their weighted token distribution (children active there). Returns the per-(child, position)
    weight ``w / Z_j`` of that child's token in q, and ``log q`` of that token, both ``[G, C, R]``."""
    positive = valid & (adv > 0) & (valid.sum(-1, keepdim=True) >= 2)
    w = torch.softmax((adv / tau).masked_fill(~positive, float("-inf")), -1).nan_to_num(0.0)
    mass = w[..., None] * (active & positive[..., None])  # [G, C, R]
    omega = mass / mass.sum(1, keepdim=True).clamp(min=1e-30)
    same = children[:, :, None] == children[:, None, :]  # [G, C, C', R]: child c and c' chose the same token
    q = (omega[:, None] * same).sum(2)
    return omega, torch.log(q.clamp(min=1e-30)) * (omega > 0)


@register("d-treerpo")
@dataclass
class DTreeRPO(Algorithm):
    """d-TreeRPO: tree rollouts, sibling leave-one-out advantages on edge transitions, self-distillation."""

    objective: ClassVar[str] = r"""$$\mathcal{L}(\theta) = -\operatorname{mean}_{e}\, \operatorname{mean}_{k \in a_e}\,
    \mathcal{C}(\rho_{ek}, A_e)
    + \beta\, \mathrm{KL} + \lambda_t\, \operatorname{mean}_{g, j} \mathrm{KL}\big(q_j \,\|\, p_\theta(\cdot \mid
    \mathrm{parent}_g)_j\big)$$

    $$A(v) = V(v) - \operatorname{mean}_{u \in \mathrm{siblings}(v)} V(u)$$

    $$\rho_{ek} = \frac{p_\theta(c_{ek} \mid \mathrm{parent}_e)}{p_{\theta_{old}}(c_{ek} \mid \mathrm{parent}_e)}$$

    Each tree edge $e$ is an action: the tokens $c_{ek}$, $k \in a_e$, it decoded, scored from its parent state; $V$:
    leaf rewards averaged up the tree; $q_j$: the softmax($A / \tau_t$)-weighted tokens of the positive siblings
    (self-distillation)."""

    needs_sampler: ClassVar[str] = "decodings resumed from shared partial canvases (the tree)"
    whole_groups: ClassVar[str] = "its rollout records every tree's first level beside the leaves"

    branch: int = 4  # children of each first-level node (the root gets num_generations / branch children)
    split: float = 0.5  # fraction of the decoding steps the first level takes (the branch point)
    sd_weight: float = 3e-3  # lambda_max of the self-distillation term (0: off)
    sd_gamma: float = 2.0  # lambda_t = lambda_max (e^{gamma p} - 1) / (e^gamma - 1), p = training progress
    sd_temperature: float = 2.0  # tau_max
    sd_power: float = 0.7  # tau_t = tau_max (1 - progress)^power
    sd_horizon: int = 30000  # optimiser steps over which the SD schedule runs (progress = step / horizon)
    num_iterations: int = 12  # passes over each tree batch (paper and DARE: 12 epochs)
    eps_low: float = 0.4  # paper: clip 0.4
    eps_high: float = 0.4
    dual_clip: float | None = None  # the paper has no dual clip
    beta: float = 0.01  # k3 KL to the reference (the LoRA-disabled base in the paper's setup)
    own_advantages: ClassVar[tuple[str, ...]] = ("tree",)
    advantage: one_of(*own_advantages, *ADVANTAGES) = "tree"  # sibling leave-one-out of tree values, no std
    loss_mask: LossMask = "upto_first_eos"  # an edge's tokens up to the child's first stop token

    def validate(self, family):
        if self.branch < 1 or not 0 < self.split < 1:
            raise ValueError(f"need branch >= 1 and 0 < split < 1, got branch={self.branch}, split={self.split}")
        return super().validate(family)

    def rollout(self, engine, prompts, n, sampling, seed, *, rows=None, score=None):
        if n % self.branch:
            raise ValueError(f"num_generations ({n}) must be a multiple of branch ({self.branch}): each prompt's tree "
                             f"has num_generations leaves")
        total = schedule_length(sampling, engine.family)
        middle = round(total * self.split)
        if not 0 < middle < total:
            raise ValueError(f"split={self.split} of {total} steps leaves an empty tree level")
        first = engine.generate(prompts, n // self.branch, sampling, seed, to_step=middle)
        canvas = first.completion_ids.repeat_interleave(self.branch, 0)
        leaves = engine.generate(prompts, n, sampling, (seed + 1) % 2 ** 63, canvas=canvas, from_step=middle)
        return replace(leaves, nfe=first.nfe + leaves.nfe, seconds=first.seconds + leaves.seconds,
                       records={"first_level": first.completion_ids})

    def advantages(self, rewards, group_size):
        leaves = rewards.view(-1, group_size // self.branch, self.branch)
        return sibling_advantages(leaves).reshape(-1)  # the leaves' own edges (for logging; make_batch has all)

    def make_batch(self, family, rollout, rewards, group_size, reward_of, step, sampling):
        """One row per parent node: the root (children: first-level nodes) and each first-level node (children:
        its leaves), with the children's canvases ``[rows, C, R]``, edge advantages and active tokens."""
        c, b = group_size // self.branch, self.branch
        width, length = max(c, b), rollout.completion_ids.shape[1]
        prompts = len(rollout.completion_ids) // group_size
        device = rollout.completion_ids.device
        first = rollout.records["first_level"].view(prompts, c, length)
        leaf_values = rewards.view(prompts, c, b)
        parents = torch.cat([torch.full((prompts, 1, length), family.mask_id, device=device), first], 1)
        children = torch.full((prompts, 1 + c, width, length), family.mask_id, device=device)  # unused slots: masks
        adv = torch.zeros(prompts, 1 + c, width, device=device)
        valid = torch.zeros(prompts, 1 + c, width, dtype=torch.bool, device=device)
        children[:, 0, :c], children[:, 1:, :b] = first, rollout.completion_ids.view(prompts, c, b, length)
        adv[:, 0, :c], adv[:, 1:, :b] = sibling_advantages(leaf_values.mean(-1)), sibling_advantages(leaf_values)
        valid[:, 0, :c], valid[:, 1:, :b] = True, True
        rows = prompts * (1 + c)
        parents, children, adv, valid = (x.reshape(rows, *x.shape[2:]) for x in (parents, children, adv, valid))
        active = (parents[:, None] == family.mask_id) & (children != family.mask_id) & valid[..., None]
        if self.loss_mask == "upto_first_eos":
            active &= ~after_first(torch.isin(children, torch.tensor(family.stop_ids, device=children.device)))
        weight, tau = sd_schedule(step / self.sd_horizon, self.sd_weight, self.sd_gamma, self.sd_temperature,
                                  self.sd_power)
        sd_mass, sd_logq = distillation_targets(children, active, adv, valid, tau)
        pick = torch.arange(prompts, device=adv.device).repeat_interleave(1 + c) * group_size
        return {"prompt_ids": rollout.prompt_ids[pick], "prompt_mask": rollout.prompt_mask[pick],
                "completion_ids": parents, "completion_mask": torch.ones_like(parents), "children": children,
                "advantages": adv, "active": active, "loss_mask": active.any(1).long(),
                "sd_mass": sd_mass, "sd_logq": sd_logq, "sd_lambda": torch.full((rows,), weight, device=adv.device)}

    def normaliser(self, family, batch, sampling):
        """[edges with at least one active token, (parent, position) pairs with a distillation target]."""
        pairs = (batch["sd_mass"].sum(1) > 0).sum()
        return torch.stack([batch["active"].any(-1).sum(), pairs])

    def estimator(self, family, sampling):
        return EdgeTransition()

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        est = self.score(model, family, batch, {}, sampling)
        active = batch["active"]
        old = batch["old"][slot] if "old" in batch else est.logp.detach()
        ref = batch["ref"][slot] if "ref" in batch else None
        per_token, stats = self.surrogate(est.logp, old, batch["advantages"][..., None], ref)
        edge_mean = (per_token * active).sum(-1) / active.sum(-1).clamp(min=1)
        loss = edge_mean.sum() / normaliser[0].clamp(min=1)
        sd = (batch["sd_mass"] * (batch["sd_logq"] - est.logp)).sum((1, 2))  # KL(q || p) per parent
        loss = loss + (batch["sd_lambda"] * sd).sum() / normaliser[1].clamp(min=1)
        out = masked_stats(stats, active)
        out["self_distillation"] = (sd.detach().sum(), (batch["sd_mass"].sum(1) > 0).sum())
        return loss, out
