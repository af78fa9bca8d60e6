"""TraceRL (Wang et al., arXiv 2509.06949, ICLR 2026; code: github.com/Gen-Verse/dLLM-RL), without its value model:
PPO over the rollout's actual inference trace.

Each token is an action taken at the decoding step that committed it; with shrinkage s, every s consecutive steps of
the trace form one merged step (``step // s``: fixed-size runs, the last one shorter), and the tokens of a merged
step are scored from the canvas at its start (the tokens of earlier merged steps visible): ``ceil(S / s)`` forwards
instead of S. ``shrink = 1`` is the exact per-step replay (CJ-GRPO's likelihood). The loss is the token-level PPO
clipped surrogate with group-normalised advantages, a token mean over the batch. Block families (the paper's SDAR /
TraDo) replay block-local step k of every block at once in one ``[x_t ‖ x_0]`` forward; threshold decoding is fine
(the runs follow the steps each row actually took).

Differs from d2's StepMerge only in how steps are grouped: d2 cuts a fixed step budget into N balanced groups,
TraceRL makes runs of s (S = 10: s = 4 gives 4, 4, 2; d2 with N = 3 gives 3, 3, 4). Where DARE differs from the
authors' code: the KL term (off by default) is to the frozen reference, as for every DARE algorithm (the code's is
to the rollout policy); the loss is a token mean over the batch (the block-family code divides by the padded width);
groups with every completion alike are kept (the code drops groups with accuracy above 0.8 or below 0.2, without
refilling; ``--dynamic-sampling`` drops and refills those with no reward spread). The diffusion value model and its
step-level GAE advantages are not here yet.
"""

from dataclasses import dataclass

import torch

from ..sampling import step_budget
from . import register
from .base import StepGroups


@register("tracerl")
@dataclass
class TraceRL(StepGroups):
    """TraceRL: PPO on the inference trace, s consecutive steps merged."""

    shrink: int = 1  # s: consecutive decoding steps scored as one (the authors' block families: 1; LLaDA/Dream: 8)
    advantage: str = "grpo"  # the code: group z-score
    loss_mask: str = "upto_first_eos"

    def validate(self, family):
        if self.shrink < 1:
            raise ValueError(f"shrink must be >= 1, got {self.shrink}")
        return super().validate(family)

    def streams(self, family, sampling) -> int:
        return -(-step_budget(sampling, family) // self.shrink)

    def groups(self, steps, family, sampling):
        return torch.where(steps >= 0, torch.div(steps, self.shrink, rounding_mode="floor"), steps)
