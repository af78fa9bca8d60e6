"""EBPO (ELBO-based Block-level Policy Optimization, LLaDA2.1 report arXiv 2602.08676; algorithms.md §3.8).

A sequence-level ratio of the composite block ELBO: ``samples`` rows per sequence, every block of the completion
(on the global block grid) masked at its own stratified level with at least one target, all blocks scored in one
``[x_t ‖ x_0]`` forward. Clipped in the log domain (no overflow), no dual clip, a mean over sequences. Block
families only: the per-block terms form an ELBO of the sequence only when a block sees just the blocks before it.
"""

from dataclasses import dataclass
from typing import ClassVar

from ..likelihood import BlockElbo
from . import register
from .base import SequenceLevel
from .core import kl_estimate, log_clipped_loss


@register("ebpo")
@dataclass
class EBPO(SequenceLevel):
    """EBPO: composite block ELBO, sequence-level log-domain clipping."""

    samples: int = 16  # MC rows of the composite ELBO
    loss_mask: str = "all"

    families: ClassVar[tuple[str, ...]] = ("sdar", "sdar_moe", "llada2")
    why_not: ClassVar[str] = "the composite block ELBO needs block-causal attention; masked-diffusion families " \
                             "attend to later blocks"

    def estimator(self):
        return BlockElbo(self.samples)

    def sequence_loss(self, value, old, ref, batch):
        loss, engaged = log_clipped_loss(value - old, batch["advantages"], self.eps_low, self.eps_high)
        stats = {"clip_fraction": engaged, "log_ratio": value - old}
        if self.beta:
            kl = kl_estimate(value, ref, self.kl)
            loss = loss + self.beta * kl
            stats["kl"] = kl
        return loss, stats
