"""MaskGIT decoding of a picture's codes (MMaDA's text-to-image ``t2i_generate``), and drawing pictures with it.

Every code of the picture starts masked. Each of ``steps`` steps reads the model once (twice with guidance: the prompt
and the prompt without its text, their logits mixed as ``(1 + g) cond - g uncond``), samples a code for every position
from the softmax over the codebook's rows, keeps the codes committed before, and re-masks the ``n`` least confident
new ones, ``n = floor(L cos(pi/2 (s + 1) / steps))`` clamped to [1, still masked - 1]; confidence = log p of the
sampled code + ``tau`` Gumbel noise, with committed codes the most confident. ``tau`` starts at ``temperature`` and is
multiplied by ``1 - (s + 1) / steps`` at every step (MMaDA rebinds it each step, so the factors compound; MaskGIT's own
code scales the initial value). The answer is the last step's samples.

Read, not copied: Gen-Verse/MMaDA ``models/modeling_mmada.py`` (``t2i_generate``), ``models/sampling.py``
(``cosine_schedule``, ``mask_by_random_topk``), ``inference_t2i.py`` (guidance 3.5, 15 steps in its README).

    pictures = draw(model, tokenizer, ["a red square on white"], DrawConfig(steps=15, guidance=3.5), seed=0)
"""

import math
from dataclasses import dataclass

import torch


@dataclass
class DrawConfig:
    """Drawing a picture for a text prompt (a model that draws: MMaDA)."""

    steps: int = 15  # MaskGIT steps (MMaDA's README: 15)
    guidance: float = 3.5  # classifier-free guidance g: (1 + g) cond - g uncond; 0 reads the prompt once
    temperature: float = 1.0  # the confidence noise's starting scale (annealed each step)

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"draw steps must be at least 1, got {self.steps}")
        if self.guidance < 0 or self.temperature < 0:
            raise ValueError(f"draw guidance and temperature are >= 0, got {self.guidance}, {self.temperature}")


def noise_scales(temperature: float, steps: int) -> list[float]:
    """The confidence noise's scale at each step: ``temperature`` times ``1 - (s + 1) / steps`` for every step so far
    (MMaDA rebinds its temperature each step, so the factors compound)."""
    scales, tau = [], temperature
    for step in range(steps):
        tau = tau * (1 - (step + 1) / steps)
        scales.append(tau)
    return scales


def gumbel(shape, generator, device) -> torch.Tensor:
    u = torch.rand(shape, generator=generator, device=device)
    return -torch.log((-torch.log(u.clamp(min=1e-20))).clamp(min=1e-20))


@torch.no_grad()
def maskgit(model, ids: torch.Tensor, attention_mask: torch.Tensor, start: int, first: int, size: int,
            mask_id: int, config: DrawConfig, uncond_ids: torch.Tensor | None = None,
            uncond_mask: torch.Tensor | None = None, generator: torch.Generator | None = None) -> tuple:
    """The codes ``[B, L]`` of the masked span ``ids[:, start:start + L]`` (every id there ``mask_id``, L = all the
    masked ids), vocabulary rows ``first .. first + size - 1`` holding the codes. Positions count every column, padding
    included, as MMaDA's model reads them; ``uncond_*``: the prompt without its text, the same length, for
    guidance. Also the step at which each code was committed ``[B, L]`` (the last step's samples: the last step)."""
    ids = ids.clone()
    length = int((ids[0] == mask_id).sum())
    span = slice(start, start + length)
    if not bool((ids[:, span] == mask_id).all()):
        raise ValueError("the picture's span must be all mask ids")
    positions = torch.arange(ids.shape[1], device=ids.device)[None]
    guided = config.guidance > 0 and uncond_ids is not None
    codes = torch.full((ids.shape[0], length), -1, dtype=torch.long, device=ids.device)  # -1: still masked
    sampled, committed = codes, torch.full_like(codes, config.steps - 1)
    scales = noise_scales(config.temperature, config.steps)
    for step in range(config.steps):
        if guided:
            uncond = uncond_ids.clone()
            uncond[:, span] = ids[:, span]
            logits = model(torch.cat([ids, uncond]), attention_mask=torch.cat([attention_mask, uncond_mask]),
                           position_ids=positions).logits[:, span, first:first + size].float()
            cond, free = logits.chunk(2)
            logits = (1 + config.guidance) * cond - config.guidance * free
        else:
            logits = model(ids, attention_mask=attention_mask, position_ids=positions).logits[:, span,
                                                                                           first:first + size].float()
        probs = logits.softmax(-1)
        drawn = torch.multinomial(probs.view(-1, size), 1, generator=generator).view(codes.shape)
        unknown = codes < 0
        sampled = torch.where(unknown, drawn, codes)
        ratio = (step + 1) / config.steps
        # in float32, as MMaDA's schedule: cos(pi/3) falls just under 1/2 there, so floor(16 * it) is 7, not 8
        keep_masked = (length * torch.cos(torch.tensor(ratio) * math.pi * 0.5)).floor().long().to(ids.device)
        keep_masked = torch.clamp(torch.minimum(unknown.sum(-1, keepdim=True) - 1, keep_masked), min=1)
        chosen = probs.gather(-1, sampled[..., None])[..., 0]
        chosen = torch.where(unknown, chosen, torch.finfo(chosen.dtype).max)
        noise = scales[step] * gumbel(chosen.shape, generator, ids.device)
        confidence = torch.log(chosen.clamp(min=1e-20)) + noise
        cut = confidence.sort(-1).values.gather(1, keep_masked)
        masked = confidence < cut
        committed = torch.where(unknown & ~masked, step, committed)
        codes = torch.where(masked, -1, sampled)
        ids[:, span] = torch.where(masked, mask_id, sampled + first)
    return sampled, committed


def draw(model, tokenizer, texts: list[str], config: DrawConfig | None = None, seed: int | None = None) -> list:
    """PIL pictures for ``texts`` from a model that draws (its picture reader, ``dare.models.pictures``, lays out the
    prompts and decodes the codes)."""
    from ..models import pictures

    config = config or DrawConfig()
    reader = pictures(model.config)
    if reader is None or not hasattr(reader, "drawing_prompts"):
        raise ValueError(f"a {model.config.model_type} model draws no pictures (MMaDA does)")
    device = next(model.parameters()).device
    prompts = reader.drawing_prompts(tokenizer, texts)
    prompts = {k: v.to(device) if torch.is_tensor(v) else v for k, v in prompts.items()}
    generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
    codes, _ = maskgit(model, **prompts, mask_id=model.config.mask_token_id, config=config, generator=generator)
    return reader.pictures_of(codes)
