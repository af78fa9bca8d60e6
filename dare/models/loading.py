"""Load a model, its tokenizer and its ``Family`` from a hub name or a local folder, never running remote code."""

import importlib.util
import json
import os
import re
from pathlib import Path

import torch
import transformers
import yaml
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DiffusionGemmaForBlockDiffusion
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import cached_file

from .. import hub
from . import diffusion_gemma
from .family import KNOWN, Family, max_positions  # noqa: F401 (max_positions: re-exported)
from .masks import FLEX
from .tiny import tiny_model, tiny_parts

# Tokenizer classes named by official tokenizer_config.json files that are remote code; the stock class loads them.
_STOCK_TOKENIZER = {"DreamTokenizer": "Qwen2Tokenizer"}


def load_tokenizer(name_or_path: str, **kwargs):
    """The tokenizer of an official or DARE checkpoint without ``trust_remote_code`` (its ``auto_map`` is skipped)."""
    config_file = cached_file(name_or_path, "tokenizer_config.json", _raise_exceptions_for_missing_entries=False)
    class_name = None
    if config_file:
        with open(config_file) as f:
            class_name = json.load(f).get("tokenizer_class")
    class_name = _STOCK_TOKENIZER.get(class_name, class_name)
    tokenizer_class = getattr(transformers, class_name, None) if class_name else None
    try:
        if tokenizer_class is None:
            return AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False, **kwargs)
        return tokenizer_class.from_pretrained(name_or_path, **kwargs)
    except (ValueError, OSError) as e:  # transformers' message spans lines and guesses at packages
        first = str(e).strip().splitlines()[0].rstrip(": ") if str(e).strip() else type(e).__name__
        if first.startswith("Couldn't instantiate the backend tokenizer"):
            first = "no tokenizer.json, and no slow tokenizer files to convert"
        raise ValueError(f"{name_or_path}: its tokenizer cannot be loaded ({first}); the model needs its tokenizer "
                         "files (tokenizer.json, or the slow tokenizer's vocabulary files)") from e


def parse_overrides(text: str) -> dict:
    """``"d_model=256,n_layers=4"`` -> ``{"d_model": 256, "n_layers": 4}`` (values read as YAML scalars)."""
    out = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"tiny model override {item!r} is not key=value (e.g. tiny:llada:d_model=256,n_layers=4)")
        out[key.strip()] = yaml.safe_load(value)
    return out


SIZE = re.compile(r"layers|heads|size|dim|d_model|length|vocab|experts|positions|hidden")  # counts, not ids


def _tiny_name(name: str) -> tuple[str, dict]:
    """``tiny:<family>[:key=value,...]`` -> (family, config overrides); a key the config does not have is refused."""
    family, _, text = name.removeprefix("tiny:").partition(":")
    overrides = parse_overrides(text)
    known = tiny_parts(family)[0].to_dict()
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"Unknown {family} config field(s) {unknown} in {name!r}; known: {sorted(known)}")
    for key, value in overrides.items():  # a number where the config has one, and a size at least 1
        default = known[key]
        if not isinstance(default, (int, float)) or isinstance(default, bool):
            continue
        integer = isinstance(default, int)
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            raise ValueError(f"{name!r}: {key}={value!r} is not {'an integer' if integer else 'a number'} "
                             f"(default {default})")
        if integer and SIZE.search(key) and value < 1:
            raise ValueError(f"{name!r}: {key}={value} must be at least 1")
    return family, overrides


ADAPTER = "adapter_config.json"  # PEFT's: a folder holding LoRA adapters, not a model


def adapter_base(name_or_path: str) -> str | None:
    """The base model of a LoRA adapter folder (``adapter_config.json`` and no ``config.json``: what ``train_sft.py
    --lora.rank R`` writes), or None for anything else."""
    folder = Path(os.path.expanduser(name_or_path))
    if not (folder / ADAPTER).is_file() or (folder / "config.json").is_file():
        return None
    try:
        base = json.loads((folder / ADAPTER).read_text()).get("base_model_name_or_path")
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{folder / ADAPTER} is not readable JSON ({e})") from None
    if not base:
        merged = f"; {folder / 'merged'} is the merged model" if (folder / "merged" / "config.json").is_file() else ""
        raise ValueError(f"{name_or_path} holds LoRA adapters that do not name their base model ({ADAPTER}: "
                         f"base_model_name_or_path){merged}")
    return base


