"""The ``code`` reward: extract the program from a completion, append the row's tests, run it in the sandbox;
1.0 if every test passes, else 0.0 (missing code or tests -> 0). Test formats (models-and-sampling §6.2):

* a JSON list of assert strings (MBPP): the asserts run after the program;
* test source defining ``check(candidate)`` (HumanEval): ``check(<first function defined in the completion>)``.

Extraction: a single fenced block is the program; with several, the first containing ``def``, else the last;
no fence -> the completion itself (MBPP's ``[BEGIN] ... [DONE]`` markers are cut). ``if __name__ == "__main__":``
blocks are dropped so they cannot run instead of the tests.
"""

import json
import re

from . import RewardResult, reward
from .sandbox import CodeJob, run

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.S)
_MAIN = re.compile(r"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:.*?(?=^\S|\Z)", re.S | re.M)


def extract_code(completion: str) -> str | None:
    blocks = _FENCE.findall(completion)
    if blocks:
        code = blocks[0] if len(blocks) == 1 else next((b for b in blocks if "def " in b), blocks[-1])
    else:
        code = completion.split("[BEGIN]")[-1].split("[DONE]")[0]
    code = _MAIN.sub("", code).strip()
    return code if len(code) >= 10 else None


def harness(code: str, tests: str) -> str | None:
    """The program to run, or None when the tests are of no known format."""
    try:
        asserts = json.loads(tests)
    except (json.JSONDecodeError, TypeError):
        asserts = None
    if isinstance(asserts, list):
        return code + "\n\n" + "\n".join(asserts) + "\n"
    if "def check(" in tests:
        entry = re.search(r"^def\s+(\w+)\s*\(", code, re.M)
        return None if entry is None else f"{code}\n\n{tests}\n\ncheck({entry.group(1)})\n"
    return None


@reward("code")
def code_reward(completion: str, ground_truth: str, extra_info: dict | None = None, timeout: float = 10.0):
    code = extract_code(completion)
    program = harness(code, ground_truth) if code else None
    if program is None:
        return RewardResult(0.0, 0.0, "ERROR: no code" if code is None else "ERROR: unknown test format")
    result = run(CodeJob(program, timeout=timeout))
    return RewardResult(float(result.passed), float(result.passed), result.reason)
