"""IGPO, inpainting-guided policy optimisation (Zhao et al., arXiv 2509.10396; code: github.com/facebookresearch/igpo).

GRPO gets no signal from a group whose completions all fail (every advantage is 0). IGPO rescues such groups with
the reference solution: the failed group is decoded again with fragments of the reference fixed in the canvas
(inpainting: the sampler only ever fills masked positions, so the hints stay), each completion with its own share of
hints ``eta ~ U[hint_low, hint_high]`` of the reference's chunks (``chunk_min..chunk_max`` tokens each, left to right,
at their own positions; the last ``free_tail`` positions stay free for the answer); up to ``floor(replace_fraction
x G)`` of the hinted completions that succeed replace original completions of the group, and the group's advantages
are then computed over the mixed group (``r - mean``), which now has a spread. The hint tokens are not the policy's
own choices: the record (``Rollout.given``) keeps them, and the loss leaves them out. The likelihood is d1's one-step
mean-field estimate; the ratio is the authors' sequence-level one (GSPO's, their ``use_gspo=true``: ``ratio_level``,
``token`` for GRPO's per-token ratio). The defaults are DARE's shared ones (beta 0, dual clip 3.0, one iteration);
the authors' run (k3 KL 0.01 to the reference, no dual clip, 4 iterations, their optimiser) is
``recipes/llada/igpo_math_paper.yaml``.

Where DARE differs from the authors' code: every hint token is left out of the loss (the code trains on the 20 % of
each row's hint tokens with the highest old-policy entropy); hints are placed at their own positions (the code
stretches a short reference over the canvas by up to 1.5x); the last chunk is not always shown (the code always shows
it, which for a reference ending in ``\\boxed{}`` shows the answer); the triggering and replacement are per group of
the whole rollout (the code's per device batch is one group); the reference model is never synced to the policy
(the code's TRL ``ref_model_sync_steps: 64``). Masked families only: a block family decodes blocks
left to right, so a block never sees the hints placed in later blocks.
"""

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..config import one_of
from ..likelihood import MeanField
from . import register
from .base import Advantage, Algorithm, LossMask
from .core import clipped_ratio_loss, kl_estimate, masked_stats, token_mean

RATIO_LEVELS = ("sequence", "token")