def load_config(name_or_path: str):
    """``(config, tokenizer, family)`` without the weights: every setting can be checked before they load. A LoRA
    adapter folder is the model of its base with the adapters merged in: its base's config, its own tokenizer."""
    base = adapter_base(name_or_path)
    if base is not None:
        config, tokenizer, _ = load_config(base)
        if (Path(os.path.expanduser(name_or_path)) / "tokenizer_config.json").is_file():
            tokenizer = load_tokenizer(name_or_path)
        return config, tokenizer, Family.from_pretrained(config, tokenizer)
    if name_or_path.startswith("tiny:"):
        family, overrides = _tiny_name(name_or_path)
        config, tokenizer = tiny_parts(family, **overrides)
        return config, tokenizer, Family.from_pretrained(config, tokenizer)
    if looks_local(name_or_path) and not os.path.isdir(os.path.expanduser(name_or_path)):
        raise FileNotFoundError(f"model folder {name_or_path} does not exist (a hub name is 'org/name')")
    if not looks_local(name_or_path):
        hub.before_loading()
    try:
        config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=False)
    except OSError as e:
        raise hub.missing("model", name_or_path, e) from e
    if config.model_type not in KNOWN:  # fail before downloading weights
        raise ValueError(f"Unknown model family {config.model_type!r} at {name_or_path}; known model_type values: "
                         f"{sorted(KNOWN)}")
    tokenizer = load_tokenizer(name_or_path)
    return config, tokenizer, Family.from_pretrained(config, tokenizer)


def looks_local(name: str) -> bool:
    """A path rather than a hub name: absolute, home- or dot-relative, with more than one ``/``, or ``a/b`` where
    folder ``a`` exists here (``outputs/my-sft`` after a run into ``outputs``; a hub name is ``org/name``)."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or os.path.exists(name) or \
        ("/" in name and os.path.isdir(name.split("/")[0]))


def check_attention(name: str, training: bool) -> None:
    """One-line errors before any weights load: an attention path transformers does not know, or training through
    FlexAttention without a GPU (torch has no FlexAttention backward on CPU)."""
    known = ["eager", *(k for k in ALL_ATTENTION_FUNCTIONS.valid_keys() if "|" not in k)]
    if name not in known:
        raise ValueError(f"attn_implementation {name!r} is not one of {known}")
    if name == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        raise ValueError("attn_implementation flash_attention_2 needs the flash-attn package (pip install flash-attn "
                         "--no-build-isolation, on a CUDA machine): use sdpa without it")
    if name == FLEX and training and not torch.accelerator.is_available():
        raise ValueError("attn_implementation flex_attention has no backward on CPU (torch): train with sdpa here "
                         "(evaluate.py and no-grad scoring take flex on CPU)")


def load_weights(name_or_path: str, config, dtype: str | torch.dtype = "auto", attn_implementation: str = "sdpa",
                 **kwargs):
    """The model of ``name_or_path`` on the ``config`` of ``load_config``: the checkpoint's weights, or the random
    tiny model of a ``tiny:`` name; for a LoRA adapter folder, its base's weights with the adapters merged in."""
    base = adapter_base(name_or_path)
    if base is not None:
        from peft import PeftModel  # here: peft takes seconds to import
        model = load_weights(base, config, dtype, attn_implementation, **kwargs)
        return PeftModel.from_pretrained(model, os.path.expanduser(name_or_path)).merge_and_unload()
    if name_or_path.startswith("tiny:"):
        model = tiny_model(config)
        model.set_attn_implementation(attn_implementation)
        model = model if dtype == "auto" else model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
    else:
        # transformers' own class for DiffusionGemma (no causal-LM Auto entry); ours for the other families
        gemma = config.model_type == "diffusion_gemma"
        model_class = DiffusionGemmaForBlockDiffusion if gemma else AutoModelForCausalLM
        try:
            model = model_class.from_pretrained(name_or_path, config=config, dtype=dtype,
                                                attn_implementation=attn_implementation, trust_remote_code=False,
                                                **kwargs)
        except SafetensorError as e:
            raise ValueError(f"{name_or_path}: a weights file is damaged or cut short ({e})") from None
    return diffusion_gemma.text_only(model) if config.model_type == "diffusion_gemma" else model


def load_pretrained(name_or_path: str, dtype: str | torch.dtype = "auto", attn_implementation: str = "sdpa",
                    **kwargs):
    """``(model, tokenizer, family)`` for any supported checkpoint (official weights load into our classes).
    ``tiny:<family>`` (e.g. ``tiny:sdar``) gives a random tiny model, for trying commands offline;
    ``tiny:<family>:key=value,...`` overrides its config (``tiny:llada:d_model=256,n_layers=4``)."""
    config, tokenizer, _ = load_config(name_or_path)
    model = load_weights(name_or_path, config, dtype, attn_implementation, **kwargs)
    return model, tokenizer, Family.from_pretrained(model.config, tokenizer)
