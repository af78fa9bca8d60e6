"""The ``code`` reward: extract the program from a completion, run it against the row's tests in the sandbox; 1.0
only if every test ran and passed, else 0.0 (missing code or tests -> 0). Test formats:

* a JSON list of assert strings (MBPP): the asserts call the candidate's functions by name;
* test source defining ``check(candidate)`` (HumanEval, EvalPlus): run the way the benchmark defines it,
  ``check(entry_point)`` after the prompt's code. The prompt's code (imports, helpers, signature) comes from
  ``extra_info["code_prompt"]`` or the row's last user message (the router hands the prompt messages over); the
  entry point from ``extra_info["entry_point"]`` or the last function the prompt defines (true of all 164
  HumanEval problems). A completion may restate the whole function or give only the body: both run.

The tests cannot be forged: they run in the judge (``code_judge.py``), a process apart from the candidate's code,
which calls the candidate's functions through pipes and gets literal values back (docs/sandbox.md "Code sandbox").

Extraction: a single fenced block is the program; with several, the first containing ``def``, else the last;
no fence -> the completion itself (MBPP's ``[BEGIN] ... [DONE]`` markers are cut). ``if __name__ == "__main__":``
blocks are dropped. Leading indentation is kept (a fenced function body stays a body).
"""

import ast
import json
import re
import secrets
from pathlib import Path

from .base import RewardResult, reward
from .sandbox import CodeJob, run

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.S)
_MAIN = re.compile(r"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:.*?(?=^\S|\Z)", re.S | re.M)
_DEF = re.compile(r"^def\s+(\w+)\s*\(", re.M)

JUDGE = (Path(__file__).parent / "code_judge.py").read_text()


def extract_code(completion: str) -> str | None:
    blocks = _FENCE.findall(completion)
    if blocks:
        code = blocks[0] if len(blocks) == 1 else next((b for b in blocks if "def " in b), blocks[-1])
    else:
        code = completion.split("[BEGIN]")[-1].split("[DONE]")[0]
    code = re.sub(r"^(?:[ \t]*\n)+", "", _MAIN.sub("", code).rstrip())
    return code if len(code.strip()) >= 10 else None


def code_prompt(extra_info: dict) -> str:
    """The code part of the prompt: ``extra_info["code_prompt"]``, else the last user message from the first line
    on which the rest parses as Python (drops an instruction such as "Complete the following python code:")."""
    if extra_info.get("code_prompt") is not None:
        return extra_info["code_prompt"]
    users = [m["content"] for m in extra_info.get("prompt") or [] if m.get("role") == "user"]
    if not users:
        return ""
    text = users[-1]
    fenced = _FENCE.findall(text)
    if fenced:
        return fenced[-1]
    lines = text.split("\n")
    for i in range(min(len(lines), 20)):
        candidate = "\n".join(lines[i:])
        try:
            ast.parse(candidate)
        except SyntaxError:
            continue
        return candidate
    return ""


def judged(code: str, tests: str, extra_info: dict | None = None) -> dict | None:
    """What the judge runs: the candidate's module, the dataset's own setup code, the tests and the entry point
    (``check`` tests), or None when the tests are of no known format."""
    try:
        asserts = json.loads(tests)
    except (json.JSONDecodeError, TypeError):
        asserts = None
    if isinstance(asserts, list):
        return {"candidate": code, "setup": "", "tests": "\n".join(asserts) + "\n", "entry": None}
    if "def check(" in tests:
        extra = extra_info or {}
        prompt = code_prompt(extra)
        entry = extra.get("entry_point") or (_DEF.findall(prompt) or _DEF.findall(code) or [None])[-1]
        if entry is None:
            return None
        return {"candidate": f"{prompt}\n{code}\n", "setup": prompt, "tests": tests, "entry": entry}
    return None


def test_problem(tests: str, extra_info: dict) -> str | None:
    """Why ``tests`` cannot judge any solution (no known format, or they or the prompt's code do not parse), or
    None."""
    payload = judged("pass", tests, extra_info)
    if payload is None:
        return "tests of no known format"
    for part in ("setup", "tests", "candidate"):
        try:
            ast.parse(payload[part])
        except SyntaxError as e:
            return f"tests do not parse ({e.msg})"
    return None


def judge_job(payload: dict, timeout: float = 10.0) -> tuple[CodeJob, str]:
    """The sandbox job that judges ``payload``, and the token its verdict must carry."""
    token = secrets.token_hex(16)
    return CodeJob(f"{JUDGE}\nmain({payload!r})\n", timeout=timeout, stdin=token + "\n"), token


def verdict(result, token: str) -> tuple[bool, str]:
    """``(passed, reason)`` of a judge job's result: passed only with the judge's own ``PASS <token>``."""
    finished = result.stdout.strip() == f"PASS {token}"
    if result.passed and not finished:
        return False, "error: the program ended before every test ran"
    return result.passed and finished, result.reason


def run_tests(payload: dict, timeout: float = 10.0) -> tuple[bool, str]:
    """Run ``payload``'s tests against its candidate in the sandbox: ``(passed, reason)``."""
    job, token = judge_job(payload, timeout)
    return verdict(run(job), token)


@reward("code")
def code_reward(completion: str, ground_truth: str, extra_info: dict | None = None, timeout: float = 10.0):
    code = extract_code(completion)
    payload = judged(code, ground_truth, extra_info) if code else None
    if payload is None:
        return RewardResult(0.0, 0.0, "ERROR: no code" if code is None else "ERROR: unknown test format")
    passed, reason = run_tests(payload, timeout)
    return RewardResult(float(passed), float(passed), reason)
