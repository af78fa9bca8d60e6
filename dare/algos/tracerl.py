"""TraceRL (Wang et al., arXiv 2509.06949, ICLR 2026; code: github.com/Gen-Verse/dLLM-RL): PPO over the rollout's
actual inference trace, optionally with its diffusion value model.

Each token is an action taken at the decoding step that committed it; with shrinkage s, every s consecutive steps of
the trace form one merged step (``step // s``: fixed-size runs, the last one shorter), and the tokens of a merged
step are scored from the canvas at its start (the tokens of earlier merged steps visible): ``ceil(S / s)`` forwards
instead of S. ``shrink = 1`` is the exact per-step replay (CJ-GRPO's likelihood). The loss is the token-level PPO
clipped surrogate with group-normalised advantages, a token mean over the batch. Block families (the paper's SDAR /
TraDo) replay block-local step k of every block at once in one ``[x_t ‖ x_0]`` forward; threshold decoding is fine
(the runs follow the steps each row actually took).

Differs from d2's StepMerge only in how steps are grouped: d2 cuts a fixed step budget into N balanced groups,
TraceRL makes runs of s (S = 10: s = 4 gives 4, 4, 2; d2 with N = 3 gives 3, 3, 4). As the authors' code
(github.com/Gen-Verse/dLLM-RL at 10b4fd1, ``train/rl_llada.py``, ``reward/rl_reward.py``), by default: a k3 KL with
beta 0.01 to the policy that decoded the batch (``kl_to: rollout``: zero on an on-policy pass, it acts on the inner
optimiser steps; no reference model); the groups whose accuracy is above 0.8 or below 0.2 leave the loss, without a
refill (``dynamic_sampling: {mode: drop, keep: accuracy}``); no dual clip. Their "a truncated response is wrong" rule
is ``train_rl.py --truncated-is-wrong`` (the code: a response within 5 tokens of the limit; DARE: one without a stop
token). Where DARE still differs: the loss is a token mean over the batch (the LLaDA code averages each sequence's
tokens, then the sequences; the block-family code divides by the padded width).

The value model (``value.model``: ``policy``, as the code initialises it; ``dare/trainers/value.py``) is a second
network, the policy's start with a zeroed one-output head: V_j is read at token j's position of the canvas before
j's merged step, the input the policy scores j from. The trace steps of a row, in decoding order (block families:
block by block), carry the group-normalised reward r̂ on the last step's tokens (r_j = r̂ there, else 0) and
``V*_t`` = the mean of V_j over step t; backwards over steps (``V*_{S} = A*_{S} = R*_{S} = 0``):

    R*_t = r*_t + gamma R*_{t+1},   A*_t = r*_t - V*_t + gamma V*_{t+1} + gamma lam A*_{t+1}
    per token j of step t:  R_j = r_j + gamma R*_{t+1},   A_j = r_j - V_j + gamma V*_{t+1} + gamma lam A*_{t+1}

(the code's ``compute_returns_and_advantages_from_fragments``). With gamma = lam = 1 and V = c everywhere, A_j = r̂ - c:
GRPO's advantage at the zero-initialised start. The value loss is PPO's clipped one, ``0.5 max((V - R)^2,
(V_old + clip(V - V_old, ±eps) - R)^2)``, a token mean (the code divides by the padded width); its AdamW (lr 5e-6)
takes one step per rollout batch on the values read before it (the code: one epoch of accumulated micro-batches).
The policy's advantages use the value model of before that step, as the code's do.
"""

import os
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..config import one_of
from ..likelihood import canvas_before, token_values, trajectory_blocks
from ..sampling import step_budget
from . import register
from .base import KL_TARGETS, Advantage, DynamicSampling, LossMask, StepGroups, ValueSettings, joined, split_into


