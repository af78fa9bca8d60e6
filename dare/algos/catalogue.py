"""What each algorithm is and how to run it, read from the registry, the algorithm files' docstrings and the recipes:
``python -m dare.algos`` (the support matrix, then one line per algorithm), ``python -m dare.algos NAME`` (one
algorithm's card: paper, kind, families, knobs, recipes and commands) and ``python -m dare.algos --pages
docs/algorithms`` (the documentation site's page of each algorithm: the card with its objective and how DARE builds
it)."""

import dataclasses
import inspect
import re
import sys
from pathlib import Path

from . import ALGORITHMS, known
from .base import NOISE_WHY, Algorithm

RECIPES = Path(__file__).resolve().parents[2] / "recipes"  # a source checkout's recipes (absent from a wheel)
FAMILY_ORDER = ("llada", "dream", "sdar", "sdar_moe", "llada2", "diffusion_gemma", "nemotron_diffusion", "llada_v",
                "mmada")


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


def own_knobs(cls) -> list[tuple[str, object, object]]:
    """``(name, default, GRPO's default)`` of the knobs the algorithm adds (GRPO's: ``MISSING``) or whose default
    differs from plain GRPO's."""
    base = {f.name: default_of(f) for f in dataclasses.fields(Algorithm)}
    return [(f.name, default_of(f), base.get(f.name, dataclasses.MISSING)) for f in dataclasses.fields(cls)
            if f.name not in base or default_of(f) != base[f.name]]


def families(cls) -> tuple[list[str], list[str], str]:
    """The families ``cls`` runs on, those it does not, and why not."""
    on = [f for f in FAMILY_ORDER if cls().supports(f)]
    return on, [f for f in FAMILY_ORDER if f not in on], cls.why_not if cls.families is not None else NOISE_WHY


def try_command(name: str) -> str:
    """A two-step run of ``name`` on the first tiny model it supports."""
    cls = ALGORITHMS.lookup(name)
    family = families(cls)[0][0]
    data = "--preference.path task:addition" if cls.trainer != "rl" else \
        "--data.path task:sum4 --num-generations 4 --rollout.gen-length 16"
    return (f"python train_rl.py --algo {name} --model tiny:{family} {data} --max-steps 2 --prompts-per-step 2 "
            f"--micro-batch-size 4 --output-dir outputs/try-{name}")


def card(name: str) -> str:
    """One algorithm: what it is, its paper and code, kind, families, its own knobs, recipes and commands."""
    cls = ALGORITHMS.lookup(name)
    arxiv, code = paper(cls)
    on, missing, why = families(cls)
    lines = [f"{name}: {summary(cls)}",
             f"  paper: {f'https://arxiv.org/abs/{arxiv}' if arxiv else '—'}" + (f"   code: https://{code}" if code
                                                                                else ""),
             f"  kind: {kind(cls)}   families: {', '.join(on)}"]
    if missing:
        lines.append(f"  not on {', '.join(missing)}: {why}")
    lines.append("  knobs (--algo-config.NAME; those that differ from plain GRPO's):")
    lines += [f"    {knob} = {default!r}" + (f"  (GRPO: {grpo!r})" if grpo is not dataclasses.MISSING else "")
              for knob, default, grpo in own_knobs(cls)] or ["    (none)"]
    found = recipes(name)
    if found:
        lines.append("  recipes (learning rate):")
        lines += [f"    {p.relative_to(RECIPES.parent)} ({learning_rate(p)})" for p in found]
    lines += ["  try it on a tiny model:", f"    {try_command(name)}"]
    if found:
        lines.append(f"    accelerate launch train_rl.py --config {found[0].relative_to(RECIPES.parent)}")
    lines.append(f"  every knob with its help: python train_rl.py --algo {name} --help")
    return "\n".join(lines) + "\n"


NOTATION = (r"$\mathcal{C}(\rho, A) = \min\big(\rho A,\ \operatorname{clip}(\rho, 1 - \epsilon_{low},"
            r" 1 + \epsilon_{high})\, A\big)$ is PPO's clipped surrogate (where $A < 0$ the `dual_clip` $c$, when set,"
            r" bounds it below by $cA$); $A_i$: the row's advantage (the `advantage` knob); $m$: the tokens the loss"
            r" reads (`loss_mask`).")


