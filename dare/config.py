"""Script configuration: a tyro dataclass per script, filled from a recipe YAML, overridden on the command line.

    args = parse(Args)     # python script.py --config recipes/x.yaml --learning-rate 1e-5

A recipe may start from another: ``base: other.yaml`` (relative to the recipe's folder) loads that one first, and
the recipe's own keys override it, section by section. Values are converted to the declared types (``1e-5`` is a
float), or refused naming the key.

    if __name__ == "__main__":
        run(main, lambda: parse(Args))   # a user error prints "error: <message>" and exits 2
"""

import argparse
import atexit
import dataclasses
import inspect
import os
import shutil
import sys
import tempfile
import time
import traceback
import types
import typing
from pathlib import Path

import tyro
import yaml


def convert(value, kind, where: str):
    """``value`` (as YAML read it) as the declared type ``kind``: YAML reads ``1e-5`` as text and ``5`` as an int, so
    numbers written either way become the float or int the field declares; anything that does not fit is an error
    naming the key."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin is typing.Annotated:
        return convert(value, args[0], where)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return convert(value, option, where)
            except ValueError as e:
                errors.append(e)
        raise errors[0]
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {value!r} ({type(value).__name__})")
        inner = args[0] if args else typing.Any
        return origin(convert(v, inner, f"{where}[{i}]") for i, v in enumerate(value))
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind in (int, float):
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
            value = value if number is None else number
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if kind is float:
                return float(value)
            if float(value).is_integer():
                return int(value)
    elif kind is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    else:
        return value  # dict, Any and other types: as written
    raise ValueError(f"{where}: expected {getattr(kind, '__name__', kind)}, got {value!r} ({type(value).__name__})")


@dataclasses.dataclass(frozen=True)
class OneOf:
    values: tuple[str, ...]


def one_of(*values: str, optional: bool = False):
    """The type of a text knob taking one of ``values`` (``optional``: or None): ``--help`` lists them and
    ``check_choices`` refuses others with DARE's one-line error (a ``Literal`` would print tyro's box instead)."""
    shown = "{" + ",".join(("None",) * optional + values) + "}"
    return typing.Annotated[str | None if optional else str, tyro.conf.arg(metavar=shown), OneOf(tuple(values))]


def choices_of(kind) -> tuple[str, ...] | None:
    """The values a ``one_of`` type takes (None: ``kind`` is no ``one_of``)."""
    return next((m.values for m in getattr(kind, "__metadata__", ()) if isinstance(m, OneOf)), None)


def check_choices(config, prefix: str = "") -> None:
    """Refuse a ``one_of`` field of the dataclass ``config`` holding a value outside its choices (None passes: the
    field's owner fills it in), naming the knob and the choices."""
    hints = typing.get_type_hints(type(config), include_extras=True)
    for f in dataclasses.fields(config):
        value, choices = getattr(config, f.name), choices_of(hints[f.name])
        if choices is not None and value is not None and value not in choices:
            raise ValueError(f"Unknown {prefix}{f.name} {value!r}; known: {list(choices)}")


def _apply(instance, values: dict, source: str, prefix: str = ""):
    fields = {f.name: f for f in dataclasses.fields(instance)}
    hints = typing.get_type_hints(type(instance))
    for key, value in values.items():
        key = key.replace("-", "_")
        if key not in fields:
            raise ValueError(f"{source}: unknown key {prefix + key!r}; known: {sorted(fields)}")
        current = getattr(instance, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(f"{source}: {prefix + key!r} is a section: give it a mapping of its keys, got "
                                 f"{value!r}")
            _apply(current, value, source, f"{prefix}{key}.")
        else:
            setattr(instance, key, convert(value, hints.get(key, typing.Any), f"{source}: {prefix + key}"))
    return instance


def load_recipe(path) -> dict:
    """The recipe's values with its ``base`` chain merged in (the recipe's own keys win, nested sections merged)."""
    try:
        values = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f":{where.line + 1}" if where is not None else ""
        raise ValueError(f"{path}{line} is not valid YAML ({getattr(e, 'problem', None) or e})") from None
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


def parse(cls, argv: list[str] | None = None, config: tuple = (), groups: dict[str, str] | None = None,
          pages: str = "docs/training.md"):
    """``--config FILE`` (YAML, keys = field names, nested sections for nested dataclasses) sets the defaults;
    every field is also a flag. With ``groups`` (a title -> the space-separated fields it shows, sections included),
    ``--help`` prints one line per flag under those titles (and the docs ``pages`` to read) and ``--help-full``
    tyro's whole help."""
    argv = sys.argv[1:] if argv is None else argv
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    default = cls()
    if known.config:
        default = _apply(default, load_recipe(known.config), known.config)
    if groups and not {"-h", "--help"}.isdisjoint(rest):
        print(short_help(default, groups, prefixes=tyro.conf.OmitArgPrefixes not in config, pages=pages))
        sys.exit(0)
    check_flags(rest, default, prefixes=tyro.conf.OmitArgPrefixes not in config)
    rest = ["--help" if a == "--help-full" else a for a in rest]
    doc = "" if (cls.__doc__ or "").startswith(f"{cls.__name__}(") else inspect.cleandoc(cls.__doc__ or "")
    return tyro.cli(cls, args=rest, default=default, config=config,
                    description=doc + "\n\n--config FILE: a YAML recipe that sets the defaults.")


# Flags other tools name differently (Hugging Face, TRL, torchrun habits) -> DARE's flag, offered when one is unknown.
FLAG_HABITS = {
    "lr": "learning-rate", "model-name-or-path": "model", "model-path": "model", "epochs": "num-train-epochs",
    "num-epochs": "num-train-epochs", "steps": "max-steps", "out": "output-dir", "output": "output-dir",
    "dataset": "data.path", "data": "data.path", "data-path": "data.path", "batch-size": "micro-batch-size",
    "per-device-train-batch-size": "micro-batch-size", "bf16": "dtype", "fp16": "dtype", "lora-r": "lora.rank",
    "lora-rank": "lora.rank", "max-length": "data.max-length", "gen-length": "rollout.gen-length",
    "temperature": "rollout.temperature", "num-samples": "samples", "benchmark": "bench", "benchmarks": "bench"}


def flag_names(owner, prefix: str = "", prefixes: bool = True) -> set[str]:
    """Every flag tyro makes of the dataclass ``owner`` (without ``--``, hyphens for underscores): sections' fields
    under their section's name (``prefixes=False``: bare), aliases, and ``no-X`` for a boolean ``X``."""
    names = set()
    hints = typing.get_type_hints(type(owner), include_extras=True)
    for f in dataclasses.fields(owner):
        value = getattr(owner, f.name)
        if dataclasses.is_dataclass(value):
            names |= flag_names(value, f"{prefix}{f.name}." if prefixes else "", prefixes)
            continue
        aliases, kind = _aliases_and_type(hints.get(f.name))
        names |= {f"{prefix}{f.name}".replace("_", "-"), *(a.lstrip("-").replace("_", "-") for a in aliases)}
        if kind is bool:
            names.add(f"{prefix}no-{f.name}".replace("_", "-"))  # tyro: --section.no-flag
    return names


def _aliases_and_type(kind) -> tuple[list[str], object]:
    """A field's ``--flag`` aliases (``tyro.conf.arg(aliases=...)``) and its type without ``Annotated``."""
    aliases = [a for m in getattr(kind, "__metadata__", ()) for a in getattr(m, "aliases", None) or ()]
    while typing.get_origin(kind) is typing.Annotated:
        kind = typing.get_args(kind)[0]
    return aliases, kind


def check_flags(argv: list[str], args, prefixes: bool = True) -> None:
    """Refuse a flag the script does not have in one line, with the nearest flags it does have (tyro would print a
    box), before anything heavy loads."""
    import difflib
    known = flag_names(args, prefixes=prefixes) | {"help", "help-full"}
    for token in argv:
        if not token.startswith("--") or token == "--":
            continue
        flag = token[2:].split("=", 1)[0].replace("_", "-")
        if flag in known:
            continue
        habit = FLAG_HABITS.get(flag)
        near = {g: difflib.SequenceMatcher(None, flag, g).ratio() for g in known}
        best = max(near.values())
        guesses = ([habit] if habit in known else []) + sorted(
            (g for g, r in near.items() if r >= max(0.6, best - 0.1) and g != habit), key=lambda g: -near[g])
        hint = f" (did you mean {' or '.join('--' + g for g in guesses[:3])}?)" if guesses else ""
        raise ValueError(f"unknown flag --{flag}{hint}; every flag: --help")


def short_help(args, groups: dict[str, str], prefixes: bool = True, pages: str = "docs/training.md") -> str:
    """``--help`` a person reads: the script's purpose, then each group's flags one line each (choices, default,
    the help cut to the terminal's width; fields no group names come last, under "other"); ``--help-full`` has it
    all. ``prefixes=False``: a section's flags without its name (tyro's ``OmitArgPrefixes``)."""
    width = max(100, shutil.get_terminal_size((120, 24)).columns)
    prog = os.path.basename(sys.argv[0])
    lines = [f"usage: {prog} [--config RECIPE.yaml] [--FLAG VALUE ...]", "", (type(args).__doc__ or "").strip(), "",
             "--config FILE: a YAML recipe that sets the defaults (keys = the flags' names). Every flag with its whole",
             f"help: --help-full; the pages: {pages}."]
    named = {name for fields in groups.values() for name in fields.split()}
    rest = " ".join(f.name for f in dataclasses.fields(args) if f.name not in named)
    for title, fields in {**groups, **({"other": rest} if rest else {})}.items():
        lines += ["", f"{title}:"]
        for name in (n for n in fields.split() if hasattr(args, n)):  # sections a script may lack (preference)
            for flag, default, text in _flags(args, name, "", prefixes):
                line = f"  {flag:<44} {default:>12}"
                room = width - len(line) - 2
                text = text if len(text) <= room else text[:max(0, room - 1)].rstrip() + "…"
                lines.append(f"{line}  {text}".rstrip() if room > 8 else line)
    return "\n".join(lines)


def _flags(owner, name: str, prefix: str, prefixes: bool = True) -> list[tuple[str, str, str]]:
    """``(flag with its choices or type, default, help)`` for field ``name`` of ``owner``, a section's each."""
    value = getattr(owner, name)
    if dataclasses.is_dataclass(value):
        inner = f"{prefix}{name}." if prefixes else ""
        return [flag for f in dataclasses.fields(value) for flag in _flags(value, f.name, inner, prefixes)]
    kind = typing.get_type_hints(type(owner), include_extras=True).get(name)
    choices = choices_of(kind)
    aliases, kind = _aliases_and_type(kind)
    if typing.get_origin(kind) is typing.Literal:
        choices = typing.get_args(kind)
    options = [a for a in typing.get_args(kind) if a is not type(None)]
    optional = typing.get_origin(kind) in (typing.Union, types.UnionType) and len(options) < len(typing.get_args(kind))
    base = options[0] if optional and len(options) == 1 else kind
    shown = ("{" + ",".join(map(str, choices)) + "}" if choices else "" if base is bool
             else getattr(typing.get_origin(base) or base, "__name__", "VALUE").upper())
    flag = ", ".join(["--" + f"{prefix}{name}".replace("_", "-"), *aliases]) + (f" {shown}" if shown else "") + (
        "|None" if optional else "")
    try:  # the field's comment, as tyro reads it for --help-full
        from tyro._docstrings import get_field_docstring
        text = get_field_docstring(type(owner), name, ()) or ""
    except Exception:  # a tyro without that helper: the flags and defaults alone
        text = ""
    return [(flag, repr(value), " ".join(text.split()))]


# What a user's input can cause (a bad value, a missing file, column or hub name): a one-line error, not a traceback.
USER_ERRORS = (ValueError, KeyError, OSError, yaml.YAMLError)


def leave_together():
    """A finished multi-process run: all processes leave together, past Python's exit handlers (logs flushed) but
    without the interpreter's native teardown, where gloo's threads can abort a process (``terminate called without
    an active exception``) and fail a finished run: seen with and without destroying the process group first."""
    dist = sys.modules.get("torch.distributed")  # never imported just for this: --help stays light
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.barrier()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def traceback_file() -> Path:
    """Where a user error's traceback goes: one file per user (and rank), overwritten by the next error, so failed
    runs leave no litter in the temporary folder."""
    rank = os.environ.get("RANK", "0")
    suffix = "" if rank == "0" else f".rank{rank}"
    return Path(tempfile.gettempdir()) / f"dare-last-error.{os.getuid()}{suffix}.txt"


RANK_WAIT_S = 60.0  # how long a rank other than 0 waits for the launcher after an error before the processes joined


def run(main, make_args):
    """``main(make_args())`` as a script's entry point. A user error prints ``error: <message>`` and exits 2; the
    traceback goes to a file named in the message. ``--debug`` (anywhere on the command line) or ``DARE_DEBUG=1``
    lets it propagate with its traceback instead. Under a multi-process launcher, an error raised before the
    processes joined (checks of the arguments, the same on every rank) is printed by rank 0 only: the other ranks
    wait for the launcher to stop them once rank 0 has left (leaving first, they would have the launcher stop rank 0
    before it prints), and print it themselves after ``RANK_WAIT_S`` (an error of their own)."""
    debug = "--debug" in sys.argv[1:] or os.environ.get("DARE_DEBUG", "") not in ("", "0")
    sys.argv = [a for a in sys.argv if a != "--debug"]
    try:
        result = main(make_args())
        leave_together()
        return result
    except USER_ERRORS as e:
        if debug:
            raise
        message = e.args[0] if isinstance(e, KeyError) and e.args else e
        dist = sys.modules.get("torch.distributed")
        joined = dist is not None and dist.is_available() and dist.is_initialized()
        rank = os.environ.get("RANK", "0")
        path = traceback_file()
        partial = path.with_name(path.name + f".{os.getpid()}")
        with open(partial, "w") as f:
            traceback.print_exc(file=f)
        os.replace(partial, path)
        several = os.environ.get("WORLD_SIZE", "1") != "1"
        if rank != "0" and not joined and several:
            time.sleep(RANK_WAIT_S)
        where = f"rank {rank}: " if several and (joined or rank != "0") else ""
        print(f"error: {where}{message}\n(traceback in {path}; --debug or DARE_DEBUG=1 prints it)", file=sys.stderr)
        sys.exit(2)
