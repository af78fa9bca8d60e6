"""Reward functions by name (design.md: ``dare/rewards/`` knows nothing about training).

Every reward is ``fn(completion, ground_truth, extra_info=None) -> RewardResult`` and registers itself with
``@reward("name")``. Recipes name rewards (optionally with weights, see :func:`combine`); a row without an
explicit choice gets :func:`score_for_source`'s default, which mirrors DARE's dispatch (models-and-sampling §6.2).

Known names: math, math_answer_tag, gsm8k (``dare.rewards.math``); countdown, sudoku (``dare.rewards.puzzles``);
format_strict, format_soft, format_xml_count (``dare.rewards.format``); code (``dare.rewards.code``, run in the
sandbox of ``dare.rewards.sandbox``).
"""

from __future__ import annotations

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
        import importlib
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


def score_for_source(data_source: str, task: str | None = "math") -> str:
    """Default reward name for a row, as DARE's ``dllm_rm`` dispatches (task first, then data source)."""
    if task == "code":
        return "code"
    if data_source.startswith("sudoku"):
        return "sudoku"
    if data_source == "countdown":
        return "countdown"
    return "math"  # gsm8k, math, math500, aime...: DARE scores all of them with the boxed math reward


def unscorable(ground_truth, data_source: str, extra_info: dict | None = None) -> str | None:
    """Why the row's default reward (``score_for_source``) can score no completion of it, or None: an empty
    ground truth, or code tests of no known format or that do not parse."""
    if ground_truth is None or (isinstance(ground_truth, str) and not ground_truth.strip()):
        return "no ground truth"
    extra = extra_info or {}
    if score_for_source(data_source, extra.get("task")) == "code":
        return code.test_problem(str(ground_truth), extra)
    return None


BOXED_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def answer_instruction(prompt_text: str, data_source: str, task: str | None = "math") -> str:
    """The instruction asking for the format that the row's default reward scores, or "" when the prompt already
    asks for it. Only the boxed ``math`` reward needs one: the reference's GSM8K/MATH/AIME prompts are bare
    questions (models-and-sampling §8, defect 16); countdown/sudoku prompts ask for ``<answer>`` tags, and the code
    reward takes fenced or plain code."""
    if score_for_source(data_source, task) == "math" and "\\boxed" not in prompt_text:
        return BOXED_INSTRUCTION
    return ""


from dare.rewards import code, format, math, puzzles  # noqa: E402,F401  (register the built-in rewards)
