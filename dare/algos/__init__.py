"""RL algorithms, one file each, registered by name with ``@register("name")``.

``base.Algorithm`` is plain GRPO on a per-token likelihood estimate; an algorithm file subclasses it and changes
only what differs (estimator, advantage, loss, what the rollout records, defaults). Every module in this package is
imported on first lookup, so adding an algorithm is one new file here and one recipe — no edit elsewhere.
"""

import importlib
import pkgutil

ALGORITHMS: dict[str, type] = {}


def register(name: str):
    def add(cls):
        if name in ALGORITHMS and ALGORITHMS[name] is not cls:
            raise ValueError(f"algorithm {name!r} is already registered")
        cls.name = name
        ALGORITHMS[name] = cls
        return cls

    return add


def _import_all():
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


def known() -> list[str]:
    _import_all()
    return sorted(ALGORITHMS)


def get_algorithm(name: str) -> type:
    """The algorithm class registered as ``name`` (a dataclass of its knobs)."""
    if name not in known():
        raise ValueError(f"Unknown algorithm {name!r}; registered: {', '.join(known())}")
    return ALGORITHMS[name]


def matrix(families=("llada", "dream", "sdar", "sdar_moe", "llada2")) -> str:
    """The algorithm x family support table (markdown), from the registry: ``python -m dare.algos``."""
    rows = ["| algorithm | " + " | ".join(families) + " | estimator | advantage | loss on | sglang rollouts |",
            "|---|" + "---|" * (len(families) + 4)]
    for name in known():
        algo = ALGORITHMS[name]()
        cells = ["yes" if algo.families is None or f in algo.families else "—" for f in families]
        estimator = type(algo.estimator()).__name__
        offline, needs = getattr(algo, "offline", False), getattr(algo, "needs_sampler", "")
        engine = "— (offline)" if offline else ("— (hf only)" if needs else "yes")
        rows.append(f"| {name} | " + " | ".join(cells) + f" | {estimator} | {algo.advantage} | {algo.loss_mask} | "
                    f"{engine} |")
    reasons = [f"- {name} —: {ALGORITHMS[name].why_not}" for name in known()
               if ALGORITHMS[name].families is not None and set(families) - set(ALGORITHMS[name].families)]
    return "\n".join(rows + ([""] + reasons if reasons else [])) + "\n"
