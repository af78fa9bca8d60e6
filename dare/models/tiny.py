"""Tiny random models with the real architectures scaled down, for tests and the offline quickstart.

    model, tokenizer = dare.models.tiny("sdar")
    dare.models.save_tiny("sdar", "out/tiny-sdar")      # a normal HF folder; from_pretrained reloads it
"""

import torch
from transformers import DiffusionGemmaForBlockDiffusion

from . import diffusion_gemma, dream, llada, llada2, llada_v, mmada, nemotron_diffusion, sdar
from .tokenizers import MASK_IN_CONFIG, TOKENS_IN_CONFIG, tiny_tokenizer

TINY = {
    "llada": (llada.tiny_config, llada.LLaDAModelLM),
    "dream": (dream.tiny_config, dream.DreamModel),
    "sdar": (sdar.tiny_config, sdar.SDARForCausalLM),
    "sdar_moe": (sdar.tiny_moe_config, sdar.SDARMoeForCausalLM),
    "llada2": (llada2.tiny_config, llada2.LLaDA2MoeModelLM),
    "diffusion_gemma": (diffusion_gemma.tiny_config, DiffusionGemmaForBlockDiffusion),
    "nemotron_diffusion": (nemotron_diffusion.tiny_config, nemotron_diffusion.NemotronLabsDiffusionModel),
    "llada_v": (llada_v.tiny_config, llada_v.LLaDAVModelLM),
    "mmada": (mmada.tiny_config, mmada.MMadaModelLM),
}


def tiny_parts(family: str, **config_overrides):
    """``(config, tokenizer)`` of a tiny ``family`` model, ids wired together (no weights built)."""
    if family not in TINY:
        raise ValueError(f"Unknown family {family!r}; known: {sorted(TINY)}")
    make_config = TINY[family][0]
    tok = tiny_tokenizer(family)
    mask = tok.mask_token or MASK_IN_CONFIG.get(family)  # LLaDA's, Nemotron's: the id lives in the config
    ids = dict(mask_token_id=tok.convert_tokens_to_ids(mask) if mask else None, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
               **{key: tok.convert_tokens_to_ids(t) for key, t in TOKENS_IN_CONFIG.get(family, {}).items()})
    vocab = config_overrides.pop("vocab_size", len(tok))  # larger than the tokenizer's: e.g. an official vocabulary
    return make_config(vocab, **{**ids, **config_overrides}), tok


def tiny_model(config, seed: int = 0):
    """The random tiny model of a ``tiny_parts`` config (the same weights for the same seed on every call)."""
    model_class = next(cls for _, cls in TINY.values() if cls.config_class is type(config))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return model_class(config).eval()


def tiny(family: str, seed: int = 0, **config_overrides):
    """``(model, tokenizer)``: a random model of ``family`` (a few MB) and its tiny tokenizer, ids wired together."""
    config, tok = tiny_parts(family, **config_overrides)
    return tiny_model(config, seed), tok


def save_tiny(family: str, path, seed: int = 0, **config_overrides) -> str:
    model, tok = tiny(family, seed, **config_overrides)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
