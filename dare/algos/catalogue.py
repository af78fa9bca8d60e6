"""What each algorithm is and how to run it, read from the registry, the algorithm files' docstrings and the recipes:
``python -m dare.algos`` (the support matrix, then one line per algorithm) and ``python -m dare.algos NAME`` (one
algorithm's card: paper, kind, families, knobs, recipes and commands)."""

import dataclasses
import re
import sys
from pathlib import Path

from . import ALGORITHMS, known
from .base import NOISE_WHY, Algorithm

RECIPES = Path(__file__).resolve().parents[2] / "recipes"  # a source checkout's recipes (absent from a wheel)
FAMILY_ORDER = ("llada", "dream", "sdar", "sdar_moe", "llada2", "diffusion_gemma")


def paper(cls) -> tuple[str | None, str | None]:
    """The arXiv id and the authors' code repository named in the algorithm file's docstring."""
    doc = sys.modules[cls.__module__].__doc__ or ""
    arxiv = re.search(r"arXiv:? ?(\d{4}\.\d{4,5})", doc)
    code = re.search(r"code: (github\.com/[\w.-]+/[\w.-]+)", doc)
    return (arxiv.group(1) if arxiv else None), (code.group(1) if code else None)


def summary(cls) -> str:
    """The class docstring's first sentence, without the name it starts with."""
    first = (cls.__doc__ or "").strip().split("\n")[0]
    return first.split(": ", 1)[1] if ": " in first else first


def recipes(name: str) -> list[Path]:
    """The recipes of ``name`` in the checkout, one family folder after another."""
    if not RECIPES.is_dir():
        return []
    found = []
    for family in FAMILY_ORDER:
        found += sorted((RECIPES / family).glob(f"{name}_*.yaml"), key=lambda p: ("paper" in p.stem, p.name))
    return found


def learning_rate(recipe: Path) -> str:
    """The recipe's learning rate as written (a recipe that inherits it: its base's)."""
    from ..config import load_recipe  # here: --help imports this package and the YAML reader is not needed there

    value = load_recipe(recipe).get("learning_rate")
    return f"{float(value):g}" if value is not None else "?"


def kind(cls) -> str:
    return "online RL" if cls.trainer == "rl" else "offline pairs"


def catalogue() -> str:
    """One markdown row per algorithm: what it is, its paper, its kind and its first recipe with its rate."""
    rows = ["| algorithm | what it is | paper | kind | recipe (lr) |", "|---|---|---|---|---|"]
    for name in known():
        cls = ALGORITHMS[name]
        arxiv, _ = paper(cls)
        first = recipes(name)[:1]
        recipe = f"`{first[0].relative_to(RECIPES.parent)}` ({learning_rate(first[0])})" if first else "—"
        rows.append(f"| {name} | {summary(cls)} | {f'arXiv {arxiv}' if arxiv else '—'} | {kind(cls)} | {recipe} |")
    return "\n".join(rows) + "\n"


def default_of(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def own_knobs(cls) -> list[str]:
    """``name = default`` of the knobs the algorithm adds, or whose default differs from plain GRPO's."""
    base = {f.name: default_of(f) for f in dataclasses.fields(Algorithm)}
    out = []
    for f in dataclasses.fields(cls):
        default = default_of(f)
        if f.name not in base:
            out.append(f"{f.name} = {default!r}")
        elif default != base[f.name]:
            out.append(f"{f.name} = {default!r}  (GRPO: {base[f.name]!r})")
    return out


def card(name: str) -> str:
    """One algorithm: what it is, its paper and code, kind, families, its own knobs, recipes and commands."""
    cls = ALGORITHMS.lookup(name)
    arxiv, code = paper(cls)
    families = [f for f in FAMILY_ORDER if cls().supports(f)]
    lines = [f"{name}: {summary(cls)}",
             f"  paper: {f'https://arxiv.org/abs/{arxiv}' if arxiv else '—'}" + (f"   code: https://{code}" if code
                                                                                else ""),
             f"  kind: {kind(cls)}   families: {', '.join(families)}"]
    if len(families) < len(FAMILY_ORDER):
        lines.append(f"  not on {', '.join(f for f in FAMILY_ORDER if f not in families)}: "
                     f"{cls.why_not if cls.families is not None else NOISE_WHY}")
    lines.append("  knobs (--algo-config.NAME; those that differ from plain GRPO's):")
    lines += [f"    {knob}" for knob in own_knobs(cls)] or ["    (none)"]
    found = recipes(name)
    if found:
        lines.append("  recipes (learning rate):")
        lines += [f"    {p.relative_to(RECIPES.parent)} ({learning_rate(p)})" for p in found]
    data = "--preference.path task:addition" if cls.trainer != "rl" else \
        "--data.path task:sum4 --num-generations 4 --rollout.gen-length 16"
    lines += ["  try it on a tiny model:",
              f"    python train_rl.py --algo {name} --model tiny:{families[0]} {data} --max-steps 2 "
              "--prompts-per-step 2 --micro-batch-size 4 --output-dir outputs/try-" + name]
    if found:
        lines.append(f"    accelerate launch train_rl.py --config {found[0].relative_to(RECIPES.parent)}")
    lines.append(f"  every knob with its help: python train_rl.py --algo {name} --help")
    return "\n".join(lines) + "\n"
