"""Generation for every family: masked diffusion (LLaDA, Dream; semi-autoregressive blocks, Fast-dLLM prefix/dual
cache, confidence-threshold parallel decoding), block diffusion (SDAR, LLaDA2; block-wise KV cache, static or
dynamic unmasking), uniform noise (DiffusionGemma) and blocks against a causal context (Nemotron-Labs-Diffusion).
Every sampler returns the trajectory (the step at which each token was fixed).

    out = generate(model, family, prompt_ids, prompt_mask, SamplingConfig(gen_length=256, steps=256))
"""

import torch

from .config import (
    FAST_DECODING,
    Generation,
    SamplingConfig,
    SamplingOverrides,
    fast_decoding,
    schedule_length,
    step_budget,
)


def generate(model, family, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None,
             config: SamplingConfig | None = None, generator: torch.Generator | None = None,
             canvas: torch.Tensor | None = None, from_step: int = 0, to_step: int | None = None,
             fixed_shapes: bool = False) -> Generation:
    """Decode ``gen_length`` tokens after each (left-padded) prompt with the family's sampler. A decoding with a
    fixed schedule can be resumed: ``canvas`` is the generated region so far (masks where undecoded) and only the
    scheduled steps ``from_step .. to_step - 1`` run (tree rollouts; ``schedule_length`` counts the steps).
    ``fixed_shapes``: ``model`` is compiled; keep the shapes of its calls few (block families: a block cache of the
    canvas's size; the same tokens)."""
    # here, not at the top: --help imports this package, and dare.models and the samplers import transformers
    from ..models.family import max_positions
    from .block import generate_block
    from .causal import generate_causal
    from .masked import generate_masked
    from .uniform import generate_uniform

    config = (config or SamplingConfig()).check(family, "sampling", prompt_ids.shape[1],
                                                max_positions(getattr(model, "config", None)))
    if prompt_mask is None:
        prompt_mask = torch.ones_like(prompt_ids)
    if bool((prompt_mask[:, 1:] < prompt_mask[:, :-1]).any()):
        raise ValueError("Prompts must be left-padded (padding before the prompt, generation follows it); got "
                         "right padding. With apply_chat_template pass tokenizer_kwargs={'padding_side': 'left'}.")
    with torch.no_grad():
        if canvas is not None and canvas.shape != (prompt_ids.shape[0], config.gen_length):
            raise ValueError(f"canvas must be [{prompt_ids.shape[0]}, {config.gen_length}], got {tuple(canvas.shape)}")
        if family.noise == "uniform":
            if canvas is not None or from_step or to_step is not None:
                raise ValueError(f"{family.name}: a uniform-noise decoding cannot be resumed from a partial canvas")
            return generate_uniform(model, family, prompt_ids, prompt_mask.long(), config, generator)
        if family.causal_block is not None:
            if canvas is not None or from_step or to_step is not None:
                raise ValueError(f"{family.name}: a decoding against a causal context cannot be resumed from a "
                                 "partial canvas")
            return generate_causal(model, family, prompt_ids, prompt_mask.long(), config, generator)
        if family.is_block_diffusion:
            return generate_block(model, family, prompt_ids, prompt_mask.long(), config, generator, canvas,
                                  from_step, to_step, fixed_shapes)
        return generate_masked(model, family, prompt_ids, prompt_mask.long(), config, generator, canvas, from_step,
                               to_step)


__all__ = ["FAST_DECODING", "Generation", "SamplingConfig", "SamplingOverrides", "fast_decoding", "generate",
           "schedule_length", "step_budget"]