def step_gae(order: torch.Tensor, live: torch.Tensor, values: torch.Tensor, reward: torch.Tensor, gamma: float,
             lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token advantages and returns ``[N, R]`` of TraceRL's step-level GAE (module docstring). ``order``: each
    token's trace step (any integers increasing in decoding order), ``live``: the tokens on the trace, ``values``:
    V_j, ``reward`` ``[N]``: r̂, given to the tokens of each row's last step."""
    live = live.bool()
    steps = int(order[live].max()) + 1 if live.any() else 1
    key = torch.where(live, order, steps).long()  # off-trace tokens: a spare column
    weight = live.to(values.dtype)
    counts = values.new_zeros(len(key), steps + 1).scatter_add_(1, key, weight)[:, :steps]
    step_value = values.new_zeros(len(key), steps + 1).scatter_add_(1, key, values * weight)[:, :steps]
    step_value = step_value / counts.clamp(min=1)
    present = counts > 0
    last = steps - 1 - present.flip(1).long().argmax(1)
    step_reward = torch.where(torch.arange(steps, device=key.device) == last[:, None], reward.to(values.dtype)[:, None],
                              0.0) * present
    later = {name: values.new_zeros(len(key), steps + 1) for name in ("v", "a", "r")}  # X*_{t+1} seen from step t
    v, a, r = (values.new_zeros(len(key)) for _ in range(3))
    for t in range(steps - 1, -1, -1):
        later["v"][:, t], later["a"][:, t], later["r"][:, t] = v, a, r
        here = present[:, t]
        advantage = step_reward[:, t] - step_value[:, t] + gamma * v + gamma * lam * a
        v, a = torch.where(here, step_value[:, t], v), torch.where(here, advantage, a)
        r = torch.where(here, step_reward[:, t] + gamma * r, r)
    token_reward = step_reward.gather(1, key.clamp(max=steps - 1)) * weight
    at = {name: value.gather(1, key) for name, value in later.items()}
    advantages = (token_reward - values + gamma * at["v"] + gamma * lam * at["a"]) * weight
    returns = (token_reward + gamma * at["r"]) * weight
    return advantages, returns


@register("tracerl")
@dataclass
class TraceRL(StepGroups):
    """TraceRL: PPO on the inference trace, s consecutive steps merged."""

    objective: ClassVar[str] = r"""$$\ell_\theta(i, k) = \log\pi_\theta\big(y_{ik} \mid
    z_{i, \lfloor s(k) / \sigma \rfloor}\big)$$

    $$\mathcal{L}(\theta) = -\frac{1}{\sum m} \sum_{i,k} m_{ik}\, \mathcal{C}(\rho_{ik}, A_{ik}) + \beta\,
    \mathrm{KL}_{k3}(\pi_\theta \,\|\, \pi_{rollout})$$

    Runs of $\sigma$ consecutive decoding steps (the shrinkage) merged, each scored from the canvas at its start;
    $A_{ik} = A_i$ (group-normalised), or with the value model the step-level GAE
    $A_j = r_j - V_j + \gamma V^*_{t+1} + \gamma\lambda A^*_{t+1}$."""

    shrink: int = 1  # s: consecutive decoding steps scored as one (the authors' block families: 1; LLaDA/Dream: 8)
    # the code: group z-score (with a value model: r̂, the reward of the trace's last step)
    advantage: Advantage = "grpo"
    loss_mask: LossMask = "upto_first_eos"
    dual_clip: float | None = None  # the code: none
    beta: float = 0.01  # the code's k3 KL ...
    kl_to: one_of(*KL_TARGETS) = "rollout"  # ... to the rollout policy
    # the code: groups with accuracy above 0.8 or below 0.2 leave the loss (no refill)
    dynamic_sampling: DynamicSampling = field(default_factory=lambda: DynamicSampling(mode="drop", keep="accuracy"))
    value: ValueSettings = field(default_factory=ValueSettings)  # value.model: policy switches the value model on
    gamma: float = 1.0  # discount over trace steps (value model only; the code: 1.0, process rewards 0.99)
    lam: float = 1.0  # GAE lambda over trace steps (value model only; the code: 1.0)

    def validate(self, family):
        if self.shrink < 1:
            raise ValueError(f"shrink must be >= 1, got {self.shrink}")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1) or self.value.clip < 0 or self.value.learning_rate <= 0:
            raise ValueError(f"tracerl needs gamma and lam in [0, 1], value.clip >= 0 and value.learning_rate > 0; "
                             f"got {self.gamma}, {self.lam}, {self.value.clip}, {self.value.learning_rate}")
        if self.value.model not in ("", "policy"):
            from ..models.loading import looks_local  # here: --help imports this module

            if looks_local(self.value.model) and not os.path.isdir(os.path.expanduser(self.value.model)):
                raise FileNotFoundError(f"value.model {self.value.model} does not exist (policy: a copy of the "
                                        "policy's start; or a folder or hub name of the same family)")
        return super().validate(family)

    def streams(self, family, sampling) -> int:
        return -(-step_budget(sampling, family) // self.shrink)

    def groups(self, steps, family, sampling):
        return torch.where(steps >= 0, torch.div(steps, self.shrink, rounding_mode="floor"), steps)

    # -- the value model --------------------------------------------------------------------------------------------
    def value_targets(self, model, family, parts, group_size, sampling):
        streams = self.streams(family, sampling)
        for part in parts:
            values = torch.zeros(part["steps"].shape, device=part["steps"].device)
            for stream in range(streams):
                at = part["steps"] == stream
                if at.any():
                    values = torch.where(at, token_values(model, family, part, canvas_before(family, part, stream)),
                                         values)
            part["old_values"] = values
        whole = joined(parts, "steps", "loss_mask", "old_values", "advantages", "prompt_mask")
        order = trajectory_blocks(family, whole) * streams + whole["steps"]
        live = whole["loss_mask"].bool() & (whole["steps"] >= 0)
        advantages, returns = step_gae(order, live, whole["old_values"], whole["advantages"], self.gamma, self.lam)
        split_into(parts, advantages=advantages, returns=returns)

    def value_loss(self, model, family, batch, stream, normaliser, sampling):
        target = ((batch["steps"] == stream) & batch["loss_mask"].bool()).float()
        values = token_values(model, family, batch, canvas_before(family, batch, stream))
        old, returns = batch["old_values"], batch["returns"]
        loss = (values - returns) ** 2
        if self.value.clip:
            clipped = old + (values - old).clamp(-self.value.clip, self.value.clip)
            loss = torch.maximum(loss, (clipped - returns) ** 2)
        tokens = target.sum()
        stats = {"value/loss": (0.5 * (loss.detach() * target).sum(), tokens),
                 "value/prediction": ((values.detach() * target).sum(), tokens),
                 "value/return": ((returns * target).sum(), tokens)}
        return 0.5 * (loss * target).sum() / normaliser.clamp(min=1), stats
