"""DiPO, the policy optimisation of DiRL (Zhu et al., arXiv 2512.22234; code: github.com/OpenMOSS/DiRL): unbiased
step-level GRPO for block diffusion.

Every decoding step of the rollout is scored exactly: the tokens a step committed, from the canvas the sampler saw
before it (block families: block-local step k of every block in one ``[x_t ‖ x_0]`` forward, as the paper's SDAR
runs), so the likelihood is the sampler's own, with no random masks (the paper's "unbiased"). The loss is Eq. (7):
a per-token clipped ratio (clip-higher: [1 - 0.2, 1 + 0.28]), group z-score advantages, a token mean over every
scored token of the batch; the paper's KL term is 0 in every released script. Its dynamic sampling is DiRL's (code
at ec4bfb3, ``train/rollout_dapo_server.py``) by default: a group trains only if some of its answers are right and
some wrong (``keep: mixed``), and the step keeps decoding new prompts, ``extra`` = 2 x its count a round, until it holds
its count of such groups (``mode: resample``; DiRL's multiplier is 2 with 16+ responses a prompt, 3-6 on its math sets
with fewer). DiRL's "a response at the length limit is wrong" rule is ``train_rl.py --truncated-is-wrong``.

Where DARE differs from the paper and code: the resampling stops after ``rounds`` rounds (DiRL never stops) and then
trains on groups without a signal too; the step's own prompts come first when more groups qualify than it holds (DiRL
keeps a random subset); Eq. (8)'s joint ratio of a whole step is not built (the code does not either: it uses Eq.
(7)); the loss is a token mean over the batch's loss tokens (Eq. (6) divides each trajectory by its step count, the
code by an approximate token count); the optional speed reward (off in every script) is not here. Masked families
replay their global steps (one forward per step), a DARE extension.
"""

from dataclasses import dataclass, field
from typing import ClassVar

from ..sampling import step_budget
from . import register
from .base import Advantage, DynamicSampling, LossMask, StepGroups


@register("dipo")
@dataclass
class DiPO(StepGroups):
    """DiPO: every recorded decoding step scored from its own canvas, token-level clipped ratio."""

    objective: ClassVar[str] = r"""$$\mathcal{L}(\theta) = -\frac{1}{\sum m} \sum_{i,k} m_{ik} \min\big(\rho_{ik} A_i,\
    \operatorname{clip}(\rho_{ik}, 1 - \epsilon_{low}, 1 + \epsilon_{high})\, A_i\big)$$

    $$\rho_{ik} = \frac{\pi_\theta(y_{ik} \mid z_{i, s(k)})}{\pi_{\theta_{old}}(y_{ik} \mid z_{i, s(k)})}$$

    Every decoding step scored exactly from the canvas $z_{i,s}$ the sampler saw (no random masks); clip-higher
    ($\epsilon_{high} = 0.28$); only groups holding right and wrong answers train (DiRL's dynamic sampling)."""

    eps_high: float = 0.28  # the code's clip-higher
    dual_clip: float | None = None
    advantage: Advantage = "grpo"  # the code: group z-score
    loss_mask: LossMask = "upto_first_eos"
    # DiRL's: groups with right and wrong answers, new prompts (2 x the step's a round) until the step is full of them
    dynamic_sampling: DynamicSampling = field(default_factory=lambda: DynamicSampling(
        mode="resample", keep="mixed", extra=2.0, rounds=10))

    def streams(self, family, sampling) -> int:
        return step_budget(sampling, family)

    def groups(self, steps, family, sampling):
        return steps
