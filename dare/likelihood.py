"""Log-likelihood estimators of completions under a diffusion LM, by name.

The contract every estimator follows (so an algorithm file only picks one and its knobs):

* ``corrupt(family, batch, generator) -> noise``: draw the noise (a dict of tensors whose first dimension is the
  batch row). The trainer stores it so the old, reference and current policy score exactly the same noisy input.
* ``score(model, family, batch, noise) -> Estimate``: log-likelihoods of the completion — per token ``[N, R]``
  (or per sequence for ELBO-style estimators) — through ``Family.logits`` so Dream's shift and the block families'
  ``[x_t ‖ x_0]`` layout are handled once.

``batch`` holds ``prompt_ids``/``prompt_mask`` ``[N, P]`` (left-padded) and ``completion_ids``/``completion_mask``
``[N, R]`` (the rollout's mask: up to and including the first stop token). An optional ``attention_mask``
``[N, P+R]`` replaces the rollout's attention (``rollout_attention``): offline pairs attend no padding in any family.

``batch["loss_mask"]`` marks the completion tokens an estimate is about (the maskable ones of the ELBO estimators).
Estimators with several Monte-Carlo draws score one draw with ``score(..., draw=j)`` so an algorithm can stream
them (one graph alive at a time). Untempered logits everywhere except the AR estimator (its sampler's T).

Uniform-noise families (``Family.noise == "uniform"``, DiffusionGemma) have no mask token: a noised position holds
a random token, the completion is scored canvas by canvas from the prompt's end (``canvas_logits``: whole canvases,
the encoder reading the prompt and the clean earlier canvases), and the canvas positions outside the loss mask (after
the stop token) hold pure noise whatever the draw: like a masked tail, they reveal nothing of the completion's length.

mean_field  d1: completion fully masked, prompt tokens masked w.p. p_prompt; per-token log p, one forward.
            Uniform noise (DiffusionGemma): the completion's canvases all random tokens (the first decoding step's
            input), prompt tokens replaced by random ones w.p. p_prompt.
coupled     Coupled-GRPO: full-mask pass + a complementary pair (t ~ U[t_min, t_max]) weighted 1/t, 1/(1-t).
random_masking  UniGRPO (dLLM-RL): K copies per row, copy j hiding each completion token w.p. t_j ~ U[t_min, t_max],
            the prompt clean; per-token log p ``[N, K, R]`` with the masks (the loss reads the hidden tokens).
remasking   MaskGRPO: the completion re-masked at a ratio (fading: later tokens hidden likelier), the prompt clean;
            per-token log p ``[N, R]`` with the mask.
mc_elbo     BGPO: K stratified mask counts, ``e_j = (sum_masked log p / p_j) / L`` per draw ``[N, K]`` (VRPO: no / L).
block_elbo  EBPO: per (draw, block) stratified levels, >= 1 target per block, all blocks in one forward (masked
            families: one per semi-AR block); ``[N, rows]``.
seq_elbo    ESPO: batch-stratified counts in [0, L], complementary second half; ``E / L`` per draw ``[N, K]``.
quadrature_elbo  GDPO: the ELBO's time integral on Gauss-Legendre nodes, Bernoulli(t_n) masks; ``E / L`` per draw.
                 Uniform noise: the same nodes, each token re-drawn w.p. t_n, ``dare.diffusion.uniform_elbo_terms``.
sandwich    SPG: block-random masks; per-sequence lower (mean masked log p) and upper (Renyi, beta) bounds.
ar          JustGRPO: exact left-to-right log-likelihood with the sampler's temperature, one position per forward.
trajectory  CJ-GRPO: the rollout's own decoding steps replayed, each token scored from the state that committed it.
sampled_steps  AGRPO: a few of those steps drawn per row (every block at once), weighted to be unbiased.
step_prediction  MDPO: each recorded step's whole-canvas prediction scored from the canvas before that step.
edge_transition  d-TreeRPO: a tree node's children scored from the node's state, one forward for all of them
                 (block families: one per child, the child being the clean copy).
"""

from dataclasses import dataclass

import numpy
import torch

from .diffusion import (
    batch_stratified_counts,
    block_random_masks,
    block_stratified_masks,
    corrupt,
    corrupt_uniform,
    random_subset,
    stratified_counts,
    uniform,
    uniform_elbo_terms,
)


@dataclass
class Estimate:
    logp: torch.Tensor  # per-token [N, R] (or per-sequence for ELBO-type estimators), differentiable
    entropy: torch.Tensor | None = None  # [N, R], detached: entropy of the prediction at each completion position


