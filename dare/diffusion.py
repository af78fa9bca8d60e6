"""The forward (corruption) process of masked diffusion: draw a noise level per sequence, mask tokens with it.

Shared by SFT (``dare.objectives``) and, later, by the RL likelihood estimators. Nothing here knows a model:
a family enters only through its ``NoiseRecipe`` (data, looked up by ``family.name``) and its mask id.

Per-family SFT recipes (spec models-and-sampling.md §3.2-3.5). Where DARE's reference deviates from the upstream
recipe we follow UPSTREAM:

* llada    t ~ U(eps, 1), eps = 1e-3; weight 1/t; normaliser = answer length per sequence (response + its EOS
           padding), then mean over the batch: ``L = (1/b) Σ_seq (1/ℓ_seq) Σ_masked CE/t`` (LLaDA GUIDELINES).
           [DEVIATION fixed] DARE divides by the number of masked tokens, an extra ≈1/t factor.
* dream    Same recipe as LLaDA. [ODDITY fixed] DARE draws t ~ U(0, 1) with no eps (huge 1/t weights) and
           normalises by the masked count; we clamp with eps = 1e-3 and use the ELBO-consistent answer length.
           Dream's optional ``treat_eos_as_one`` (mask the trailing EOS run as a unit) is not implemented.
           The one-position logit shift is done by ``Family.logits``.
* sdar,    p = (1-eps)u + eps, eps = 1e-3; weight 1/p; normaliser = answer length (all non-prompt positions incl.
  sdar_moe pads); pads maskable and in the loss; at least one masked token per sequence. Upstream retries the
           draw up to 10 times before forcing one token; we force one random maskable token straight away (the
           same distribution except on the ≈(1-p)^ℓ rows that drew nothing). SDAR's normaliser is the answer
           length of the micro-batch (micro batch 1 in its recipes); we take it per sequence then average, like
           LLaDA. SDAR-30B (sdar_moe) is trained like dense SDAR, not with DARE's AR loss ([BUG] §3.6).
* llada2   t ~ U(0.3, 0.8); no weighting; normaliser = number of masked tokens in the batch (dFactory's token
           mean); only valid response tokens are maskable: pads are excluded from attention and from the loss.

* diffusion_gemma  uniform-state diffusion (Google's DiffusionGemma SFT code, google-deepmind/gemma
           ``gemma/diffusion/hackable_diffusion_adapter``): each response token is replaced with probability t by a
           uniformly random vocabulary token (``corrupt_uniform``); the loss is the plain cross-entropy of every
           canvas position, noised or not (``dare.objectives.uniform_sft_loss``).

* nemotron_diffusion  NVIDIA's SFT recipe for it (NeMo AutoModel ``examples/dllm_sft/nemotron_labs_diffusion_sft.yaml``:
           ``dllm.mode`` hybrid, ``dlm_paradigm`` block_diff, block 32, ``ar_loss_alpha`` 0.3; its
           ``HybridDiffusionLLMLoss`` and ``HybridStrategy``): t ~ U(0, 1), p = (1-eps) t + eps, eps = 1e-3; every
           response token masked with probability p; the model reads ``[x_t ‖ x_0]`` (a noisy block sees itself and
           the clean earlier blocks, the clean half reads left to right: the checkpoint's own ``block_diff`` mask);
           loss = 0.3 x (Σ over masked tokens of CE / p) / (masked tokens of the step)
                + (Σ over response tokens of the clean half's next-token CE) / (response tokens of the step).
           Padding is padding (never attended; the checkpoint's flex mask lets a last block's tokens see the pads
           after them, which carry nothing). The remote code's own ``block_diff`` loss divides the two sums by one
           count (masked + seq_len); its released configs say "bidirectional" (the inference-time mode).

* mmada    LLaDA's recipe, as MMaDA trains its understanding and text rows (``prepare_inputs_and_labels_for_mmu`` of
           Gen-Verse/MMaDA ``training/train_mmada_stage4.py``): p = (1-eps) t + eps, eps = 1e-3, CE / p over the masked
           answer tokens (its EOS padding included) / the answer length, averaged over the batch.
* llada_v  LLaDA-V's ``forward`` (``modeling_llada.py`` of ML-GSAI/LLaDA-V): LLaDA's recipe over the response tokens
           only (its labels: the prompt, the picture features and the padding are -100): t ~ U(0, 1),
           p = (1-eps) t + eps, eps = 1e-3; CE / p summed per sequence over its masked tokens, divided by its response
           length, then averaged over the batch; padding is padding.

Block families (sdar, sdar_moe, llada2) and nemotron_diffusion (``causal_loss``) are trained on the doubled
``[x_t ‖ x_0]`` layout, built by ``Family.logits(..., clean_ids=x_0)``.

Packed rows (``SFTDataConfig.pack``; ``segment_ids`` in ``dare.objectives``): every recipe applies per example (its own
t, its masks, SDAR's min_one, its answer length), but no example has an EOS tail: the maskable positions are its
response with its own turn terminator and EOS, and the padding after the last example of a row is never attended,
masked or counted. For llada2 that is the recipe unchanged (pads are already padding). For llada, dream and sdar it
drops upstream's EOS padding (which also teaches a fixed-length canvas to end in EOS) and ℓ_seq becomes the response
length; the model still learns to close its answer. SDAR's own trainer packs samples the same way (position restarts).
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NoiseRecipe:
    """A family's SFT forward process and loss weighting.

    t_low, t_high   noise level drawn uniformly in ``[t_low, t_high]`` per sequence
    eps             then clamped as ``(1 - eps) t + eps`` (0 = no clamp)
    weight          "inverse_t" (CE / t) or "none"
    normalizer      "answer_length": per sequence, divide by its number of loss positions (non-prompt positions
                    incl. EOS padding), then mean over the batch; "masked": divide the batch sum by the batch's
                    number of masked tokens
    mask_pads       the EOS/pad run after the response is maskable, attended and in the loss (else it is padding:
                    excluded from attention and from the loss)
    min_one         every sequence with a maskable token gets at least one masked token
    diffusion_weight  the masked-diffusion term's weight in the loss
    causal_loss     also the next-token cross-entropy of the clean half of ``[x_t ‖ x_0]``, read left to right, over the
                    trained positions, divided by their number in the step (Nemotron-Labs-Diffusion's joint loss)
    schedule        "linear": each maskable token masked with probability t; "cosine": exactly round(n cos(pi t / 2))
                    of a sequence's n maskable tokens (at least one), chosen uniformly (MaskGIT's training, MMaDA's
                    text-to-image loss)
    """

    t_low: float = 0.0
    t_high: float = 1.0
    eps: float = 1e-3
    weight: str = "inverse_t"
    normalizer: str = "answer_length"
    mask_pads: bool = True
    min_one: bool = False
    diffusion_weight: float = 1.0
    causal_loss: bool = False
    schedule: str = "linear"

    def __post_init__(self):
        if not self.diffusion_weight > 0:
            raise ValueError(f"diffusion_weight must be > 0, got {self.diffusion_weight}")
        if not 0.0 <= self.t_low <= self.t_high <= 1.0:
            raise ValueError(f"need 0 <= t_low <= t_high <= 1, got [{self.t_low}, {self.t_high}]")
        if not 0.0 <= self.eps < 1.0:
            raise ValueError(f"eps must be in [0, 1), got {self.eps}")
        if self.weight not in ("inverse_t", "none"):
            raise ValueError(f"weight must be 'inverse_t' or 'none', got {self.weight!r}")
        if self.normalizer not in ("answer_length", "masked"):
            raise ValueError(f"normalizer must be 'answer_length' or 'masked', got {self.normalizer!r}")
        if self.schedule not in ("linear", "cosine"):
            raise ValueError(f"schedule must be 'linear' or 'cosine', got {self.schedule!r}")
        if self.weight == "inverse_t" and self.t_low == 0.0 and self.eps == 0.0:
            raise ValueError("1/t weighting needs t > 0: set eps > 0 or t_low > 0")


RECIPES = {
    "llada": NoiseRecipe(),
    "dream": NoiseRecipe(),
    "sdar": NoiseRecipe(min_one=True),
    "sdar_moe": NoiseRecipe(min_one=True),
    "llada2": NoiseRecipe(t_low=0.3, t_high=0.8, eps=0.0, weight="none", normalizer="masked", mask_pads=False),
    # uniform noise (dare.objectives.uniform_sft_loss): t ~ U(1e-4, 1 - 1e-4) (Google's SafeSpan), no weighting, a
    # per-example mean; the response is EOS-filled to whole canvases (SFTCollator) and the padding after is padding
    "diffusion_gemma": NoiseRecipe(t_high=1 - 2e-4, eps=1e-4, weight="none", mask_pads=False),
    "nemotron_diffusion": NoiseRecipe(normalizer="masked", mask_pads=False, diffusion_weight=0.3, causal_loss=True),
    "llada_v": NoiseRecipe(mask_pads=False),
    "mmada": NoiseRecipe(),
}

# a drawing's codes (MMaDA's text-to-image loss, MaskGIT's: mask_or_random_replace_tokens with its cosine schedule and
# min_masking_rate 0, then the mean cross-entropy over the masked codes)
DRAWING = NoiseRecipe(eps=0.0, weight="none", normalizer="masked", mask_pads=False, schedule="cosine")
DRAWING_TEXT_DROPOUT = 0.1  # the share of drawings trained without their text (MMaDA's cond_dropout_prob): guidance


def recipe_for(family) -> NoiseRecipe:
    """The SFT noise recipe of a ``Family`` (or a family name)."""
    name = getattr(family, "name", family)
    if name not in RECIPES:
        raise ValueError(f"No SFT noise recipe for family {name!r}; known: {sorted(RECIPES)}")
    return RECIPES[name]


def uniform(shape, generator, device):
    """Uniform draws from ``generator`` (on its own device), moved to ``device``."""
    where = generator.device if generator is not None else device
    return torch.rand(shape, generator=generator, device=where).to(device)


def sample_t(batch: int, recipe: NoiseRecipe, generator: torch.Generator | None = None,
             device: torch.device | str = "cpu") -> torch.Tensor:
    """Noise levels ``[batch]`` (float32): ``u ~ U(t_low, t_high)``, then ``(1 - eps) u + eps``."""
    u = uniform((batch,), generator, device)
    t = recipe.t_low + (recipe.t_high - recipe.t_low) * u
    return (1 - recipe.eps) * t + recipe.eps


def corrupt(input_ids: torch.Tensor, maskable: torch.Tensor, t: torch.Tensor, mask_id: int,
            generator: torch.Generator | None = None, min_one: bool = False):
    """Mask each maskable token independently with probability ``t`` of its row.

    input_ids ``[B, L]``, maskable ``[B, L]`` (bool/0-1; prompt and excluded padding are 0), t ``[B]`` or a float.
    With ``min_one``, a row that has maskable tokens but drew none gets one uniformly random maskable token masked.
    Returns ``(noisy_ids, masked)``; ``masked`` is bool and equals ``noisy_ids == mask_id`` wherever the input was
    not already the mask token.
    """
    if maskable.shape != input_ids.shape:
        raise ValueError(f"maskable {tuple(maskable.shape)} must have the shape of input_ids {tuple(input_ids.shape)}")
    maskable = maskable.bool()
    t = torch.as_tensor(t, dtype=torch.float32, device=input_ids.device).expand(input_ids.shape[0])
    masked = maskable & (uniform(input_ids.shape, generator, input_ids.device) < t[:, None])
    if min_one:
        # the argmax of uniform scores over maskable positions is a uniform maskable position
        pick = uniform(input_ids.shape, generator, input_ids.device).masked_fill(~maskable, -1.0).argmax(-1)
        empty = maskable.any(-1) & ~masked.any(-1)
        masked[empty, pick[empty]] = True
    return input_ids.masked_fill(masked, mask_id), masked


def corrupt_uniform(input_ids: torch.Tensor, noised: torch.Tensor, vocab_size: int,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """``input_ids`` with every ``noised`` position replaced by a uniformly random token of the whole vocabulary (it
    may draw the true token: uniform-state diffusion keeps a token with probability 1 - t + t / V)."""
    where = generator.device if generator is not None else input_ids.device
    draws = torch.randint(0, vocab_size, input_ids.shape, generator=generator, device=where).to(input_ids.device)
    return torch.where(noised.bool(), draws, input_ids)


def uniform_elbo_terms(logits: torch.Tensor, clean: torch.Tensor, noisy: torch.Tensor,
                       t: torch.Tensor) -> torch.Tensor:
    """Per position, the integrand ``f_i(t) >= 0`` of uniform-state diffusion's continuous-time negative ELBO:
    ``-log p(x) <= int_0^1 E_{z_t ~ q_t(.|x)} [sum_i f_i(t, z_t)] dt`` (float64 ``[..., L]``).

    Forward process (DiffusionGemma's, ``corrupt_uniform``): each token independently keeps its value with
    probability ``alpha = 1 - t``, else becomes a uniform draw of the V-token vocabulary: ``q_t(j | x) = (V alpha
    1[j = x] + t) / V``. Its rate matrix moves a token to each other value at rate ``beta / V``, ``beta = -alpha' /
    alpha = 1 / (1 - t)``; at t = 1 the marginal is the uniform prior whatever x, so the bound has no prior term. The
    continuous-time ELBO of a Markov jump process (Campbell et al. 2022; SEDD's denoising score entropy, Lou et al.
    2024) is, per position i with noisy value ``z = z_i``,

        f_i = (beta / V) sum_{y != z} r_y (u_y - log u_y - 1),   u_y = s_y / r_y,

    Bregman terms between the model's ratio ``s_y`` (the reverse rate of changing position i from z to y, over the
    forward one) and the true one given x, ``r_y = q_t(y|x_i) / q_t(z|x_i)``. The model's ratio is read from its
    prediction ``m = softmax(logits)`` of the clean token, which DiffusionGemma's cross-entropy training fits to the
    posterior ``p(x_i | z_t)``: the exact ratio ``p_t(z with z_i = y) / p_t(z) = sum_v p(x_i = v | z) q_t(y|v) /
    q_t(z|v)`` is, for ``y != z``,

        s_y = 1 + (V alpha / t) m_y - (V alpha / (V alpha + t)) m_z,

    so the bound is tight, ``int E[sum_i f_i] dt = -log p(x)``, when m is the true posterior (tested by
    enumeration). This is not UDLM's / DUO's plug-in form (``x_theta`` inside q's posterior, ratio ``xbar_y /
    xbar_z``, Schiff et al. 2025, Sahoo et al. 2025): that is a valid bound too, but its optimum is ``p(x_i |
    z_{-i})``, not the posterior a cross-entropy-trained model outputs. The sums over y are in closed form except
    ``sum_y log s_y``, computed as ``softplus(kappa + log m_y)`` terms (stable at small t).

    logits ``[..., L, V]``; clean, noisy ``[..., L]`` token ids (x and z_t); t ``[...]`` in (0, 1): the same noise
    level for the L positions. Callers keep t away from 0 and 1 (both ends are integrable limits).
    """
    vocab = logits.shape[-1]
    sp = torch.nn.functional.softplus
    t = t.to(torch.float64)[..., None]
    alpha = 1 - t
    a, b = vocab * alpha / t, vocab * alpha / (vocab * alpha + t)
    lm = (logits if logits.dtype == torch.float64 else logits.float()).log_softmax(-1)
    lm_x = lm.gather(-1, clean[..., None])[..., 0].double()
    lm_z = lm.gather(-1, noisy[..., None])[..., 0].double()
    m_z = lm_z.exp()
    d = -torch.expm1(lm_z) + m_z * (1 - b)  # 1 - b m_z, stable when m_z -> 1 and b -> 1
    kappa = torch.log(a) - torch.log(d)  # log s_y = log d + softplus(kappa + log m_y)
    spread = sp(kappa.to(lm.dtype)[..., None] + lm).sum(-1, dtype=torch.float64)
    sum_log_s = (vocab - 1) * torch.log(d) + spread - sp(kappa + lm_z)
    sum_s = (vocab - 1) * d + a * (1 - m_z)
    stay = 1 - b  # r_y for every y != z when the token was kept (z = x)
    kept = sum_s - stay * sum_log_s + (vocab - 1) * stay * (torch.log(stay) - 1)
    log_s_x = torch.log(d) + sp(kappa + lm_x)
    moved = sum_s - sum_log_s - a * log_s_x + (a + 1) * (torch.log1p(a) - 1) - (vocab - 2)
    return torch.where(noisy == clean, kept, moved) / (alpha * vocab)


def sft_masks(prompt_lengths: torch.Tensor, response_lengths: torch.Tensor, length: int, recipe: NoiseRecipe):
    """``(loss_mask, attention_mask)`` ``[B, length]`` (long) for right-padded ``prompt + response + pads`` rows.

    ``response_lengths`` counts the real response tokens (incl. the appended EOS). With ``recipe.mask_pads`` the
    trailing pads are trained (loss 1, attended); otherwise they are padding (loss 0, attention 0).
    """
    pos = torch.arange(length, device=prompt_lengths.device)[None]
    prompt_end, valid_end = prompt_lengths[:, None], (prompt_lengths + response_lengths)[:, None]
    if bool((valid_end > length).any()):
        raise ValueError(f"prompt + response lengths {valid_end.flatten().tolist()} exceed the row length {length}")
    if recipe.mask_pads:
        return (pos >= prompt_end).long(), torch.ones_like(pos >= prompt_end, dtype=torch.long)
    return ((pos >= prompt_end) & (pos < valid_end)).long(), (pos < valid_end).long()


# ---------------------------------------------------------------------------- RL forward processes (dare.likelihood)

def random_subset(maskable: torch.Tensor, counts: torch.Tensor, generator=None) -> torch.Tensor:
    """Exactly ``counts[...]`` uniformly chosen positions among ``maskable`` (last dim), as a bool mask.
    ``maskable`` ``[..., R]``, ``counts`` ``[...]`` (clamped to the number of maskable positions)."""
    scores = uniform(maskable.shape, generator, maskable.device).masked_fill(~maskable.bool(), 2.0)
    rank = scores.argsort(-1).argsort(-1)
    return maskable.bool() & (rank < counts[..., None])


def stratified_counts(lengths: torch.Tensor, k: int, generator=None) -> torch.Tensor:
    """BGPO/VRPO mask counts ``[N, k]`` in ``1..L``, stratified over the k draws of a sequence:
    ``x_j = (floor(o + jL/k) mod L) + 1`` with ``o ~ U[0, L)``. Every draw is marginally uniform on 1..L (the
    reference rounds an integer offset, which skews the marginals when k does not divide L). ``L = 0`` gives 0."""
    length = lengths.clamp(min=1).double()[:, None]
    offset = uniform(lengths.shape, generator, lengths.device).double()[:, None] * length
    j = torch.arange(k, device=lengths.device, dtype=torch.float64)[None]
    x = torch.remainder(torch.floor(offset + j * length / k), length) + 1
    return (x * (lengths[:, None] > 0)).long()


def batch_stratified_counts(lengths: torch.Tensor, generator=None) -> torch.Tensor:
    """ESPO mask counts ``[N]`` in ``0..L``: with one common length L, stratified across the batch,
    ``x_b = floor(o + b (L+1) / B) mod (L+1)`` with ``o ~ U[0, L+1)``, so every row is marginally uniform on 0..L
    (the reference rounds an integer offset: rows b with fractional ``b (L+1) / B`` then skip counts, which biases
    their ELBO); otherwise independent ``x_b ~ U{0..L_b}``."""
    u = uniform(lengths.shape, generator, lengths.device).double()
    if bool((lengths == lengths[0]).all()):
        span = int(lengths[0]) + 1
        b = torch.arange(len(lengths), device=lengths.device, dtype=torch.float64)
        return torch.remainder(torch.floor(u[0] * span + b * span / len(lengths)), span).long()
    return (u * (lengths + 1)).floor().long()


def block_random_masks(maskable: torch.Tensor, block: int, draws: int, generator=None, t_min: float = 0.0,
                       t_max: float = 1.0) -> torch.Tensor:
    """SPG's masks ``[N, draws, R]`` over completion positions: per draw a block b among the valid ones (distinct
    across draws while possible: the first ``draws`` of a random order of ``max(draws, V)`` slots, taken mod V);
    later blocks fully masked, block b gets ``n ~ U{max(floor(l t_min), 1) .. min(floor(l t_max), l)}`` random
    masked tokens (l = its valid length), earlier blocks clean. Batched over rows and draws (no Python loop)."""
    n_rows, length = maskable.shape
    maskable, device = maskable.bool(), maskable.device
    blocks = torch.arange(length, device=device) // block
    valid = torch.where(maskable, blocks + 1, 0).amax(-1)  # V: valid blocks per row (0: nothing maskable)
    slots = max(draws, int(blocks[-1]) + 1 if length else 0)
    keys = uniform((n_rows, slots), generator, device)
    keys = keys.masked_fill(torch.arange(slots, device=device) >= valid.clamp(min=draws)[:, None], 2.0)
    chosen = keys.argsort(-1)[:, :draws] % valid.clamp(min=1)[:, None]  # [N, draws]
    in_block = maskable[:, None] & (blocks == chosen[..., None])
    size = in_block.sum(-1)
    low, high = (size * t_min).floor().long().clamp(min=1), torch.minimum((size * t_max).floor().long(), size)
    count = low + (uniform(size.shape, generator, device) * (high - low + 1)).long()
    out = (maskable[:, None] & (blocks > chosen[..., None])) | random_subset(in_block, count.minimum(high),
                                                                              generator)
    return out & (valid > 0)[:, None, None]


def block_stratified_masks(maskable: torch.Tensor, offsets: torch.Tensor, block: int, rows: int,
                           generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """EBPO's masks ``[N, rows, R]`` and per-token mask probabilities: blocks on the global grid (completion position
    k of sequence i is in block ``(offsets[i] + k) // block``); the noise levels of all rows x blocks cells of a
    sequence are stratified (``tau_c = (o + c / C) mod 1``, c = row x blocks + the block's rank among the sequence's
    blocks) and block b masks ``q = min(floor(tau l_b) + 1, l_b)`` random tokens of its l_b valid ones, so every
    block has a target; ``p = q / l_b`` on its tokens. Batched over sequences, rows and blocks (no Python loop)."""
    n_seq, length = maskable.shape
    device, maskable = maskable.device, maskable.bool()
    ids = (offsets[:, None] + torch.arange(length, device=device)) // block
    ids = ids - ids[:, :1]  # block index from each sequence's first completion block: [N, R]
    blocks = int(ids.max()) + 1
    sizes = torch.zeros(n_seq, blocks, dtype=torch.long, device=device).scatter_add_(1, ids, maskable.long())
    present = sizes > 0
    rank = present.long().cumsum(-1) - 1  # a present block's rank among its sequence's blocks
    count = present.sum(-1, keepdim=True)  # [N, 1] present blocks
    cells = (rows * count).clamp(min=1)
    cell = torch.arange(rows, device=device)[None, :, None] * count[:, :, None] + rank[:, None, :]  # [N, rows, B]
    o = uniform((n_seq, 1, 1), generator, device)
    tau = torch.remainder(o + cell / cells[:, :, None], 1.0)
    q = torch.minimum((tau * sizes[:, None]).floor().long() + 1, sizes[:, None])  # [N, rows, B]
    # a random order of each block's valid positions: sort by (block, uniform), then rank within the block
    key = ids[:, None].double() + uniform((n_seq, rows, length), generator, device).double()
    key = key.masked_fill(~maskable[:, None], float(blocks + 1))
    order = key.argsort(-1).argsort(-1)  # overall rank of each position
    start = (sizes.cumsum(-1) - sizes).gather(1, ids)  # [N, R]: how many valid positions come before its block
    q_here = q.gather(2, ids[:, None].expand(-1, rows, -1))
    masks = maskable[:, None] & (order - start[:, None] < q_here)
    p = torch.where(maskable[:, None], q_here.float() / sizes.gather(1, ids).clamp(min=1)[:, None].float(), 0.0)
    return masks, p