def lab_rows(name: str) -> list[str]:
    """The rows of ``name`` (its variants and controls too) in each table of the lab's page (docs/lab.md) that has an
    algorithm column, under their table's header; one markdown table per source table."""
    lab = RECIPES.parent / "docs" / "lab.md"
    if not lab.exists():
        return []
    tables, current = [], []
    for line in lab.read_text().splitlines() + [""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    out = []
    for header, rule, *rows in (t for t in tables if len(t) > 2):
        cells = [c.strip() for c in header.strip("|").split("|")]
        column = next((i for i, c in enumerate(cells) if c.startswith("algorithm")), None)
        if column is None:
            continue
        mine = [row for row in rows if any(re.split(r"[:( ]", part.strip())[0] == name
                                           for part in row.strip("|").split("|")[column].split(","))]
        if mine:
            out += [header, rule, *mine, ""]
    return out


def page(name: str) -> str:
    """The documentation page of ``name``: what it is, its objective, how DARE builds it (its file's docstring), its
    knobs, recipes and commands."""
    cls = ALGORITHMS.lookup(name)
    arxiv, code = paper(cls)
    on, missing, why = families(cls)
    objective = inspect.cleandoc(cls.objective)
    lines = [f"# {name}", "", summary(cls)[0].upper() + summary(cls)[1:], "",
             f"- **paper**: [arXiv {arxiv}](https://arxiv.org/abs/{arxiv})" if arxiv else "- **paper**: —",
             *([f"- **authors' code**: [{code}](https://{code})"] if code else []),
             f"- **kind**: {kind(cls)}", f"- **families**: {', '.join(on)}",
             *([f"- **not on {', '.join(missing)}**: {why}"] if missing else []),
             "", "## Objective", "", objective, ""]
    if r"\mathcal{C}" in objective:
        lines += [NOTATION, ""]
    lines += ["## How DARE builds it", "", inspect.cleandoc(sys.modules[cls.__module__].__doc__ or ""), "",
              "## Knobs", "",
              f"Set with `--algo-config.NAME VALUE` (or `algo_config:` in a recipe). The knobs {name} adds or sets "
              f"differently from plain GRPO; every knob with its help: `python train_rl.py --algo {name} --help`.", ""]
    knobs = own_knobs(cls)
    lines += ["| knob | default | plain GRPO's |", "|---|---|---|"] if knobs else ["(none: plain GRPO's defaults)"]
    lines += [f"| `{knob}` | `{default!r}` | " + (f"`{grpo!r}`" if grpo is not dataclasses.MISSING else "—") + " |"
              for knob, default, grpo in knobs]
    lines += ["", "## Run it", "", "Two steps on a tiny random model (CPU, seconds):", "", "```bash",
              try_command(name), "```", ""]
    found = recipes(name)
    if found:
        lines += ["Its recipes, for 8B-class models (DARE's reference numbers; `*_paper.yaml`: the paper's):", "",
                  "```bash", f"accelerate launch train_rl.py --config {found[0].relative_to(RECIPES.parent)}", "```",
                  "", "| recipe | learning rate |", "|---|---|"]
        lines += [f"| `{p.relative_to(RECIPES.parent)}` | {learning_rate(p)} |" for p in found]
        lines.append("")
    lines += ["## In the lab", "",
              "[The comparison lab](../lab.md) trains every algorithm from one SFT start on tiny models beside a "
              "control whose reward is flipped, and reports each one's held-out gain in standard errors:", "",
              "```bash", f"python recipes/lab/compare.py --algos {name} --families {on[0]} --seeds 0 1 2", "```",
              ""]
    rows = lab_rows(name)
    lines += (["Its rows in the lab's tables (each table's settings and commands are on [the lab's page](../lab.md)):",
               "", *rows] if rows else ["The lab's tables have no row of it yet."])
    return "\n".join(lines).rstrip("\n") + "\n"


def write_pages(folder: Path) -> list[Path]:
    """Each algorithm's page written to ``folder/NAME.md``."""
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / f"{name}.md" for name in known()]
    for path in written:
        path.write_text(page(path.stem))
    return written
