"""Rollout / evaluation backends behind one contract (``base.Engine``), registered by name and chosen by the scripts
(``evaluate.py --engine``, ``train_rl.py --rollout-engine``): ``hf`` runs DARE's samplers on the in-process model
(every family), ``sglang`` SGLang's dLLM engine (block-diffusion families). Every module of this package is imported
on first lookup, so a new engine is one new file here.
"""

import dataclasses

from .base import ENGINES, Engine, Rollout, check_decoding, register_engine
from .hf import HFEngine, InProcessEngine


def known_engines() -> list[str]:
    return ENGINES.known()


def get_engine(name: str) -> type[Engine]:
    """The engine class registered as ``name``."""
    return ENGINES.lookup(name)


def make_engine(name: str, model_name: str, tokenizer, family, **kwargs) -> Engine:
    """An evaluation's engine ``name`` for ``model_name`` (see ``Engine.open`` for ``kwargs``)."""
    return get_engine(name).open(model_name, tokenizer, family, **kwargs)


def with_engine_options(cls: type) -> type:
    """``cls`` (a script's arguments) with a section per registered engine that has options, named after it
    (``--sglang.mem-fraction``)."""
    options = {name: ENGINES[name].options for name in known_engines() if ENGINES[name].options is not None}
    sections = [(name, kind, dataclasses.field(default_factory=kind)) for name, kind in options.items()]
    extended = dataclasses.make_dataclass(cls.__name__, sections, bases=(cls,))
    extended.__doc__, extended.__module__ = cls.__doc__, cls.__module__
    return extended


def engine_options(args, name: str):
    """The options section of engine ``name`` in a script's ``args`` (None: the engine has none)."""
    return getattr(args, name) if get_engine(name).options is not None else None


__all__ = ["ENGINES", "Engine", "HFEngine", "InProcessEngine", "Rollout", "check_decoding", "engine_options",
           "get_engine", "known_engines", "make_engine", "register_engine", "with_engine_options"]