def hint_canvas(reference: list[int], length: int, share: float, chunk_min: int, chunk_max: int, free_tail: int,
                mask_id: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``(canvas, given)`` ``[length]``: the reference's first ``length - free_tail`` tokens cut left to right into
    chunks of ``chunk_min..chunk_max`` tokens, ``round(share x chunks)`` of them (chosen uniformly) shown at their own
    positions, masks elsewhere."""
    ids = reference[:max(length - free_tail, 0)]
    bounds, start = [], 0
    while start < len(ids):
        size = int(torch.randint(chunk_min, chunk_max + 1, (1,), generator=generator))
        bounds.append((start, min(start + size, len(ids))))
        start += size
    canvas = torch.full((length,), mask_id, dtype=torch.long)
    given = torch.zeros(length, dtype=torch.bool)
    for c in torch.randperm(len(bounds), generator=generator)[:round(share * len(bounds))].tolist():
        a, b = bounds[c]
        canvas[a:b], given[a:b] = torch.tensor(ids[a:b]), True
    return canvas, given


def reference_of(row: dict) -> str | None:
    extra = row.get("extra_info") or {}
    return extra.get("solution") or extra.get("answer") or None


@register("igpo")
@dataclass
class IGPO(Algorithm):
    """IGPO: all-failed groups decoded again with reference fragments inpainted; the successes join the group."""

    objective: ClassVar[str] = r"""$$r_i = \exp\Big(\frac{1}{\sum_k m_{ik}} \sum_k m_{ik} \big(\ell_\theta(i, k) -
    \ell_{\theta_{old}}(i, k)\big)\Big)$$

    $$\mathcal{L}(\theta) = -\operatorname{mean}_i\, \mathcal{C}(r_i, A_i)$$

    A group whose completions all fail is decoded again with fragments of the reference solution fixed in the canvas;
    its hinted successes replace original completions, the advantages are taken over the mixed group, and the hint
    tokens stay out of $m$. $\ell$: d1's one-step estimate."""

    families: ClassVar[tuple[str, ...]] = ("llada", "dream", "llada_v", "mmada")
    why_not: ClassVar[str] = "a block family decodes blocks left to right: a block never sees later blocks' hints"
    needs_sampler: ClassVar[str] = "decodings from a canvas with given (hint) tokens"

    hint_low: float = 0.2  # the least share of the reference's chunks shown to a hinted completion
    hint_high: float = 0.6  # the largest share
    chunk_min: int = 5  # chunk sizes of the reference, in tokens
    chunk_max: int = 10
    free_tail: int = 30  # canvas positions at the end never hinted (room for the answer)
    replace_fraction: float = 0.5  # at most floor(this x G) successful hinted completions replace a group's own
    p_prompt: float = 0.0  # d1's prompt masking in the likelihood (the code: none)
    # sequence: GSPO's ratio, exp of the row's mean log-ratio over its loss tokens (the authors' run: use_gspo) |
    # token: one ratio per token
    ratio_level: one_of(*RATIO_LEVELS) = "sequence"
    advantage: Advantage = "drgrpo"  # the code: r - mean
    loss_mask: LossMask = "all"

    def validate(self, family):
        if not 0 <= self.hint_low <= self.hint_high <= 1:
            raise ValueError(f"need 0 <= hint_low <= hint_high <= 1, got {self.hint_low}, {self.hint_high}")
        if not 1 <= self.chunk_min <= self.chunk_max:
            raise ValueError(f"need 1 <= chunk_min <= chunk_max, got {self.chunk_min}, {self.chunk_max}")
        if self.free_tail < 0 or not 0 <= self.replace_fraction <= 1:
            raise ValueError(f"need free_tail >= 0 and 0 <= replace_fraction <= 1, got {self.free_tail}, "
                             f"{self.replace_fraction}")
        return super().validate(family)

    def estimator(self, family, sampling):
        return MeanField(self.p_prompt)

    def rollout(self, engine, prompts, n, sampling, seed, *, rows=None, score=None):
        first = engine.generate(prompts, n, sampling, seed)
        if rows is None or score is None:
            return first
        solved = torch.tensor([r.acc > 0 for r in score(first.texts, list(range(len(first.texts))))]).view(-1, n)
        references = [reference_of(row) for row in rows]
        failed = [g for g in range(len(prompts)) if not solved[g].any() and references[g]]
        first.stats = {"igpo/failed_groups": (float((~solved.any(-1)).sum()), float(len(prompts)))}
        if not failed:
            return first
        generator = torch.Generator().manual_seed(seed)
        tokens = [engine.tokenizer(references[g], add_special_tokens=False)["input_ids"] for g in failed]
        canvases, givens = zip(*[hint_canvas(ids, sampling.gen_length, self.hint_low + (self.hint_high - self.hint_low)
                                             * float(torch.rand((), generator=generator)), self.chunk_min,
                                             self.chunk_max, self.free_tail, engine.family.mask_id, generator)
                                 for ids in tokens for _ in range(n)], strict=True)
        hinted = engine.generate([prompts[g] for g in failed], n, sampling, (seed + 1) % 2 ** 63,
                                 canvas=torch.stack(canvases), given=torch.stack(givens))
        picks = [g * n + k for g in failed for k in range(n)]
        good = torch.tensor([r.acc > 0 for r in score(hinted.texts, picks)]).view(-1, n)
        keep = int(self.replace_fraction * n)
        rows_out, picks_out = [], []
        for j, g in enumerate(failed):
            successes = good[j].nonzero().flatten().tolist()[:keep]
            rows_out += [g * n + k for k in range(len(successes))]
            picks_out += [j * n + k for k in successes]
        out = first.overwrite(rows_out, hinted, picks_out) if rows_out else first
        out.stats = {**first.stats, "igpo/hinted_groups": (float(len(failed)), float(len(prompts))),
                     "igpo/hinted_acc": (float(good.sum()), float(good.numel())),
                     "igpo/replaced": (float(len(rows_out)), float(len(first.texts)))}
        if out.given is None:
            out.given = torch.zeros(out.completion_ids.shape, dtype=torch.bool, device=out.completion_ids.device)
        return out

    def make_batch(self, family, rollout, rewards, group_size, reward_of, step, sampling):
        batch = super().make_batch(family, rollout, rewards, group_size, reward_of, step, sampling)
        if rollout.given is not None:  # the hints are not the policy's choices
            batch["loss_mask"] = batch["loss_mask"] * (~rollout.given.to(batch["loss_mask"].device)).long()
        return batch

    def loss(self, estimate, batch, old_logp, ref_logp, normaliser):
        """``ratio_level: sequence``: every loss token of a row carries the row's ratio ``s = exp(mean_t log(pi /
        pi_old))`` (GSPO-token's form: the value is ``s``, the gradient ``s`` times the token's own log-prob's), clipped
        as one; ``token``: GRPO's per-token ratio."""
        if self.ratio_level == "token":
            return super().loss(estimate, batch, old_logp, ref_logp, normaliser)
        mask = batch["loss_mask"]
        logp = estimate.logp
        weight = mask.to(logp.dtype)
        mean_log_ratio = ((logp - old_logp) * weight).sum(-1) / weight.sum(-1).clamp(min=1)
        ratio = torch.exp(logp - logp.detach() + mean_log_ratio.detach()[:, None])
        per_token, engaged = clipped_ratio_loss(ratio, batch["advantages"][:, None], self.eps_low, self.eps_high,
                                                self.dual_clip)
        stats = {"clip_fraction": engaged, "ratio": ratio.detach()}
        if estimate.entropy is not None:
            stats["entropy"] = estimate.entropy
        if self.beta:
            kl = kl_estimate(logp, old_logp if self.kl_to == "rollout" else ref_logp, self.kl)
            per_token = per_token + self.beta * kl
            stats["kl"] = kl.detach()
        return token_mean(per_token, mask, normaliser), masked_stats(stats, mask)
