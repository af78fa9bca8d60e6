"""Math rewards: the last ``\\boxed{}`` answer (DARE's default), ``<answer>``-tag variants, and GSM8K's number reading.

Binary rewards, no format term. Equivalence = a fast normalised string check, then ``math_verify`` (parse +
verify). math_verify's timeouts use ``signal.alarm``, which only works in the main thread, so they are enabled
there and disabled in worker threads (rewards are often scored from a thread pool); long predictions are not
handed to sympy at all. DARE's own Hendrycks/sympy grader (§6.2) is replaced by math_verify.
"""

from __future__ import annotations

import re
import threading

from .base import RewardResult, reward

NO_ANSWER = "ERROR: Answer Extraction Failed"
MAX_VERIFY_CHARS = 1000  # longer predictions are compared as strings only
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}``, braces matched; ``None`` if absent or unbalanced."""
    starts = list(_BOX.finditer(text))
    if not starts:
        return None
    i = start = starts[-1].end()
    depth = 1
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
        i += 1
    return None


def last_answer_tag(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` span; a last ``<answer>`` left open runs to the end of the text
    (the model ended its turn inside the span, the way d1's parser reads up to the end-of-turn token)."""
    opened = text.rfind("<answer>")
    if opened >= 0 and "</answer>" not in text[opened:]:
        return text[opened + len("<answer>"):]
    spans = _ANSWER.findall(text)
    return spans[-1] if spans else None


def _normalise(s: str) -> str:
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\$", ""), ("$", ""), ("dfrac", "frac"),
                     ("tfrac", "frac"), ("^{\\circ}", ""), ("^\\circ", "")):
        s = s.replace(old, new)
    return "".join(s.split()).rstrip(".")


def is_equiv(pred: str, gold: str) -> bool:
    """``pred`` and ``gold`` (bare answers, no ``\\boxed``) denote the same mathematical object."""
    if _normalise(pred) == _normalise(gold) != "":
        return True
    if len(pred) > MAX_VERIFY_CHARS:
        return False
    from math_verify import parse, verify

    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        g = parse("\\boxed{" + gold + "}", parsing_timeout=timeout)
        p = parse("\\boxed{" + pred + "}", parsing_timeout=timeout)
        return bool(g and p and verify(g, p, timeout_seconds=timeout))
    except Exception:  # sympy/latex errors and math_verify timeouts count as wrong
        return False


def _gold(ground_truth: str) -> str:
    boxed = last_boxed(ground_truth)
    return (boxed if boxed is not None else ground_truth).strip()


def _score(pred: str | None, gold: str) -> RewardResult:
    if pred is None:
        return RewardResult(0.0, 0.0, NO_ANSWER)
    ok = float(is_equiv(pred.strip(), gold))
    return RewardResult(ok, ok, pred)


@reward("math")
def math_reward(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
    """1.0 when the last boxed answer equals the (possibly boxed) ground truth, else 0.0."""
    return _score(last_boxed(completion), _gold(ground_truth))


@reward("math_answer_tag")
def math_answer_tag(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
    """Like ``math`` but the answer is the last ``<answer>...</answer>`` span (a box inside it is unwrapped)."""
    span = last_answer_tag(completion)
    if span is not None and last_boxed(span) is not None:
        span = last_boxed(span)
    return _score(span, _gold(ground_truth))


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?|-?\.\d+")
_UNIT_TEXT = re.compile(r"[A-Za-z%°'’\s.:,;!?()/-]*")


def read_number(answer: str) -> str:
    """The number a short GSM8K-style answer states, as text: ``\\$1,234.50`` -> ``1234.50``, ``800 ml`` -> ``800``,
    ``x = -5`` -> ``-5``, ``5 \\times 3 = 15`` -> ``15``. An answer that is not one number with unit words around
    it (``3 or 4``, ``\\frac{3}{4}``) comes back cleaned but whole, for ``is_equiv`` to judge."""
    text = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}|\\?\.?boxed\s*\{([^{}]*)\}", r"\1\2", answer)
    for old, new in (("\\$", ""), ("$", ""), ("\\%", "%"), ("\\,", ""), ("\\!", ""), ("\\ ", " ")):
        text = text.replace(old, new)
    text = _THOUSANDS.sub("", text).strip()
    if "=" in text:
        text = text.rsplit("=", 1)[1].strip()  # the value stated last
    numbers = _NUMBER.findall(text)
    if len(numbers) == 1 and _UNIT_TEXT.fullmatch(_NUMBER.sub(" ", text, count=1)) and "\\" not in text:
        return numbers[0]
    return text.rstrip(".").strip()


def _hashes_or_box(completion: str) -> str | None:
    """The answer after the last ``####`` or in the last box, whichever comes later in the text."""
    hashes = completion.rfind("####")
    box = [m.start() for m in _BOX.finditer(completion)]
    if hashes >= 0 and (not box or hashes > box[-1]):
        return completion[hashes + 4:].strip().split("\n")[0] or None
    box = last_boxed(completion)
    return None if box is None or not box.strip(" .") else box  # an empty or "..." box states nothing


def _gsm8k_gold(ground_truth: str) -> str:
    return read_number(ground_truth.split("####")[-1] if "####" in ground_truth else _gold(ground_truth))


@reward("gsm8k")
def gsm8k(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
    """GSM8K: the number after the last ``####`` or in the last box (whichever comes later), unit words, currency
    signs and thousands separators dropped (``read_number``)."""
    pred = _hashes_or_box(completion)
    return _score(None if pred is None else read_number(pred), _gsm8k_gold(ground_truth))


@reward("gsm8k_or_tag")
def gsm8k_or_tag(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
    """``gsm8k``, and without a box or ``####`` the number in the last ``<answer>`` span (d1's prompt asks for the
    box inside the tags; its models often leave the box out)."""
    pred = _hashes_or_box(completion)
    pred = last_answer_tag(completion) if pred is None else pred
    return _score(None if pred is None else read_number(pred), _gsm8k_gold(ground_truth))


@reward("math_or_tag")
def math_or_tag(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
    """``math``, and without a box the last ``<answer>`` span."""
    pred = last_boxed(completion)
    return _score(last_answer_tag(completion) if pred is None else pred, _gold(ground_truth))


RELAXED_TOLERANCE = 0.05  # ChartQA's relaxed accuracy: a number within 5 % of the gold one is right


def _float(text: str) -> float | None:
    try:
        return float(read_number(text).rstrip("%"))
    except ValueError:
        return None


@reward("relaxed")
def relaxed(completion: str, ground_truth: str, extra_info: dict | None = None) -> RewardResult:
    """ChartQA's relaxed accuracy on the last boxed answer: a number within 5 % of the gold number (relative; a gold
    0 exactly), otherwise the answers equal up to case and spacing (or ``math``'s equivalence)."""
    pred, gold = last_boxed(completion), _gold(ground_truth)
    if pred is None:
        return RewardResult(0.0, 0.0, NO_ANSWER)
    number, target = _float(pred), _float(gold)
    if number is not None and target is not None:
        ok = abs(number - target) <= RELAXED_TOLERANCE * abs(target)
    else:
        ok = " ".join(pred.lower().split()) == " ".join(gold.lower().split()) or is_equiv(pred.strip(), gold)
    return RewardResult(float(ok), float(ok), pred)

