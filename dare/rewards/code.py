"""The ``code`` reward: extract the program from a completion, append the row's tests, run it in the sandbox;
1.0 only if every test ran and passed, else 0.0 (missing code or tests -> 0). Test formats:

* a JSON list of assert strings (MBPP): the asserts run after the program;
* test source defining ``check(candidate)`` (HumanEval, EvalPlus): run the way the benchmark defines it,
  ``prompt + completion + test + check(entry_point)``. The prompt's code (imports, helpers, signature) comes from
  ``extra_info["code_prompt"]`` or the row's last user message (the router hands the prompt messages over); the
  entry point from ``extra_info["entry_point"]`` or the last function the prompt defines (true of all 164
  HumanEval problems). A completion may restate the whole function or give only the body: both run.

The reference's version (models-and-sampling §8, defect 15) ran the completion without the prompt and checked the
first ``def``: completions relying on the prompt's imports, or defining a helper first, failed.

"Every test ran": the tests run inside a harness that prints a per-job random token (handed over on stdin, never
written into the program) after the last test; the job passes only if it exited 0 *and* printed the token, so
``sys.exit(0)`` / ``os._exit(0)`` / ``SystemExit`` before the asserts score 0. Not defended: code that inspects
the harness's frames to find the token, or returns objects whose ``__eq__`` is always true.

Extraction: a single fenced block is the program; with several, the first containing ``def``, else the last;
no fence -> the completion itself (MBPP's ``[BEGIN] ... [DONE]`` markers are cut). ``if __name__ == "__main__":``
blocks are dropped. Leading indentation is kept (a fenced function body stays a body).
"""

import ast
import json
import re
import secrets

from .base import RewardResult, reward
from .sandbox import CodeJob, run

_FENCE = re.compile(r"```[a-zA-Z0-9_+-]*\n(.*?)```", re.S)
_MAIN = re.compile(r"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:.*?(?=^\S|\Z)", re.S | re.M)
_DEF = re.compile(r"^def\s+(\w+)\s*\(", re.M)

# Runs the tests in a fresh namespace and prints the token only after all of them; any exception (SystemExit
# included) fails the job. os.write is bound before the program runs, so patching it changes nothing.
_RUNNER = """\
import os, sys, traceback
def _dare_run(source):
    token, write, exit = sys.stdin.readline().strip(), os.write, os._exit
    try:
        exec(compile(source, "solution.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        write(2, ("SystemExit(%r): the program exited before every test ran\\n" % (e.code,)).encode()); exit(1)
    except BaseException:
        write(2, traceback.format_exc().encode(errors="replace")); exit(1)
    sys.stdout.flush()
    write(1, ("\\n" + token + "\\n").encode()); exit(0)
"""


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


def harness(code: str, tests: str, extra_info: dict | None = None) -> str | None:
    """The program to run (solution, then its tests), or None when the tests are of no known format."""
    try:
        asserts = json.loads(tests)
    except (json.JSONDecodeError, TypeError):
        asserts = None
    if isinstance(asserts, list):
        return code + "\n\n" + "\n".join(asserts) + "\n"
    if "def check(" in tests:
        extra = extra_info or {}
        prompt = code_prompt(extra)
        entry = extra.get("entry_point") or (_DEF.findall(prompt) or _DEF.findall(code) or [None])[-1]
        return None if entry is None else f"{prompt}\n{code}\n\n{tests}\n\ncheck({entry})\n"
    return None


def test_problem(tests: str, extra_info: dict) -> str | None:
    """Why ``tests`` cannot judge any solution (no known format, or the program they make does not parse), or None."""
    program = harness("pass", tests, extra_info)
    if program is None:
        return "tests of no known format"
    try:
        ast.parse(program)
    except SyntaxError as e:
        return f"tests do not parse ({e.msg})"
    return None


def run_tests(program: str, timeout: float = 10.0):
    """Run ``program`` under the token harness: ``(passed, reason)``; passed only if it ran to its end."""
    token = secrets.token_hex(16)
    result = run(CodeJob(f"{_RUNNER}_dare_run({program!r})\n", timeout=timeout, stdin=token + "\n"))
    finished = result.stdout.rstrip().endswith(token)
    if result.passed and not finished:
        return False, "error: the program ended before every test ran"
    return result.passed and finished, result.reason


@reward("code")
def code_reward(completion: str, ground_truth: str, extra_info: dict | None = None, timeout: float = 10.0):
    code = extract_code(completion)
    program = harness(code, ground_truth, extra_info) if code else None
    if program is None:
        return RewardResult(0.0, 0.0, "ERROR: no code" if code is None else "ERROR: unknown test format")
    passed, reason = run_tests(program, timeout)
    return RewardResult(float(passed), float(passed), reason)