def rollout_attention(family, prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> torch.Tensor:
    """Attention over ``prompt ‖ completion`` as the sampler saw it: a masked-diffusion canvas is attended in full
    (its EOS tail included); a block-diffusion completion ends at its stop token (later positions are padding)."""
    tail = completion_mask if family.is_block_diffusion else torch.ones_like(completion_mask)
    return torch.cat([prompt_mask, tail], dim=1).long()


def batch_attention(family, batch) -> torch.Tensor:
    """Attention over ``prompt ‖ completion``: the batch's own ``attention_mask``, else as the sampler saw it."""
    attention = batch.get("attention_mask")
    return rollout_attention(family, batch["prompt_mask"], batch["completion_mask"]) if attention is None else attention


def score_tokens(model, family, batch, noisy: torch.Tensor, temperature: float = 1.0, banned: tuple = (),
                 positions: torch.Tensor | None = None, targets: torch.Tensor | None = None,
                 clean_cache=None, keep=None) -> Estimate:
    """``log p(y_k | noisy)`` for the completion positions of ``prompt ‖ completion`` (all of them, or the completion
    indices ``positions``) given the noisy version. ``banned`` token ids get probability 0 (as in the sampler);
    ``keep``: the sampler's top-k / top-p filter of logits (``-inf`` for the tokens it removes), applied before the
    temperature as the sampler draws; the scored token always stays (the rollout drew it from the rollout policy's
    filtered set). ``targets`` ``[N, C, R]``: score C candidate completions from the one forward instead (``logp``
    ``[N, C, R]``). ``clean_cache``: ``shared_clean``'s cache of this batch (block families: only the noisy half is
    fed)."""
    completion = batch["completion_ids"]
    if family.noise == "uniform":
        if temperature != 1.0 or banned or positions is not None or targets is not None or keep is not None:
            raise ValueError(f"{family.name}: uniform-noise scoring takes whole canvases, untempered")
        logp = canvas_logits(model, family, batch, noisy).log_softmax(-1)
        return Estimate(logp.gather(-1, completion[..., None])[..., 0], entropy_of(logp))
    logits = completion_logits(model, family, batch, noisy, positions, clean_cache)
    logits = logits if logits.dtype == torch.float64 else logits.float()  # bf16/fp16 models: log-softmax in fp32
    if banned:
        logits[..., list(banned)] = float("-inf")
    single = completion if positions is None else completion[:, positions]
    if keep is not None:
        if targets is not None:
            raise ValueError("filtered scoring takes the completion's own tokens, not candidate targets")
        logits = keep(logits).scatter(-1, single[..., None], logits.gather(-1, single[..., None]))
    if temperature != 1.0:
        logits = logits / temperature
    logp = logits.log_softmax(-1)
    entropy = entropy_of(logp)
    if targets is not None:
        return Estimate(logp.gather(-1, targets.transpose(1, 2)).transpose(1, 2), entropy)
    return Estimate(logp.gather(-1, single[..., None])[..., 0], entropy)


def completion_logits(model, family, batch, noisy: torch.Tensor, positions: torch.Tensor | None = None,
                      clean_cache=None):
    """``Family.logits`` of the completion positions (all, or the completion indices ``positions``) of the noisy
    ``prompt ‖ completion``, in the family's training layout (block families: ``[x_t ‖ x_0]``). A family that
    decodes against a causal context (Nemotron-Labs-Diffusion) is read as its sampler decodes: blocks of
    ``causal_block`` from the completion's first position, each noisy block against the clean context read left to
    right, its first token from that causal reading (``_causal_context_logits``)."""
    prompt, completion = batch["prompt_ids"], batch["completion_ids"]
    attention = batch_attention(family, batch)
    if family.causal_block is not None:
        return _causal_context_logits(model, family, batch, noisy, attention, positions)
    keep = completion.shape[1] if positions is None else positions + prompt.shape[1]
    clean = torch.cat([prompt, completion], dim=1) if family.is_block_diffusion else None
    if family.is_block_diffusion:
        noisy, clean, attention = whole_blocks(family, noisy, clean, attention)
        if not torch.is_tensor(keep):
            keep = torch.arange(prompt.shape[1], prompt.shape[1] + keep, device=noisy.device)
        if clean_cache is None:  # one draw: the same two passes as a shared clean half, so every path agrees
            clean_cache = family.clean_cache(model, clean, attention)
    cached = {} if clean_cache is None else {"clean_cache": clean_cache}
    return family.logits(model, noisy, attention, clean_ids=clean, keep=keep, **cached)


def _causal_context_logits(model, family, batch, noisy, attention, positions):
    """``completion_logits`` of a family that decodes against a causal context: each block's first token from the
    causal reading of everything before it (the sampler takes it from that pass), the others from the noisy block
    read against the clean context (one ``[x_t ‖ x_0]`` call, blocks from the completion's first position)."""
    prompt, completion = batch["prompt_ids"], batch["completion_ids"]
    width, length = prompt.shape[1], completion.shape[1]
    index, order = (torch.arange(length, device=completion.device), None) if positions is None else positions.sort()
    keep = torch.zeros(noisy.shape, dtype=torch.bool, device=noisy.device)
    keep[:, width + index] = True
    first = index[index % family.causal_block == 0]  # kept block-first positions, read at the column before
    seeds = torch.zeros_like(keep)
    seeds[:, width + first - 1] = True
    diffusion, causal = family.logits(model, noisy, attention, clean_ids=torch.cat([prompt, completion], dim=1),
                                      keep=keep, clean_keep=seeds, block_origin=batch["prompt_mask"].sum(-1))
    logits = diffusion.view(len(noisy), len(index), -1).clone()
    logits[:, index % family.causal_block == 0] = causal.view(len(noisy), len(first), -1)
    return logits if order is None else logits[:, order.argsort()]  # back in the order of ``positions``


def check_scoring(family, sampling) -> None:
    """Refuse a rollout decoding that the estimators cannot read back: a family that decodes against a causal
    context is scored in blocks of its ``causal_block`` (``completion_logits``), which a speculative decoding (its
    tokens are the causal pass's) or another block length did not decode."""
    if family.causal_block is None:
        return
    if sampling.speculative:
        raise ValueError(f"rollout: {family.name}'s RL scores its block decoding; speculative rollouts decode "
                         "autoregressively: leave rollout.speculative off")
    if sampling.block_length not in (None, family.causal_block):
        raise ValueError(f"rollout: {family.name}'s RL scores blocks of {family.causal_block} (its config's "
                         f"block_size), got rollout.block_length {sampling.block_length}")


def shared_clean(model, family, batch, draws: int):
    """No-grad scoring of ``draws`` > 1 noisy versions of one batch in a block family: the clean half of ``[x_t ‖
    x_0]`` does not depend on the noise, so its keys and values are computed once here and every draw feeds its
    noisy half only (``Family.clean_cache``). Every other draw makes the same two passes itself
    (``completion_logits``), so a draw scores the same numbers shared or alone, with or without a graph (a policy
    at the reference has a margin of exactly 0, a ratio of exactly 1); with a graph each draw keeps its own clean
    pass, so its gradient sums as before whether draws are streamed or not. None for one draw, with a graph, or
    where the family (its wrapper, activation checkpointing in training mode) keeps the one-call layout."""
    if draws < 2 or torch.is_grad_enabled() or not family.is_block_diffusion or family.noise != "mask":
        return None
    attention = batch_attention(family, batch)
    clean = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    _, clean, attention = whole_blocks(family, clean, clean, attention)
    return family.clean_cache(model, clean, attention)


def token_values(value_model, family, batch, noisy: torch.Tensor) -> torch.Tensor:
    """``[N, R]``: a value model's prediction (its one-output head) at every completion position of the noisy input,
    read where the policy's log-probs are (``completion_logits``)."""
    values = completion_logits(value_model, family, batch, noisy)[..., 0]
    return values if values.dtype == torch.float64 else values.float()


def canvas_width(family, completion_width: int) -> int:
    """Uniform-noise families: columns of whole canvases covering a completion of ``completion_width`` tokens."""
    return -(-completion_width // family.block_size) * family.block_size


def uniform_noisy(family, batch, t, generator=None, p_prompt: float = 0.0) -> torch.Tensor:
    """``prompt ‖ canvases`` ``[N, P + W]`` (W = ``canvas_width``) for a uniform-noise family: each loss token
    re-drawn uniformly with probability ``t`` (``[N]`` or a float; 1: pure noise), every other canvas position
    always re-drawn, each real prompt token with probability ``p_prompt``."""
    prompt, completion = batch["prompt_ids"], batch["completion_ids"]
    width = canvas_width(family, completion.shape[1])
    grow = width - completion.shape[1]
    completion = torch.nn.functional.pad(completion, (0, grow), value=family.pad_id)
    loss = torch.nn.functional.pad(batch["loss_mask"].bool(), (0, grow))
    t = torch.as_tensor(t, dtype=torch.float32, device=prompt.device).expand(len(prompt))
    noised = ~loss | (uniform(completion.shape, generator, prompt.device) < t[:, None])
    hit = batch["prompt_mask"].bool() & (uniform(prompt.shape, generator, prompt.device) < p_prompt)
    return torch.cat([corrupt_uniform(prompt, hit, family.vocab_size, generator),
                      corrupt_uniform(completion, noised, family.vocab_size, generator)], dim=1)


def canvas_logits(model, family, batch, noisy: torch.Tensor) -> torch.Tensor:
    """Uniform-noise families: logits ``[N, R, V]`` (float32) of the completion's positions, every canvas read by the
    decoder from ``noisy`` (``uniform_noisy``) against the encoder's pass over ``noisy``'s prompt (noised where the
    estimator noised it) and the clean completion: each canvas sees the clean canvases before it, as in decoding.
    The canvases attended are those holding the attended completion (up to its stop token, or ``attention_mask``)."""
    prompt, completion = batch["prompt_ids"], batch["completion_ids"]
    n, width_p, width_r = len(prompt), prompt.shape[1], completion.shape[1]
    width = canvas_width(family, width_r)
    attention = batch_attention(family, batch)
    length = attention[:, width_p:].sum(-1)
    cols = torch.arange(width, device=prompt.device)[None]
    canvases = cols < (family.block_size * -(-length // family.block_size))[:, None]
    clean = torch.cat([noisy[:, :width_p],
                       torch.nn.functional.pad(completion, (0, width - width_r), value=family.pad_id)], dim=1)
    attention = torch.cat([attention[:, :width_p].long(), canvases.long()], dim=1)
    start = torch.full((n,), width_p, dtype=torch.long, device=prompt.device)
    logits = family.logits(model, noisy, attention, clean_ids=clean, start=start, keep=width)
    return logits[:, :width_r].float()


@torch.no_grad()
def entropy_of(logp: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """``-sum p log p`` over the last dimension (a diagnostic: no graph), ``chunk`` positions at a time: the
    temporaries stay ``chunk x vocab`` instead of three tensors the size of the logits (banned tokens, at -inf, count
    0). About 9x faster than the whole-tensor form over a 126k vocabulary on one CPU thread."""
    out = torch.empty(logp.shape[:-1], dtype=logp.dtype, device=logp.device)
    rows, values = logp.reshape(-1, logp.shape[-1]), out.view(-1)
    for start in range(0, len(rows), chunk):
        part = rows[start:start + chunk]
        values[start:start + chunk] = -(part.exp() * part).nansum(-1)
    return out


def whole_blocks(family, noisy: torch.Tensor, clean: torch.Tensor, attention: torch.Tensor):
    """Block families: the attended sequence continued with masks to the end of its last block, as the sampler saw
    it (the official samplers decode the last block whole and cut the output; the block of a stop token was decoded
    with masks after it). Columns are appended on the right where a row runs past the batch's width."""
    block = family.block_size
    width = attention.shape[1]
    end = width - attention.flip(-1).long().argmax(-1)  # one past each row's last attended column
    extra = (-attention.sum(-1)) % block  # masks that complete the last block
    grow = max(int((end + extra).max()) - width, 0)
    if grow:
        noisy, clean = (torch.nn.functional.pad(t, (0, grow), value=family.mask_id) for t in (noisy, clean))
        attention = torch.nn.functional.pad(attention, (0, grow))
    cols = torch.arange(width + grow, device=noisy.device)[None]
    tail = (cols >= end[:, None]) & (cols < (end + extra)[:, None])
    return noisy.masked_fill(tail, family.mask_id), clean.masked_fill(tail, family.mask_id), attention | tail.long()


def _masked_input(family, batch, completion_masked: torch.Tensor, prompt: torch.Tensor | None = None):
    """``prompt ‖ completion`` with the given completion positions masked. Completion positions outside the loss
    mask (the EOS tail under ``upto_first_eos``) are always masked: conditioning on them would reveal the length."""
    hidden = completion_masked.bool() | ~batch["loss_mask"].bool()
    completion = batch["completion_ids"].masked_fill(hidden, family.mask_id)
    return torch.cat([batch["prompt_ids"] if prompt is None else prompt, completion], dim=1)


def _maskable(batch) -> torch.Tensor:
    return batch["loss_mask"].bool()


@dataclass
class MeanField:
    """d1's one-step mean-field estimate (fully masked completion, prompt tokens masked w.p. ``p_prompt``)."""

    p_prompt: float = 0.15

    def corrupt(self, family, batch, generator: torch.Generator | None = None) -> dict:
        if family.noise == "uniform":
            return {"noisy": uniform_noisy(family, batch, 1.0, generator, self.p_prompt)}
        noisy_prompt, _ = corrupt(batch["prompt_ids"], batch["prompt_mask"].bool(), self.p_prompt, family.mask_id,
                                  generator)
        return {"noisy": torch.cat([noisy_prompt, torch.full_like(batch["completion_ids"], family.mask_id)], dim=1)}

    def score(self, model, family, batch, noise) -> Estimate:
        return score_tokens(model, family, batch, noise["noisy"])


@dataclass
class Coupled:
    """DiffuCoder's coupled estimate: ``½ [l_full + (u < t ? l_a / t : l_b / (1 - t))]`` per token, where the
    pair masks complementary halves of the attended completion (every token scored exactly once in the pair).
    One ``t ~ U[t_min, t_max]`` per call (per inner iteration), a uniform ``u`` per token."""

    t_min: float = 0.2
    t_max: float = 0.8
    p_prompt: float = 0.0

    def corrupt(self, family, batch, generator=None) -> dict:
        completion = batch["completion_ids"]
        t = self.t_min + (self.t_max - self.t_min) * uniform((1,), generator, completion.device)
        u = uniform(completion.shape, generator, completion.device)
        attended = rollout_attention(family, batch["prompt_mask"], batch["completion_mask"])[:, -completion.shape[1]:]
        noisy_prompt, _ = corrupt(batch["prompt_ids"], batch["prompt_mask"].bool(), self.p_prompt, family.mask_id,
                                  generator)
        return {"t": t.expand(len(completion)), "first": attended.bool() & (u < t), "noisy_prompt": noisy_prompt}

    def score(self, model, family, batch, noise) -> Estimate:
        completion = batch["completion_ids"]
        attended = rollout_attention(family, batch["prompt_mask"], batch["completion_mask"])[:, -completion.shape[1]:]
        first, t = noise["first"], noise["t"][:, None]
        passes = [attended.bool(), first, attended.bool() & ~first]
        noisy = torch.cat([torch.cat([noise["noisy_prompt"], completion.masked_fill(m, family.mask_id)], 1)
                           for m in passes])
        stacked = {k: torch.cat([v] * 3) for k, v in batch.items() if torch.is_tensor(v)}
        scored = score_tokens(model, family, stacked, noisy)
        full, a, b = scored.logp.chunk(3)
        return Estimate(0.5 * (full + torch.where(first, a / t, b / (1 - t))), scored.entropy.chunk(3)[0])


def masked_copies(model, family, batch, masks: torch.Tensor) -> Estimate:
    """``log p(y_k | copy j)`` of every completion token from K copies of each row, copy j hiding the completion
    positions ``masks[:, j]`` (``[N, K, R]``; the prompt clean, positions outside the loss mask always hidden), all in
    one forward: ``logp`` ``[N, K, R]``, the entropy of the first copy's predictions."""
    n, k, width = masks.shape
    noisy = torch.cat([_masked_input(family, batch, masks[:, j]) for j in range(k)])  # copy-major
    stacked = {key: torch.cat([value] * k) for key, value in batch.items() if torch.is_tensor(value)}
    scored = score_tokens(model, family, stacked, noisy)
    return Estimate(scored.logp.view(k, n, width).transpose(0, 1), scored.entropy.view(k, n, width)[0])


@dataclass
class RandomMasking:
    """UniGRPO's random masking as its authors' RL code draws it (dLLM-RL ``random_masking``): ``draws`` copies of each
    completion, copy j hiding each scored token w.p. its own ``t_j ~ U[t_min, t_max]``, the prompt clean; per-token
    ``log p`` of every token from each copy, ``[N, draws, R]``, with the masks (``noise["masks"]``)."""

    draws: int = 2
    t_min: float = 0.1
    t_max: float = 0.9

    def corrupt(self, family, batch, generator=None) -> dict:
        completion = batch["completion_ids"]
        n, width = completion.shape
        t = self.t_min + (self.t_max - self.t_min) * uniform((n, self.draws, 1), generator, completion.device)
        hidden = uniform((n, self.draws, width), generator, completion.device) < t
        return {"masks": _maskable(batch)[:, None] & hidden}

    def score(self, model, family, batch, noise) -> Estimate:
        return masked_copies(model, family, batch, noise["masks"])


@dataclass
class Remasking:
    """MaskGRPO's re-masked completion at mask ratio ``ratio`` (the prompt clean), one copy: ``fading`` (its AR-like
    mode) keeps position j of R w.p. ``min(1, 2 (1 - ratio) (1 - j / (R - 1)))``, a line falling to 0 whose mean is
    ``1 - ratio`` (early tokens mostly visible, late ones mostly hidden); otherwise each token is hidden w.p.
    ``ratio``. Per-token ``log p`` ``[N, R]`` of every token, with the masks ``[N, 1, R]`` (the loss reads the hidden
    ones); only loss-mask positions are drawn (the rest are hidden anyway)."""

    ratio: float = 0.6
    fading: bool = True

    def corrupt(self, family, batch, generator=None) -> dict:
        completion = batch["completion_ids"]
        width = completion.shape[1]
        if self.fading:
            line = torch.linspace(1, 0, width, device=completion.device)
            keep = (line * (1 - self.ratio) * width / line.sum()).clamp(max=1.0)
        else:
            keep = torch.full((width,), 1 - self.ratio, device=completion.device)
        hidden = uniform(completion.shape, generator, completion.device) >= keep
        return {"masks": (_maskable(batch) & hidden)[:, None]}

    def score(self, model, family, batch, noise) -> Estimate:
        return score_tokens(model, family, batch, _masked_input(family, batch, noise["masks"][:, 0]))


@dataclass
class MCElbo:
    """BGPO's K-sample ELBO: draw j masks ``x_j`` (stratified, 1..L) random completion tokens, ``p_j = x_j / L``;
    ``e_j = sum_masked log p(y_k | z_j) / p_j / L``. Returns ``[N, K]`` (or ``[N, 1]`` for one draw). With
    ``per_token=False`` the values are not divided by L: ``(L / x_j) sum_masked log p`` (VRPO's sequence ELBO)."""

    samples: int = 16
    per_token: bool = True

    def corrupt(self, family, batch, generator=None) -> dict:
        maskable = _maskable(batch)
        lengths = maskable.sum(-1)
        counts = stratified_counts(lengths, self.samples, generator)
        masks = random_subset(maskable[:, None].expand(-1, self.samples, -1), counts, generator)
        return {"masks": masks, "p": counts / lengths.clamp(min=1)[:, None]}

    def score(self, model, family, batch, noise, draw: int | None = None) -> Estimate:
        draws = range(self.samples) if draw is None else [draw]
        length = _maskable(batch).sum(-1).clamp(min=1)
        values, clean = [], shared_clean(model, family, batch, len(draws))
        for j in draws:
            masked = noise["masks"][:, j]
            logp = score_tokens(model, family, batch, _masked_input(family, batch, masked), clean_cache=clean).logp
            value = (logp * masked).sum(-1) / noise["p"][:, j].clamp(min=1e-12)
            values.append(value / length if self.per_token else value)
        return Estimate(torch.stack(values, -1))


@dataclass
class AntitheticElbo(MCElbo):
    """DMPO's masks (its code's ``loss_antithetic`` with ``loss_mask_prob_clamp``): draws come in pairs, a Bernoulli
    mask at rate ``lambda = 0.1 + 0.9 U`` over the maskable tokens and its complement among them (draw j and draw
    j + K/2); each draw's value is ``(1/m) sum_masked log p`` (m its masked count, at least 1): ``MCElbo``'s value with
    ``p = m / L``. ``samples`` must be even."""

    def corrupt(self, family, batch, generator=None) -> dict:
        if self.samples % 2:
            raise ValueError(f"antithetic masks come in pairs: samples must be even, got {self.samples}")
        maskable = _maskable(batch)
        rows, half = len(maskable), self.samples // 2
        rate = 0.1 + 0.9 * uniform((rows, half, 1), generator, maskable.device)
        first = (uniform((rows, half, maskable.shape[-1]), generator, maskable.device) < rate) & maskable[:, None]
        masks = torch.cat([first, ~first & maskable[:, None]], 1)
        counts = masks.sum(-1).clamp(min=1)
        return {"masks": masks, "p": counts / maskable.sum(-1).clamp(min=1)[:, None]}


@dataclass
class BlockElbo:
    """EBPO's composite block ELBO: for each of ``samples`` rows, every block of the completion masks >= 1 token at
    a stratified level; the row's value is ``sum log p / p``. Returns ``[N, rows]`` (the composite ELBO is their
    mean; not length-normalised). Block families: blocks on the global grid, all scored in one ``[x_t ‖ x_0]``
    forward. Masked families: the semi-autoregressive blocks of the sampler (``block``, counted from the
    completion's start), block b scored from the clean earlier blocks, its noisy self and fully masked later blocks
    (the state the semi-AR sampler decoded it in): one forward per block."""

    samples: int = 16
    block: int | None = None  # masked families: the sampler's block length

    def corrupt(self, family, batch, generator=None) -> dict:
        size, offsets = self._grid(family, batch)
        masks, p = block_stratified_masks(_maskable(batch), offsets, size, self.samples, generator)
        return {"masks": masks, "p": p}

    def _grid(self, family, batch):
        if family.is_block_diffusion:
            return family.block_size, batch["prompt_mask"].sum(-1)
        if self.block is None:
            raise ValueError("the composite block ELBO of a masked-diffusion family needs the sampler's block length")
        return self.block, torch.zeros(len(batch["prompt_mask"]), dtype=torch.long, device=batch["prompt_mask"].device)

    def score(self, model, family, batch, noise, draw: int | None = None) -> Estimate:
        draws = range(self.samples) if draw is None else [draw]
        size, offsets = self._grid(family, batch)
        values, clean = [], shared_clean(model, family, batch, len(draws))
        for n in draws:
            masked, weight = noise["masks"][:, n], masked_weight(noise, n)
            if family.is_block_diffusion:
                logp = score_tokens(model, family, batch, _masked_input(family, batch, masked), clean_cache=clean).logp
                values.append((logp * weight).sum(-1))
                continue
            block_of = (offsets[:, None] + torch.arange(masked.shape[1], device=masked.device)) // size
            value = 0.0
            for b in block_of.unique().tolist():
                here = block_of == b
                hidden = (masked & here) | (block_of > b)
                logp = score_tokens(model, family, batch, _masked_input(family, batch, hidden)).logp
                value = value + (logp * weight * here).sum(-1)
            values.append(value)
        return Estimate(torch.stack(values, -1))


def masked_weight(noise, n):
    """``1 / p`` on the tokens draw ``n`` masks, 0 elsewhere."""
    return noise["masks"][:, n] / noise["p"][:, n].clamp(min=1e-12)


@dataclass
class SequenceElbo:
    """ESPO's sequence ELBO per draw ``[N, K]``: x in [0, L] masked tokens (stratified across the batch),
    ``p = x / (L+1)``, ``E = sum_masked log p / p``; with ``coupled`` the complementary positions are scored in a
    second forward with weight ``1 / (L/(L+1) - p)`` and the halves averaged. Values are divided by L."""

    samples: int = 2
    coupled: bool = True

    def corrupt(self, family, batch, generator=None) -> dict:
        maskable = _maskable(batch)
        lengths = maskable.sum(-1)
        counts = torch.stack([batch_stratified_counts(lengths, generator) for _ in range(self.samples)], -1)
        masks = random_subset(maskable[:, None].expand(-1, self.samples, -1), counts, generator)
        return {"masks": masks, "p": counts / (lengths + 1)[:, None]}

    def score(self, model, family, batch, noise, draw: int | None = None) -> Estimate:
        maskable = _maskable(batch)
        length = maskable.sum(-1)
        draws = range(self.samples) if draw is None else [draw]
        values, clean = [], shared_clean(model, family, batch, len(draws) * (1 + self.coupled))
        for j in draws:
            masked, p = noise["masks"][:, j], noise["p"][:, j]
            logp = score_tokens(model, family, batch, _masked_input(family, batch, masked), clean_cache=clean).logp
            value = (logp * masked).sum(-1) / p.clamp(min=1e-12)
            if self.coupled:
                other = maskable & ~masked
                logp = score_tokens(model, family, batch, _masked_input(family, batch, other), clean_cache=clean).logp
                rest = (length / (length + 1) - p).clamp(min=1e-12)
                value = 0.5 * (value + (logp * other).sum(-1) / rest)
            values.append(value / length.clamp(min=1))
        return Estimate(torch.stack(values, -1))


def gauss_legendre(points: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes and weights of the ``points``-point Gauss-Legendre rule on [0, 1] (weights sum to 1; exact for
    polynomials of degree < 2 points), float64, from numpy's ``leggauss``."""
    x, w = numpy.polynomial.legendre.leggauss(points)
    return torch.from_numpy((x + 1) / 2), torch.from_numpy(w / 2)


@dataclass
class QuadratureElbo(MCElbo):
    """GDPO's semi-deterministic Monte-Carlo ELBO per draw ``[N, points x per_point]``: the time integral of
    ``(1/t) E[sum_masked log p]`` on the Gauss-Legendre nodes of [0, 1], each token masked with probability ``t_n``
    at node n (``per_point`` draws per node, one forward each). A draw's ``p`` folds in its quadrature weight
    (``p = K t_n / (D w_n)``), so ``MCElbo``'s plain mean over the D draws is the estimate; divided by L. For the
    forward process's masks the integrand is a polynomial of degree < L in t: exact in expectation when
    L <= 2 points (block families: per block, L the block size).

    Uniform noise: at node n every loss token is re-drawn uniformly with probability ``t_n`` (``uniform_noisy``)
    and a draw's value is ``-(D w_n / K) sum_loss f_i(t_n) / L`` with the uniform ELBO's integrand
    (``dare.diffusion.uniform_elbo_terms``): the mean over the draws is the quadrature of the sequence ELBO. That
    integrand is not a polynomial (it has a log singularity at t = 0): the rule's error falls with ``points``."""

    points: int = 3
    per_point: int = 1

    def __post_init__(self):
        self.samples, self.per_token = self.points * self.per_point, True

    def corrupt(self, family, batch, generator=None) -> dict:
        maskable = _maskable(batch)
        t, w = (v.repeat_interleave(self.per_point).to(maskable.device) for v in gauss_legendre(self.points))
        if family.noise == "uniform":
            n = len(maskable)
            noisy = torch.stack([uniform_noisy(family, batch, float(t_k), generator) for t_k in t], 1)
            return {"noisy": noisy, "t": t.expand(n, -1), "weight": (self.samples * w / self.per_point).expand(n, -1)}
        draws = uniform((len(maskable), self.samples, maskable.shape[1]), generator, maskable.device)
        masks = maskable[:, None] & (draws < t[None, :, None].to(draws.dtype))
        return {"masks": masks, "p": (self.per_point * t / (self.samples * w)).expand(len(maskable), -1)}

    def score(self, model, family, batch, noise, draw: int | None = None) -> Estimate:
        if family.noise != "uniform":
            return super().score(model, family, batch, noise, draw)
        loss = _maskable(batch)
        width_p, width_r = batch["prompt_ids"].shape[1], loss.shape[1]
        values = []
        for j in range(self.samples) if draw is None else [draw]:
            noisy = noise["noisy"][:, j]
            logits = canvas_logits(model, family, batch, noisy)
            terms = uniform_elbo_terms(logits, batch["completion_ids"], noisy[:, width_p:width_p + width_r],
                                       noise["t"][:, j])
            value = -terms.where(loss, 0.0).sum(-1) * noise["weight"][:, j] / loss.sum(-1).clamp(min=1)
            values.append(value.to(logits.dtype))
        return Estimate(torch.stack(values, -1))


@dataclass
class Sandwich:
    """SPG's bounds per sequence ``[N, 2]``: column 0 the lower bound ``mean_j mean_{k in m_j} log p``, column 1 the
    upper bound ``(1/beta) mean_k log mean_j [p^beta 1{k in m_j} / t_j]`` (t_j = |m_j| / L) — or, with ``mix``,
    ``mix * upper + (1 - mix) * lower``. Masks: ``block_random_masks`` plus ``p_prompt`` Bernoulli masking of every
    other token (prompt and the clean earlier completion)."""

    samples: int = 1
    block: int = 32
    beta: float = 1.5
    mix: float = 0.5  # weight of the upper bound in the value used for A <= 0 (1.0: pure upper bound)
    p_prompt: float = 0.15

    def corrupt(self, family, batch, generator=None) -> dict:
        maskable = _maskable(batch)
        block = family.block_size or self.block
        region = block_random_masks(maskable, block, self.samples, generator)
        extra = uniform(region.shape, generator, region.device) < self.p_prompt
        noisy_prompt = [corrupt(batch["prompt_ids"], batch["prompt_mask"].bool(), self.p_prompt, family.mask_id,
                                generator)[0] for _ in range(self.samples)]
        return {"masks": region | (extra & maskable[:, None]), "noisy_prompt": torch.stack(noisy_prompt, 1)}

    def score(self, model, family, batch, noise) -> Estimate:
        logps, clean = [], shared_clean(model, family, batch, self.samples)
        for j in range(self.samples):
            noisy = _masked_input(family, batch, noise["masks"][:, j], noise["noisy_prompt"][:, j])
            logps.append(score_tokens(model, family, batch, noisy, clean_cache=clean).logp)
        lower, upper = sandwich_bounds(torch.stack(logps, 1), noise["masks"], _maskable(batch).sum(-1), self.beta)
        return Estimate(torch.stack([lower, self.mix * upper + (1 - self.mix) * lower], -1))


def sandwich_bounds(logp: torch.Tensor, masks: torch.Tensor, length: torch.Tensor, beta: float):
    """SPG's per-sequence ``(lower, upper)`` from per-draw token log-probs ``[N, J, R]`` and masks ``[N, J, R]``:
    lower = mean_j mean_{k in m_j} log p; upper = (1/beta) mean_{k: a_k > 0} log a_k with
    ``a_k = mean_j p_k^beta 1{k in m_j} / t_j``, ``t_j = |m_j| / L``."""
    masks = masks.to(logp.dtype)
    count = masks.sum(-1)
    lower = ((logp * masks).sum(-1) / count.clamp(min=1)).mean(1)
    t = (count / length.clamp(min=1)[:, None]).clamp(min=1e-12)
    a = (torch.exp(beta * logp) * masks / t[..., None]).mean(1)
    present = a > 0
    upper = (torch.log(a.clamp(min=1e-30)) * present).sum(-1) / present.sum(-1).clamp(min=1) / beta
    return lower, upper


@dataclass
class Autoregressive:
    """JustGRPO's exact AR log-likelihood: position t is scored from ``prompt ‖ y_<t ‖ masks`` with logits / T and
    the sampler's banned tokens; ``chunk`` positions per forward (stacked along the batch)."""

    temperature: float = 1.0
    chunk: int = 1
    banned: tuple = ()

    def corrupt(self, family, batch, generator=None) -> dict:
        return {}

    def score(self, model, family, batch, noise, positions: range | None = None) -> Estimate:
        length = batch["completion_ids"].shape[1]
        positions = range(length) if positions is None else positions
        logps, entropies = [], []
        for start in range(positions.start, positions.stop, self.chunk):
            chunk = torch.arange(start, min(start + self.chunk, positions.stop), device=batch["completion_ids"].device)
            later = torch.arange(length, device=chunk.device)[None] >= chunk[:, None]  # [c, R]: masked from t on
            noisy = torch.cat([_masked_input(family, batch, later[c].expand_as(batch["completion_ids"]))
                               for c in range(len(chunk))])
            stacked = {k: torch.cat([v] * len(chunk)) for k, v in batch.items() if torch.is_tensor(v)}
            est = score_tokens(model, family, stacked, noisy, self.temperature, self.banned, chunk)
            rows = len(batch["completion_ids"])
            pick = torch.arange(len(chunk), device=chunk.device)
            logps.append(est.logp.view(len(chunk), rows, len(chunk))[pick, :, pick].T)
            entropies.append(est.entropy.view(len(chunk), rows, len(chunk))[pick, :, pick].T)
        return Estimate(torch.cat(logps, -1), torch.cat(entropies, -1))


def decoding_path(family, rollout, upto_first_eos: bool = False):
    """``(ids, steps, loss_mask)`` of a rollout's recorded decoding path, as ``Trajectory`` replays it: masked families
    the completion and its global step map (never block-local steps: spec finding 1); block families the replay canvas
    (the whole block of the stop token and the whole last block) and its block-local steps, or the completion and
    ``block_step`` when the sampler kept no replay canvas. ``loss_mask``: every decoded token, or those up to the first
    stop token."""
    if not family.is_block_diffusion:
        ids, steps = rollout.completion_ids, rollout.step_map
    elif rollout.replay_ids is not None:
        ids, steps = rollout.replay_ids, rollout.replay_step
    else:
        ids, steps = rollout.completion_ids, rollout.block_step
    loss_mask = steps >= 0
    if upto_first_eos:
        kept = rollout.completion_mask.bool()
        loss_mask = loss_mask & torch.nn.functional.pad(kept, (0, ids.shape[1] - kept.shape[1]))
    return ids, steps, loss_mask.long()


def canvas_before(family, batch, step) -> torch.Tensor:
    """``prompt ‖ completion`` as the sampler saw it before ``step`` (an int, or a tensor broadcast against
    ``batch["steps"]``): the tokens of earlier steps visible, the rest masked."""
    hidden = (batch["steps"] >= step) | (batch["steps"] < 0)
    return torch.cat([batch["prompt_ids"], batch["completion_ids"].masked_fill(hidden, family.mask_id)], 1)


@dataclass
class Trajectory:
    """CJ-GRPO's replay of the rollout's decoding path. ``batch["steps"]`` ``[N, R]`` holds the step that committed
    each completion token (-1: never decoded): global steps for masked families, block-local ones for block
    families. The state before step s shows the tokens of steps < s and masks the rest; with the ``[x_t ‖ x_0]``
    layout every block's noisy copy replays its own local step s while the clean copy gives the finished earlier
    blocks. ``score(..., step=s)``: log-probs of every position from the state before s (one forward); without
    ``step``: each token's log-prob at the step that committed it (one forward per step)."""

    steps: int = 1

    def corrupt(self, family, batch, generator=None) -> dict:
        return {}

    def score(self, model, family, batch, noise, step: int | None = None, clean_cache=None) -> Estimate:
        if step is not None:
            return score_tokens(model, family, batch, canvas_before(family, batch, step), clean_cache=clean_cache)
        logp = torch.zeros(batch["steps"].shape, device=batch["steps"].device)
        entropy = torch.zeros_like(logp)
        clean = shared_clean(model, family, batch, self.steps)
        for s in range(self.steps):
            at = batch["steps"] == s
            if at.any():
                est = self.score(model, family, batch, noise, s, clean)
                logp, entropy = torch.where(at, est.logp, logp), torch.where(at, est.entropy, entropy)
        return Estimate(logp, entropy)


def trajectory_blocks(family, batch) -> torch.Tensor:
    """``[N, R]``: the block of each replayed position, on the global grid for block families (their steps are
    block-local), 0 for masked families (one global step numbering)."""
    steps = batch["steps"]
    if not family.is_block_diffusion:
        return torch.zeros_like(steps)
    offset = batch["prompt_mask"].sum(-1, keepdim=True)
    grid = (offset + torch.arange(steps.shape[1], device=steps.device)) // family.block_size
    return grid - offset // family.block_size


@dataclass
class SampledSteps:
    """AGRPO's amortised trajectory likelihood: each of ``samples`` draws picks one recorded step of every row (block
    families: one block-local step of every block, all replayed in one forward) and scores the tokens that step
    committed from the canvas before it, with the sampler's temperature, banned tokens and top-k / top-p filter
    (``keep``). The steps of a block are ``0 .. S_b - 1`` (S_b: its last recorded step + 1). ``proposal``: ``uniform``
    draws each with probability ``q = 1 / S_b``; ``entropy`` with ``q`` proportional to ``1e-8 + the summed entropy of
    the tokens it committed`` (``batch["entropy"]``, recorded by the sampler: the authors' proposal).
    ``low_discrepancy``: the batch's uniforms of each block column are stratified over rows x draws (``(perm + U) /
    (N K)``, the authors' draws) instead of independent. ``corrupt`` gives per position the drawn step ``at`` ``[N, K,
    R]`` and the weight ``[N, K, R]`` that makes the draw unbiased: ``1 / (T q)`` (T the row's steps, so the
    expectation is the row's mean over its steps) or ``1 / q`` with ``step_weight="sum"`` (the sum over steps: the
    full-trajectory log-probability)."""

    samples: int = 4
    temperature: float = 1.0
    banned: tuple = ()
    step_weight: str = "mean"
    proposal: str = "uniform"
    low_discrepancy: bool = False
    keep: object = None  # the sampler's top-k / top-p logits filter (score_tokens), or None

    def corrupt(self, family, batch, generator=None) -> dict:
        steps = batch["steps"]
        rows, device = len(steps), steps.device
        block = trajectory_blocks(family, batch).clamp(min=0)
        spans = torch.zeros(rows, int(block.max()) + 1, dtype=torch.long, device=device)
        spans = spans.scatter_reduce(1, block, (steps + 1).clamp(min=0), "amax")  # [N, blocks]: steps of each block
        if self.low_discrepancy:
            shape = (rows * self.samples, spans.shape[1])
            where = generator.device if generator is not None else device
            order = torch.stack([torch.randperm(shape[0], generator=generator, device=where)
                                 for _ in range(shape[1])], 1).to(device)
            u = ((order + uniform(shape, generator, device)) / shape[0]).view(rows, self.samples, -1)
        else:
            u = uniform((rows, self.samples, spans.shape[1]), generator, device)
        total = spans.sum(-1, keepdim=True).clamp(min=1).to(torch.float64)  # T: the row's steps
        scale = 1 / total if self.step_weight == "mean" else torch.ones_like(total)
        if self.proposal == "uniform":
            at = torch.minimum((u * spans[:, None]).floor().long(), (spans[:, None] - 1).clamp(min=0))
            weight = (scale * spans)[:, None].expand(-1, self.samples, -1)  # 1 / q = S_b
        else:
            width = int(spans.max()) if spans.numel() else 0
            live = steps >= 0
            key = block * max(width, 1) + steps.clamp(min=0)
            mass = torch.zeros(rows, spans.shape[1] * max(width, 1), dtype=torch.float64, device=device)
            mass = mass.scatter_add(1, key, (batch["entropy"].double() * live)).view(rows, spans.shape[1], -1)
            inside = torch.arange(mass.shape[-1], device=device) < spans[..., None]
            mass = (mass + 1e-8) * inside
            q = mass / mass.sum(-1, keepdim=True).clamp(min=1e-300)
            cdf = q.cumsum(-1)
            at = torch.searchsorted(cdf[:, None].expand(-1, self.samples, -1, -1).contiguous(),
                                    (u * cdf[:, None, :, -1]).unsqueeze(-1)).squeeze(-1)
            at = torch.minimum(at, (spans[:, None] - 1).clamp(min=0))
            drawn = q[:, None].expand(-1, self.samples, -1, -1).gather(-1, at.unsqueeze(-1)).squeeze(-1)
            weight = torch.where(spans[:, None] > 0, scale[:, None] / drawn.clamp(min=1e-300), 0.0)
        index = block[:, None].expand(-1, self.samples, -1)
        return {"at": at.gather(2, index), "weight": weight.gather(2, index).contiguous()}

    def score(self, model, family, batch, noise, draw: int | None = None) -> Estimate:
        if draw is None:  # every draw (no-grad old / reference scoring): [N, K, R]
            ests = [self.score(model, family, batch, noise, j) for j in range(self.samples)]
            return Estimate(torch.stack([e.logp for e in ests], 1), torch.stack([e.entropy for e in ests], 1))
        return score_tokens(model, family, batch, canvas_before(family, batch, noise["at"][:, draw]), self.temperature,
                            self.banned, keep=self.keep)


@dataclass
class StepPrediction:
    """MDPO's per-step likelihood: for recorded steps ``batch["states"]`` ``[N, K, R]`` (the canvas before the step)
    and ``batch["targets"]`` (that step's whole-canvas prediction), ``log p(target_k | state)`` at every position
    ``[N, K, R]`` (or ``[N, R]`` for one ``step``), one forward per step."""

    def corrupt(self, family, batch, generator=None) -> dict:
        return {}

    def score(self, model, family, batch, noise, step: int | None = None) -> Estimate:
        if step is None:
            ests = [self.score(model, family, batch, noise, k) for k in range(batch["states"].shape[1])]
            return Estimate(torch.stack([e.logp for e in ests], 1), ests[0].entropy)
        noisy = torch.cat([batch["prompt_ids"], batch["states"][:, step]], 1)
        return score_tokens(model, family, {**batch, "completion_ids": batch["targets"][:, step]}, noisy)


@dataclass
class EdgeTransition:
    """d-TreeRPO's edge likelihood: ``batch["completion_ids"]`` holds parent states and ``batch["children"]``
    ``[N, C, R]`` their children; ``log p(child_k | parent)`` for every child from one forward per parent."""

    def corrupt(self, family, batch, generator=None) -> dict:
        return {}

    def score(self, model, family, batch, noise) -> Estimate:
        noisy = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        if not family.is_block_diffusion:
            return score_tokens(model, family, batch, noisy, targets=batch["children"])
        # block families: each child is the clean copy its own blocks are predicted from (one forward per child)
        ests = [score_tokens(model, family, {**batch, "completion_ids": child}, noisy)
                for child in batch["children"].unbind(1)]
        return Estimate(torch.stack([e.logp for e in ests], 1), ests[0].entropy)


ESTIMATORS = {"mean_field": MeanField, "coupled": Coupled, "mc_elbo": MCElbo, "block_elbo": BlockElbo,
              "seq_elbo": SequenceElbo, "quadrature_elbo": QuadratureElbo, "sandwich": Sandwich, "ar": Autoregressive,
              "trajectory": Trajectory, "sampled_steps": SampledSteps, "step_prediction": StepPrediction,
              "edge_transition": EdgeTransition, "random_masking": RandomMasking,
              "remasking": Remasking}


def estimator(name: str, **knobs):
    """A registered estimator, configured with ``knobs``."""
    if name not in ESTIMATORS:
        raise ValueError(f"Unknown likelihood estimator {name!r}; known: {sorted(ESTIMATORS)}")
    return ESTIMATORS[name](**knobs)
