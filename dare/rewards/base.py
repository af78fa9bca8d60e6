"""What a reward is (``fn(completion, ground_truth, extra_info=None) -> RewardResult``), the registry it joins
with ``@reward("name")``, lookup by name or import path, and weighted combinations."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RewardResult:
    score: float  # the scalar the algorithm turns into advantages
    acc: float  # 1.0 when the answer is correct, else 0.0 (logged as accuracy)
    pred: str | None = None  # the extracted answer, for logging


RewardFn = Callable[..., RewardResult]  # (completion: str, ground_truth: str, extra_info: dict | None) -> RewardResult
REWARDS: dict[str, RewardFn] = {}


def reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Register ``fn`` under ``name``; registering the same name twice is an error."""

    def register(fn: RewardFn) -> RewardFn:
        if name in REWARDS and REWARDS[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered")
        REWARDS[name] = fn
        return fn

    return register


def get_reward(name: str) -> RewardFn:
    """The reward registered as ``name``, or your own function by import path (``my_rewards.length_bonus``: a
    module on the Python path, e.g. next to the script; same signature, a RewardResult or a float score)."""
    if name not in REWARDS and "." in name:
        module, _, attr = name.rpartition(".")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"reward {name!r}: cannot import it ({e}); known rewards: "
                             f"{', '.join(sorted(REWARDS))}") from None
        REWARDS[name] = _as_result(fn)
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; known rewards: {', '.join(sorted(REWARDS))}, or "
                         "module.function of your own")
    return REWARDS[name]


def _as_result(fn: Callable) -> RewardFn:
    def scored(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
        out = fn(completion, ground_truth, extra_info)
        return out if isinstance(out, RewardResult) else RewardResult(float(out), float(float(out) > 0))
    return scored


def combine(names_with_weights: list[tuple[str, float]] | dict[str, float]) -> RewardFn:
    """A reward whose score is ``sum(w * fn(...).score)``; ``acc`` and ``pred`` come from the first (primary) one."""
    items = list(names_with_weights.items() if isinstance(names_with_weights, dict) else names_with_weights)
    if not items:
        raise ValueError("combine() needs at least one reward")
    fns = [(get_reward(name), float(weight)) for name, weight in items]  # fail early on unknown names

    def combined(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
        results = [(fn(completion, ground_truth, extra_info), w) for fn, w in fns]
        primary = results[0][0]
        return RewardResult(sum(w * r.score for r, w in results), primary.acc, primary.pred)

    return combined
