"""Drawing rollouts of the ``hf`` engine (a model that draws: MMaDA): ``DrawPrompt``s decoded by MaskGIT
(``dare.sampling.maskgit``) into a ``Rollout`` whose prompt is the text-to-image prompt up to ``<|soi|>`` (its padding
outside ``prompt_mask``), whose completion is the picture's codes as token ids (``<|eoi|>``, which closes the picture,
is left out), ``step_map`` the step each code was committed, whose texts are the pictures as PNG data URIs (what the
``colours`` reward reads), and whose ``reading`` hands a scorer the model over the codebook's rows
(``PictureTokens.wrap``: a code's probability is MaskGIT's, its softmax over the codes). The sampling knobs a drawing
takes: ``steps`` (MaskGIT steps, default 15), ``cfg_scale`` (guidance against the prompt without its text) and
``temperature`` (the confidence noise's start); the rest do not apply to drawing."""

import time

import torch

from ..data.images import data_uri, png
from ..sampling import SamplingConfig
from ..sampling.maskgit import DrawConfig, maskgit
from .base import Rollout


def drawing_of(config: SamplingConfig) -> DrawConfig:
    """The MaskGIT knobs of a drawing from the sampling knobs (steps, cfg_scale, temperature)."""
    return DrawConfig(steps=config.steps or DrawConfig.steps, guidance=config.cfg_scale,
                      temperature=config.temperature)


def drawing_ids(engine, prompts: list) -> tuple[dict, object]:
    """The text-to-image prompts of ``DrawPrompt``s (``maskgit``'s arguments), and the reader that laid them out."""
    from ..models import pictures  # here, not at the top: --help imports the engines, dare.models transformers

    reader = pictures(engine.model.config)
    if not hasattr(reader, "drawing_prompts"):
        raise ValueError(f"prompts to draw, for a {engine.family.name} model, which draws none (MMaDA does)")
    return reader.drawing_prompts(engine.tokenizer, [p.text for p in prompts]), reader


def draw_rollout(engine, prompts: list, n: int, config: SamplingConfig, seed: int | None) -> Rollout:
    """``n`` drawings per prompt (prompt-major), ``engine.max_batch_size`` rows per MaskGIT decoding."""
    device = next(engine.model.parameters()).device
    laid, reader = drawing_ids(engine, [p for p in prompts for _ in range(n)])
    start, knobs = laid["start"], drawing_of(config)
    generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
    codes, steps, began = [], [], time.perf_counter()
    was_training = engine.model.training
    engine.model.eval()
    try:
        for i in range(0, len(laid["ids"]), engine.max_batch_size):
            part = {k: v[i:i + engine.max_batch_size].to(device) if torch.is_tensor(v) else v
                    for k, v in laid.items()}
            found, committed = maskgit(engine.decoder, **part, mask_id=engine.family.mask_id, config=knobs,
                                       generator=generator)
            codes.append(found)
            steps.append(committed)
    finally:
        engine.model.train(was_training)
    codes, steps = torch.cat(codes), torch.cat(steps)
    texts = [data_uri(png(p)) for p in reader.pictures_of(codes)]
    parts = -(-len(codes) // engine.max_batch_size)
    return Rollout(laid["ids"][:, :start].to(device), laid["attention_mask"][:, :start].to(device),
                   codes + laid["first"], torch.ones_like(codes), steps, torch.zeros_like(steps), texts,
                   nfe=knobs.steps * parts, seconds=time.perf_counter() - began,
                   reading={"codebook": torch.tensor([laid["first"], laid["size"]])})
