"""EBPO (ELBO-based Block-level Policy Optimization, LLaDA2.1 report arXiv 2602.08676; algorithms.md §3.8).

A sequence-level ratio of the composite block ELBO: ``samples`` rows per sequence, every block of the completion
masked at its own stratified level with at least one target. Clipped in the log domain (no overflow), no dual clip,
a mean over sequences. The per-block terms bound ``log p(block | earlier blocks)``, so their sum is an ELBO of the
sequence wherever the sampler decodes blocks left to right: block families (global grid, all blocks in one
``[x_t ‖ x_0]`` forward) and masked families with semi-autoregressive blocks (the rollout's ``block_length``; block b
is scored with later blocks fully masked, as the sampler saw it: one forward per block; one block = the plain
sequence ELBO).
"""

from dataclasses import dataclass
from typing import ClassVar

from ..likelihood import BlockElbo
from . import register
from .base import LossMask, SequenceLevel
from .core import kl_estimate, log_clipped_loss


@register("ebpo")
@dataclass
class EBPO(SequenceLevel):
    """EBPO: composite block ELBO, sequence-level log-domain clipping."""

    objective: ClassVar[str] = r"""$$\bar E(\theta) = \frac{1}{N} \sum_{n=1}^{N} \sum_{b} \sum_{k \in M_{nb}}
    \frac{\log p_\theta(y_k \mid z_n, y_{<b})}{p_{nb}}$$

    $$r_i = e^{\bar E_i(\theta) - \bar E_i(\theta_{old})}$$

    $$\mathcal{L}(\theta) = -\operatorname{mean}_i\, \mathcal{C}(r_i, A_i)$$

    One ratio per sequence from the composite block ELBO (every block masked at its own stratified level in each of the
    $N$ rows, one forward per row); the clip is taken in the log domain."""

    samples: int = 16  # MC rows of the composite ELBO
    loss_mask: LossMask = "all"

    def estimator(self, family, sampling):
        return BlockElbo(self.samples, sampling.block_length or sampling.gen_length)  # masked: the semi-AR blocks

    def sequence_loss(self, value, old, ref, batch):
        loss, engaged = log_clipped_loss(value - old, batch["advantages"], self.eps_low, self.eps_high)
        stats = {"clip_fraction": engaged, "log_ratio": value - old}
        if self.beta:
            kl = kl_estimate(value, ref, self.kl)
            loss = loss + self.beta * kl
            stats["kl"] = kl
        return loss, stats
