"""Puzzle rewards (models-and-sampling §6.2): countdown and 4x4 sudoku, both read the last ``<answer>`` span.

Countdown reads the expression the way models write it (d1's prompt asks for ``<answer>\\boxed{a + b * c}</answer>``):
the last box inside the span, or the last box of the text when there is no span; LaTeX operators (``\\times``,
``\\cdot``, ``\\div``, ``×``, ``÷``, ``\\frac{a}{b}``) become ``* /`` and a trailing ``= <target>`` is dropped
(another stated value stays, and fails). 0 without an answer; 0.1 (format score) when the integers used differ
from the given numbers, the expression has characters outside ``0-9 + - * / ( ) .`` and whitespace, or cannot be
evaluated (division by zero included); 1.0 when ``|value - target| < 1e-5``, else 0.1. The expression is evaluated
by walking its ``ast`` (numbers, + - * /, unary +/-), never with ``eval``. Unlike DARE, whose ``acc`` equals the
score (so 0.1 showed up as accuracy), ``acc`` here is 1.0 only for a correct expression.

Sudoku: partial credit = fraction of the originally empty cells (``extra_info["puzzle"]``, '0' = empty) whose
digit equals the solution (the digits of the span, in order); ``acc`` is 1.0 only when all of them are right. A last
``<answer>`` left open reads to the end of the completion (``last_answer_tag``).
"""

from __future__ import annotations

import ast
import json
import operator
import re

from .base import RewardResult, reward
from .math import last_answer_tag, last_boxed

FORMAT_SCORE = 0.1
MAX_EXPR_CHARS = 256
_ALLOWED = re.compile(r"[\d+\-*/().\s]*")
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_OPERATORS = (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"), ("×", "*"), ("÷", "/"), ("\\left", ""),
              ("\\right", ""), ("\\(", ""), ("\\)", ""), ("$", ""))


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    raise ValueError(f"disallowed expression node {type(node).__name__}")  # e.g. ** (Pow), names, calls


def safe_arithmetic(expr: str) -> float | None:
    """Value of a + - * / expression over numeric literals, or ``None`` if it is not one or fails to evaluate."""
    if len(expr) > MAX_EXPR_CHARS or not _ALLOWED.fullmatch(expr):
        return None
    try:
        return float(_eval(ast.parse(expr.strip(), mode="eval")))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError, TypeError):
        return None


def _numbers(extra_info: dict | None) -> list[int]:
    raw = (extra_info or {}).get("numbers", [])
    return [int(n) for n in (json.loads(raw) if isinstance(raw, str) else raw)]


def countdown_expression(completion: str, target: float | None = None) -> str | None:
    """The expression a countdown answer states (see the module docstring), or None without an answer."""
    span = last_answer_tag(completion)
    inner = last_boxed(span if span is not None else completion)
    expr = inner if inner is not None else span
    if expr is None:
        return None
    for old, new in _OPERATORS:
        expr = expr.replace(old, new)
    while _FRAC.search(expr):
        expr = _FRAC.sub(r"(\1)/(\2)", expr)
    expr = expr.replace("{", "(").replace("}", ")")  # LaTeX grouping
    head, _, tail = expr.rpartition("=")
    if head and target is not None and safe_arithmetic(tail) == float(target):
        expr = head
    return expr.strip()


@reward("countdown")
def countdown(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
    """Use each given number exactly once with + - * / to reach ``ground_truth`` (the target)."""
    expr = countdown_expression(completion, float(ground_truth))
    if expr is None:
        return RewardResult(0.0, 0.0, None)
    if sorted(int(n) for n in re.findall(r"\d+", expr)) != sorted(_numbers(extra_info)):
        return RewardResult(FORMAT_SCORE, 0.0, expr)
    value = safe_arithmetic(expr)
    if value is None or abs(value - float(ground_truth)) >= 1e-5:
        return RewardResult(FORMAT_SCORE, 0.0, expr)
    return RewardResult(1.0, 1.0, expr)


@reward("sudoku")
def sudoku(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
    """4x4 sudoku: fraction of the puzzle's empty cells filled with the solution's digit."""
    span = last_answer_tag(completion)
    if span is None:
        return RewardResult(0.0, 0.0, None)
    digits = "".join(ch for ch in span if ch.isdigit())
    pred = (digits + "0" * 16)[:16]
    solution = ground_truth.strip()
    puzzle = (extra_info or {}).get("puzzle") or "0" * len(solution)
    empty = [i for i, ch in enumerate(puzzle) if ch == "0"]
    if not empty:
        score = float(pred == solution)
    else:
        score = sum(pred[i] == solution[i] for i in empty) / len(empty)
    return RewardResult(score, float(score == 1.0), pred)
