"""Format rewards for the ``<reasoning>...</reasoning><answer>...</answer>`` layout (d1's stack), so a recipe
can add a small format term next to a correctness reward, e.g. ``combine({"countdown": 1.0, "format_soft": 1.0})``.

* ``format_strict`` = 0.5 when the whole completion is exactly ``<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...
  \\n</answer>`` (optionally followed by whitespace), else 0.
* ``format_soft`` = 0.5 when the completion starts with ``<reasoning>...</reasoning>``, then whitespace, then
  ``<answer>...</answer>`` (anything may follow), else 0.
* ``format_xml_count`` = 0.125 for each of the four tags appearing exactly once with d1's newlines, minus
  0.001 per non-space character after ``</answer>`` (at most 0.5; a simplified d1 ``count_xml``).

Unlike d1 the patterns use DOTALL (d1's ``.`` stopped at newlines, so multi-line reasoning never matched) and the
strict form does not require a final newline (the reward manager strips the EOS, the text usually ends there).
``acc`` is 1.0 when the structure is present; ``ground_truth`` is ignored.
"""

from __future__ import annotations

import re

from .base import RewardResult, reward

FORMAT_WEIGHT = 0.5
_STRICT = re.compile(r"<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\s*", re.DOTALL)
_SOFT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)


def _flag(ok: bool) -> RewardResult:
    return RewardResult(FORMAT_WEIGHT if ok else 0.0, float(ok), None)


@reward("format_strict")
def format_strict(completion: str, ground_truth: str = "", extra_info: dict | None = None) -> RewardResult:
    return _flag(_STRICT.fullmatch(completion.lstrip()) is not None)


@reward("format_soft")
def format_soft(completion: str, ground_truth: str = "", extra_info: dict | None = None) -> RewardResult:
    return _flag(_SOFT.match(completion.lstrip()) is not None)


@reward("format_xml_count")
def format_xml_count(completion: str, ground_truth: str = "", extra_info: dict | None = None) -> RewardResult:
    score = 0.0
    for tag in ("<reasoning>\n", "\n</reasoning>\n", "\n<answer>\n", "\n</answer>"):
        score += 0.125 if completion.count(tag) == 1 else 0.0
    if completion.count("\n</answer>") == 1:
        score -= 0.001 * len(completion.split("\n</answer>")[-1].strip())
    return RewardResult(score, float(score >= 4 * 0.125), None)
