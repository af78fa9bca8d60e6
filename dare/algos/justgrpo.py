"""JustGRPO (arXiv 2601.15165; algorithms.md §3.10).

The diffusion LM as an autoregressive policy: the rollout decodes one token per step, left to right (no cache
approximation, no top-k/top-p), and the learner scores each token exactly as the sampler drew it —
``log softmax(logits(prompt ‖ y_<t ‖ masks) / T)[y_t]``, the sampler's temperature and banned tokens included —
so learner = sampler. Positions are streamed (``chunk`` per backward).
"""

import math
from dataclasses import dataclass, replace
from typing import ClassVar

from ..likelihood import Autoregressive
from . import register
from .base import Algorithm, LossMask


@register("justgrpo")
@dataclass
class JustGRPO(Algorithm):
    """JustGRPO: exact AR log-likelihood with the sampler's temperature."""

    objective: ClassVar[str] = r"""$$\ell_\theta(i, t) = \log
    \operatorname{softmax}\Big(\frac{f_\theta([x;\, y_{i,<t};\, M \dots M])_t}{T}\Big)[y_{it}]$$

    $$\mathcal{L}(\theta) = -\frac{1}{\sum_{i,t} m_{it}} \sum_{i,t} m_{it}\, \mathcal{C}(\rho_{it}, A_i)$$

    The model decodes left to right, one token per step at the sampler's temperature $T$, so the likelihood is exact."""

    needs_sampler: ClassVar[str] = "a left-to-right decoding of one token per step, scored exactly as drawn"

    chunk: int = 1  # positions scored per forward / backward
    loss_mask: LossMask = "all"

    def rollout_sampling(self, family, config):
        one_per_step = dict(remasking="left_to_right", schedule="linear", threshold=None, factor=None, top_k=None,
                            top_p=None, alg_temp=None, editing_threshold=None,
                            cache=None if config.cache in ("prefix", "dual") else config.cache)
        return replace(config, **one_per_step, steps=None, block_length=None)

    def estimator(self, family, sampling):
        """The sampler's temperature; banned: the tokens the sampler never proposes (mask; EOS with suppress_eos)."""
        banned = (family.mask_id,) + ((family.eos_id,) if sampling.suppress_eos else ())
        return Autoregressive(sampling.temperature or 1.0, self.chunk, banned)

    def streams(self, family, sampling) -> int:
        return math.ceil(sampling.gen_length / self.chunk)

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        """The base token loss on this stream's positions (the normaliser still covers the whole batch)."""
        positions = range(stream * self.chunk, min((stream + 1) * self.chunk, batch["completion_ids"].shape[1]))
        est = self.estimator(family, sampling).score(model, family, batch, {}, positions)
        cols = slice(positions.start, positions.stop)
        old = batch["old"][slot][:, cols] if "old" in batch else est.logp.detach()
        ref = batch["ref"][slot][:, cols] if "ref" in batch else None
        return self.loss(est, {**batch, "loss_mask": batch["loss_mask"][:, cols]}, old, ref, normaliser)
