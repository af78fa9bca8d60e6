"""Reward functions by name (design.md: ``dare/rewards/`` knows nothing about training).

Every reward is ``fn(completion, ground_truth, extra_info=None) -> RewardResult`` and registers itself with
``@reward("name")``. Recipes name rewards (optionally with weights, see :func:`combine`); a row without an
explicit choice gets :func:`score_for_source`'s default, which mirrors DARE's dispatch (models-and-sampling §6.2).

Known names: math, math_answer_tag, math_or_tag, gsm8k, gsm8k_or_tag, relaxed (``dare.rewards.math``); countdown,
sudoku (``dare.rewards.puzzles``); colours (drawings, ``dare.rewards.pictures``); format_strict, format_soft,
format_xml_count (``dare.rewards.format``); code (``dare.rewards.code``, run in the sandbox of
``dare.rewards.sandbox``).
"""

from __future__ import annotations

from . import code, format, math, pictures, puzzles  # noqa: F401  (register the built-in rewards)
from .base import REWARDS, RewardFn, RewardResult, combine, get_reward, reward


def score_for_source(data_source: str, task: str | None = "math") -> str:
    """Default reward name for a row, as DARE's ``dllm_rm`` dispatches (task first, then data source)."""
    if task == "code":
        return "code"
    if data_source.startswith("sudoku"):
        return "sudoku"
    if data_source == "countdown":
        return "countdown"
    if data_source == "chartqa":
        return "relaxed"  # ChartQA's relaxed accuracy on the boxed answer
    if data_source == "colours":
        return "colours"  # a drawing's colours where its prompt asks for them
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
    asks for it. Only the boxed rewards (``math``, ``relaxed``) need one: the reference's GSM8K/MATH/AIME prompts are
    bare questions (models-and-sampling §8, defect 16); countdown/sudoku prompts ask for ``<answer>`` tags, and the
    code reward takes fenced or plain code."""
    if score_for_source(data_source, task) in ("math", "relaxed") and "\\boxed" not in prompt_text:
        return BOXED_INSTRUCTION
    return ""


__all__ = ["BOXED_INSTRUCTION", "REWARDS", "RewardFn", "RewardResult", "answer_instruction", "combine", "get_reward",
           "reward", "score_for_source", "unscorable"]
