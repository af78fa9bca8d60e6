"""Load a model, its tokenizer and its ``Family`` from a hub name or a local folder, never running remote code."""

import json

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import cached_file

from .family import KNOWN, Family

# Tokenizer classes named by official tokenizer_config.json files that are remote code; the stock class loads them.
_STOCK_TOKENIZER = {"DreamTokenizer": "Qwen2Tokenizer"}


def load_tokenizer(name_or_path: str, **kwargs):
    """The tokenizer of an official or DARE checkpoint without ``trust_remote_code`` (its ``auto_map`` is skipped)."""
    config_file = cached_file(name_or_path, "tokenizer_config.json", _raise_exceptions_for_missing_entries=False)
    class_name = json.load(open(config_file)).get("tokenizer_class") if config_file else None
    class_name = _STOCK_TOKENIZER.get(class_name, class_name)
    tokenizer_class = getattr(transformers, class_name, None) if class_name else None
    if tokenizer_class is None:
        return AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False, **kwargs)
    return tokenizer_class.from_pretrained(name_or_path, **kwargs)


def load_pretrained(name_or_path: str, dtype: str | torch.dtype = "auto", attn_implementation: str = "sdpa",
                    **kwargs):
    """``(model, tokenizer, family)`` for any supported checkpoint (official weights load into our classes).
    ``tiny:<family>`` (e.g. ``tiny:sdar``) gives a random tiny model, for trying commands offline."""
    if name_or_path.startswith("tiny:"):
        from .tiny import tiny
        model, tokenizer = tiny(name_or_path.removeprefix("tiny:"))
        return model, tokenizer, Family.from_pretrained(model.config, tokenizer)
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=False)
    if config.model_type not in KNOWN:  # fail before downloading weights
        raise ValueError(f"Unknown model family {config.model_type!r} at {name_or_path}; known model_type values: "
                         f"{sorted(KNOWN)}")
    model = AutoModelForCausalLM.from_pretrained(name_or_path, config=config, dtype=dtype, attn_implementation=attn_implementation,
                                                 trust_remote_code=False, **kwargs)
    tokenizer = load_tokenizer(name_or_path)
    return model, tokenizer, Family.from_pretrained(model.config, tokenizer)
