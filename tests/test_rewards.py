"""Reward functions: table-driven cases with exact expected scores, registry behaviour, threads, real rows."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dare.rewards import REWARDS, RewardResult, combine, get_reward, reward, score_for_source
from dare.rewards.math import NO_ANSWER, last_boxed
from dare.rewards.puzzles import safe_arithmetic

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
BIG = str(10**30)

MATH_CASES = [  # (completion, ground truth, expected score)
    ("so \\boxed{3} no wait \\boxed{72}", "72", 1.0),
    ("\\boxed{72} no wait \\boxed{3}", "72", 0.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\frac12}", "1/2", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}", 0.0),  # unbalanced
    ("\\boxed{72}", "72", 1.0),
    ("\\boxed{72}", "72.0", 1.0),
    ("\\boxed{72}", "$72$", 1.0),
    ("\\boxed{72}", "\\boxed{72}", 1.0),
    ("\\fbox{72}", "72", 1.0),
    ("\\boxed{73}", "72", 0.0),
    (f"\\boxed{{{BIG}}}", BIG, 1.0),
    ("\\boxed{10^{30}}", BIG, 1.0),
    (f"\\boxed{{{10**30 + 1}}}", BIG, 0.0),
    ("", "72", 0.0),
    ("<answer>72</answer>", "72", 0.0),  # wrong tag for the boxed reward
    ("The answer is \\boxed{72}. Hope this helps! {", "72", 1.0),  # text after the box
    ("\\boxed{\\text{(B)}}", "B", 1.0),
    ("\\boxed{x = 3}", "3", 1.0),
]


@pytest.mark.parametrize("completion,gt,expected", MATH_CASES, ids=[f"math{i}" for i in range(len(MATH_CASES))])
def test_math(completion, gt, expected):
    result = get_reward("math")(completion, gt)
    assert (result.score, result.acc) == (expected, expected)


def test_math_pred_and_extraction():
    assert get_reward("math")("nothing boxed", "1").pred == NO_ANSWER
    assert get_reward("math")("\\boxed{a{b}c} \\boxed{\\frac{1}{2}}", "0.5").pred == "\\frac{1}{2}"
    assert last_boxed("\\boxed{a{b}c}") == "a{b}c"
    assert last_boxed("\\boxed{a{b}c") is None


ANSWER_TAG_CASES = [
    ("<answer>1</answer> <answer>\\frac{1}{2}</answer>", "0.5", 1.0),
    ("<answer>\\boxed{72}</answer>", "72", 1.0),
    ("<answer>72</answer><answer>7</answer>", "72", 0.0),
    ("\\boxed{72}", "72", 0.0),
]


@pytest.mark.parametrize("completion,gt,expected", ANSWER_TAG_CASES,
                         ids=["last", "boxed-inside", "last-wrong", "no-tag"])
def test_math_answer_tag(completion, gt, expected):
    assert get_reward("math_answer_tag")(completion, gt).score == expected


GSM8K_CASES = [
    ("3 + 4 = 7\n#### 7", "7", 1.0),
    ("so\n#### 1,000", "1000", 1.0),
    ("#### $18.", "#### 18", 1.0),
    ("\\boxed{18}", "18", 1.0),
    ("#### 5 then \\boxed{18}", "18", 1.0),  # whichever comes last
    ("\\boxed{5} then\n#### 18", "18", 1.0),
    ("#### 17", "18", 0.0),
    ("18", "18", 0.0),
]


@pytest.mark.parametrize("completion,gt,expected", GSM8K_CASES, ids=[f"gsm8k{i}" for i in range(len(GSM8K_CASES))])
def test_gsm8k(completion, gt, expected):
    assert get_reward("gsm8k")(completion, gt).score == expected


def test_math_from_worker_thread():
    # math_verify's default timeouts use signal.alarm, which raises outside the main thread
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(get_reward("math"), "\\boxed{\\frac{2}{4}}", "0.5"),
                   pool.submit(get_reward("math"), "\\boxed{\\frac{1}{3}}", "0.5")]
        assert [f.result().score for f in futures] == [1.0, 0.0]


COUNTDOWN = {"numbers": "[30, 100, 93]"}  # target 23
COUNTDOWN_CASES = [  # (completion, expected score, expected acc)
    ("<reasoning>..</reasoning><answer> 100 - 93 + 30 - 0 </answer>", 0.1, 0.0),  # extra number 0
    ("<answer>100 - 93 + 30</answer>", 0.1, 0.0),  # wrong value (37)
    ("<answer>30 - (100 - 93)</answer>", 1.0, 1.0),
    ("<answer>7</answer> <answer>(30 - 100 + 93)</answer>", 1.0, 1.0),  # last span counts
    ("<answer>30 - (100 - 92)</answer>", 0.1, 0.0),  # wrong numbers
    ("<answer>30 - (100 - 93) + 93</answer>", 0.1, 0.0),  # a number used twice
    ("<answer>30 - 100 - 93 * 1</answer>", 0.1, 0.0),  # extra number 1
    ("<answer>(__import__('os') and 30 - (100 - 93))</answer>", 0.1, 0.0),  # 23 under a naive eval
    ("<answer>30 ** 100 - 93</answer>", 0.1, 0.0),
    ("<answer>30 / (100 - 100) + 93</answer>", 0.1, 0.0),  # numbers differ first
    ("30 - (100 - 93)", 0.0, 0.0),  # missing tag
    ("<answer></answer>", 0.1, 0.0),
]


@pytest.mark.parametrize("completion,score,acc", COUNTDOWN_CASES,
                         ids=[f"countdown{i}" for i in range(len(COUNTDOWN_CASES))])
def test_countdown(completion, score, acc):
    result = get_reward("countdown")(completion, "23", COUNTDOWN)
    assert (result.score, result.acc) == (score, acc)


def test_countdown_division_by_zero_and_list_numbers():
    numbers = {"numbers": [5, 5, 2]}
    assert get_reward("countdown")("<answer>2 / (5 - 5)</answer>", "1", numbers).score == 0.1
    assert get_reward("countdown")("<answer>(5 + 5) / 2</answer>", "5", numbers).score == 1.0
    assert get_reward("countdown")("<answer>2 ** 5 - 5</answer>", "27", numbers).score == 0.1  # 27 under eval


@pytest.mark.parametrize("expr,value", [("1+2*3", 7.0), ("-(4)/8", -0.5), ("2**3", None), ("(1", None),
                                        ("abs(1)", None), ("1/0", None), ("9" * 300, None)],
                         ids=["precedence", "unary", "pow", "syntax", "call", "div0", "too-long"])
def test_safe_arithmetic(expr, value):
    assert safe_arithmetic(expr) == value


SOLUTION, PUZZLE = "3142243142131324", "3102200002100320"  # 8 empty cells
SUDOKU_CASES = [
    (f"<answer>{SOLUTION}</answer>", 1.0),
    (f"<answer>{'3142' + '0' * 12}</answer>", 1 / 8),  # only cell 3 filled correctly
    (f"<answer>\n{SOLUTION[:4]}\n{SOLUTION[4:8]}\n{SOLUTION[8:12]}\n{SOLUTION[12:]}\n</answer>", 1.0),
    (f"<answer>x3|1-4 2{SOLUTION[4:]}!!</answer>", 1.0),  # non-digit noise dropped
    (f"<answer>{SOLUTION[:12]}</answer>", 6 / 8),  # padded with 0: empty cells 12 and 15 wrong
    (f"<answer>{SOLUTION}9999</answer>", 1.0),  # truncated to 16
    (SOLUTION, 0.0),  # missing tag
    (f"<answer>{SOLUTION}</answer><answer>{PUZZLE}</answer>", 0.0),  # last span counts
]


@pytest.mark.parametrize("completion,expected", SUDOKU_CASES,
                         ids=["full", "one", "grid", "noise", "short", "long", "no-tag", "last"])
def test_sudoku(completion, expected):
    result = get_reward("sudoku")(completion, SOLUTION, {"puzzle": PUZZLE})
    assert result.score == pytest.approx(expected, abs=1e-12)
    assert result.acc == float(expected == 1.0)


def test_sudoku_without_empty_cells():
    assert get_reward("sudoku")(f"<answer>{SOLUTION}</answer>", SOLUTION, {"puzzle": SOLUTION}).score == 1.0
    assert get_reward("sudoku")(f"<answer>{PUZZLE}</answer>", SOLUTION, {"puzzle": SOLUTION}).score == 0.0


FORMAT_CASES = [  # (completion, strict, soft, xml_count)
    ("<reasoning>\nstep 1\nstep 2\n</reasoning>\n<answer>\n7\n</answer>\n", 0.5, 0.5, 0.5),
    ("<reasoning>think</reasoning> <answer>7</answer>", 0.0, 0.5, 0.0),
    ("<reasoning>\nx\n</reasoning>\n<answer>\n7\n</answer>\nbye", 0.0, 0.5, 0.497),
    ("<answer>7</answer>", 0.0, 0.0, 0.0),
    ("", 0.0, 0.0, 0.0),
]


@pytest.mark.parametrize("completion,strict,soft,xml", FORMAT_CASES,
                         ids=["exact", "inline", "trailing", "answer-only", "empty"])
def test_format(completion, strict, soft, xml):
    assert get_reward("format_strict")(completion, "").score == strict
    assert get_reward("format_soft")(completion, "").score == soft
    assert get_reward("format_xml_count")(completion, "").score == pytest.approx(xml)


def test_registry_errors():
    with pytest.raises(ValueError, match="known rewards: .*countdown.*math"):
        get_reward("nope")
    with pytest.raises(ValueError, match="nope"):
        combine({"math": 1.0, "nope": 0.5})
    with pytest.raises(ValueError, match="already registered"):
        reward("math")(lambda c, g, e=None: RewardResult(0.0, 0.0))
    assert {"math", "math_answer_tag", "gsm8k", "countdown", "sudoku", "format_strict", "format_soft"} <= set(REWARDS)


def test_combine_weights():
    text = "<reasoning>\nhm\n</reasoning>\n<answer>\n30 - (100 - 93)\n</answer>"
    fn = combine([("countdown", 2.0), ("format_strict", 0.5), ("format_soft", 1.0)])
    assert fn(text, "23", COUNTDOWN) == RewardResult(2.0 * 1.0 + 0.5 * 0.5 + 0.5, 1.0, "30 - (100 - 93)")
    wrong = combine({"countdown": 2.0, "format_soft": 1.0})(text.replace("93)", "93) + 0"), "23", COUNTDOWN)
    assert (wrong.score, wrong.acc) == (pytest.approx(0.7), 0.0)


@pytest.mark.parametrize("source,task,name", [("sudoku", "math", "sudoku"), ("sudoku_4x4", "math", "sudoku"),
                                              ("countdown", "math", "countdown"), ("gsm8k", "math", "math"),
                                              ("math500", "math", "math"), ("aime2024", "math", "math"),
                                              ("humaneval", "code", "code"), ("mbpp", "code", "code")],
                         ids=lambda v: str(v))
def test_score_for_source(source, task, name):
    assert score_for_source(source, task) == name


def _rows(name):
    path = SHARED / "data" / "rl" / "test" / f"{name}_1.parquet"
    if not path.exists():
        pytest.skip(f"{path} not found")
    import pandas as pd

    return pd.read_parquet(path)


def test_real_countdown_rows():
    rows = _rows("countdown")
    for _, row in rows.head(50).iterrows():
        assert score_for_source(row.data_source, row.extra_info["task"]) == "countdown"
        numbers = json.loads(row.extra_info["numbers"])
        target = row.reward_model["ground_truth"]
        assert all(isinstance(n, int) for n in numbers) and float(target) == int(target)
        wrong = "<answer>" + " + ".join(map(str, numbers)) + "</answer>"
        expected = 1.0 if sum(numbers) == int(target) else 0.1
        assert get_reward("countdown")(wrong, target, dict(row.extra_info)).score == expected


def test_real_sudoku_rows():
    rows = _rows("sudoku")
    for _, row in rows.head(50).iterrows():
        gt, info = row.reward_model["ground_truth"], dict(row.extra_info)
        assert score_for_source(row.data_source, info["task"]) == "sudoku"
        assert len(gt) == 16 and len(info["puzzle"]) == 16
        assert get_reward("sudoku")(f"<reasoning>ok</reasoning><answer>{gt}</answer>", gt, info).score == 1.0
        assert get_reward("sudoku")(f"<answer>{info['puzzle']}</answer>", gt, info).score == 0.0


def test_reward_router_specs():
    from dare.rewards.routing import RewardRouter
    row = {"data_source": "gsm8k", "ground_truth": "4", "extra_info": {}}
    countdown = {"data_source": "countdown", "ground_truth": "5", "extra_info": {"numbers": "[2, 3]"}}
    auto = RewardRouter(["auto"])
    assert auto("so \\boxed{4}", row).score == 1.0  # auto: DARE's math reward for gsm8k
    assert auto("<answer>2+3</answer>", countdown).score == 1.0  # ... and the countdown rules for countdown
    mixed = RewardRouter(["gsm8k=math", "format_soft:0.5"])
    assert mixed.entries("gsm8k") == [("math", 1.0), ("format_soft", 0.5)]  # the source's own first: it is primary
    assert mixed.entries("other") == [("format_soft", 0.5)]
    result = mixed("\\boxed{4}", row)
    assert result.acc == 1.0 and result.score == 1.0 + 0.5 * get_reward("format_soft")("\\boxed{4}").score
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        RewardRouter(["gsm8k=nope"])
    with pytest.raises(ValueError, match="weight 'x' is not a number"):
        RewardRouter(["math:x"])
    with pytest.raises(ValueError, match=r"data source\(s\) \['countdown'\] have no reward"):
        RewardRouter(["gsm8k=math"]).check(["gsm8k", "countdown"])
    code = {"data_source": "mbpp", "ground_truth": json.dumps(["assert add(1, 2) == 3"]),
            "extra_info": {"task": "code"}}
    program = "```python\ndef add(a, b):\n    return a + b\n```"
    results = RewardRouter(["auto"]).score(["\\boxed{4}", program, "\\boxed{5}", "<answer>2+3</answer>"],
                                           [row, code, row, countdown], workers=4)  # the code row runs in a thread
    assert [r.score for r in results] == [1.0, 1.0, 0.0, 1.0]


def test_own_reward_by_import_path():
    """``--rewards my_module.my_function``: a function on the Python path, returning a RewardResult or a float
    (accuracy 1 when positive); a path that does not import is refused naming it."""
    from dare.rewards import RewardResult, get_reward
    from dare.rewards.routing import RewardRouter
    length = get_reward("dare_test_rewards.length")  # tests/dare_test_rewards.py
    assert length("abc", "x") == RewardResult(0.5, 1.0) and length("abcdefg", "x") == RewardResult(0.0, 0.0)
    row = {"data_source": "addition", "ground_truth": "5", "extra_info": {}}
    assert [r.score for r in RewardRouter(["dare_test_rewards.length:2"]).score(["abc", "ab"], [row, row])] == \
        [1.0, pytest.approx(2 / 3)]
    with pytest.raises(ValueError, match=r"reward 'no_such_module.fn': cannot import it \(No module named"):
        get_reward("no_such_module.fn")


def test_gsm8k_reads_the_number_a_box_states():
    from dare.rewards.math import read_number
    cases = {"\\$1,234.50": "1234.50", "800 ml": "800", "x = -5": "-5", "5 \\times 3 = 15": "15",
             "\\text{18 apples}": "18", "43,500": "43500", "18.": "18"}
    assert {k: read_number(k) for k in cases} == cases
    for unclear in ("3 or 4", "\\frac{3}{4}", "\\sqrt{16}", "1,2"):  # not one number with units: judged whole
        assert read_number(unclear) == unclear
    gsm8k = get_reward("gsm8k")
    assert gsm8k("\\boxed{18 or 20}", "#### 18").acc == 0.0  # two answers are not an answer
    assert gsm8k("\\boxed{-5}", "#### -5").acc == 1.0 and gsm8k("\\boxed{5}", "#### -5").acc == 0.0
    assert gsm8k("<answer>18</answer>", "#### 18").acc == 0.0  # the boxed protocol wants the box
    assert get_reward("gsm8k_or_tag")("<answer>\n18 eggs\n</answer>", "#### 18").acc == 1.0
    assert get_reward("gsm8k_or_tag")("\\boxed{}<answer>\\boxed{} 18</answer>", "#### 18").acc == 1.0


def test_countdown_reads_boxed_and_latex_expressions_and_nothing_more():
    countdown, extra = get_reward("countdown"), {"numbers": [49, 55, 53]}
    assert countdown("<answer>\\boxed{49 + 55 - 53}</answer>", "51", extra).acc == 1.0
    assert countdown("\\boxed{55 - 53 + 49}", "51", extra).acc == 1.0  # a box without the tags
    assert countdown("<answer>\\boxed{49 + 55 - 53 = 51}</answer>", "51", extra).acc == 1.0  # "= target" dropped
    assert countdown("<answer>49 + 55 - 53 = 52</answer>", "51", extra).acc == 0.0  # another stated value fails
    assert countdown("<answer>\\boxed{(55 \\times 53) \\div 49}</answer>", "51", extra).pred == "(55 * 53) / 49"
    assert countdown("<answer>\\frac{55}{53} \\cdot 49</answer>", "51", extra).pred == "(55)/(53) * 49"
    assert countdown("<answer>\\boxed{55 - 53}</answer>", "51", extra).score == 0.1  # 49 unused
    assert countdown("<answer>\\boxed{49 ** 55 - 53}</answer>", "51", extra).acc == 0.0  # no powers
