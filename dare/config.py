"""Script configuration: a tyro dataclass per script, filled from a recipe YAML, overridden on the command line.

    args = parse(Args)     # python script.py --config recipes/x.yaml --learning-rate 1e-5

A recipe may start from another: ``base: other.yaml`` (relative to the recipe's folder) loads that one first, and
the recipe's own keys override it, section by section.
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import tyro
import yaml


def _apply(instance, values: dict, where: str):
    fields = {f.name: f for f in dataclasses.fields(instance)}
    for key, value in values.items():
        key = key.replace("-", "_")
        if key not in fields:
            raise ValueError(f"{where}: unknown key {key!r}; known: {sorted(fields)}")
        current = getattr(instance, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            _apply(current, value, f"{where}.{key}")
        else:
            setattr(instance, key, value)
    return instance


def load_recipe(path) -> dict:
    """The recipe's values with its ``base`` chain merged in (the recipe's own keys win, nested sections merged)."""
    values = yaml.safe_load(Path(path).read_text()) or {}
    base = values.pop("base", None)
    return _merge(load_recipe(Path(path).parent / base), values) if base else values


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def peek(key: str, argv: list[str] | None = None, default=None):
    """The value of ``--key`` from the command line, else from the ``--config`` YAML, else ``default`` — for
    choices that decide the config class itself (``train_rl.py --algo``)."""
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    pre.add_argument(f"--{key.replace('_', '-')}", dest="value")
    known, _ = pre.parse_known_args(argv)
    if known.value is not None:
        return known.value
    if known.config:
        return load_recipe(known.config).get(key, default)
    return default


def parse(cls, argv: list[str] | None = None, config: tuple = ()):
    """``--config FILE`` (YAML, keys = field names, nested sections for nested dataclasses) sets the defaults;
    every field is also a flag."""
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    default = cls()
    if known.config:
        default = _apply(default, load_recipe(known.config), known.config)
    return tyro.cli(cls, args=rest, default=default, config=config,
                    description=(cls.__doc__ or "") + "\n\n--config FILE: a YAML recipe that sets the defaults.")
