"""Prompts and scoring agree for every benchmark and data source: the prompt asks for the format its reward scores
(reference parquet, hub rows and generated tasks alike), and known answers written in that format score 100 %
while shuffled ones score about chance."""

import random

import pandas as pd
import pytest
from conftest import SHARED

from dare.data import RLDataConfig, prompt_rows
from dare.data.public import PUBLIC
from dare.eval.benchmarks import BENCHMARKS, load_benchmark
from dare.rewards import BOXED_INSTRUCTION, score_for_source
from dare.rewards.routing import RewardRouter

TEST_DATA = SHARED / "data" / "rl" / "test"
router = RewardRouter(["auto"])


def reference_parquet(tmp_path):
    """Two rows in the reference schema with bare questions (as the real GSM8K/MATH files have)."""
    rows = [{"data_source": source, "prompt": [{"role": "user", "content": question}],
             "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"task": "math", "index": i}}
            for i, (source, question, truth) in enumerate([("gsm8k", "Tom has 3 apples and buys 4. How many?", "7"),
                                                            ("math", "What is $\\frac{1}{2} + \\frac{1}{4}$?",
                                                             "\\frac{3}{4}")])]
    path = tmp_path / "bare.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def asks_for_its_format(row) -> bool:
    text = [m for m in row["prompt"] if m["role"] == "user"][-1]["content"]  # MBPP ends on an assistant prefix
    name = score_for_source(row["data_source"], row["extra_info"].get("task"))
    return {"math": "\\boxed{}" in text, "countdown": "<answer>" in text, "sudoku": "<answer>" in text,
            "code": True}[name]


def test_bare_questions_get_the_instruction_their_reward_needs(tmp_path):
    path = reference_parquet(tmp_path)
    rows = prompt_rows(path, "train", RLDataConfig())
    assert all(r["prompt"][-1]["content"].endswith(BOXED_INSTRUCTION) for r in rows)
    bare = prompt_rows(path, "train", RLDataConfig(answer_instruction="none"))  # the reference's convention
    assert [r["prompt"][-1]["content"] for r in bare] == ["Tom has 3 apples and buys 4. How many?",
                                                          "What is $\\frac{1}{2} + \\frac{1}{4}$?"]
    custom = prompt_rows(path, "train", RLDataConfig(answer_instruction="Answer with a number."))
    assert all(r["prompt"][-1]["content"].endswith("\nAnswer with a number.") for r in custom)
    hub = [PUBLIC["openai/gsm8k:main"].convert({"question": "Q?", "answer": "work\n#### 1,234"}),
           PUBLIC["HuggingFaceH4/MATH-500"].convert({"problem": "P?", "answer": "2"})]
    from dare.data.rl import instruct
    assert [instruct(r)["prompt"][-1]["content"] for r in hub] == ["Q?" + BOXED_INSTRUCTION, "P?" + BOXED_INSTRUCTION]
    assert instruct(instruct(hub[0])) == instruct(hub[0])  # asked once, never twice
    for name in ("task:addition", "task:countdown", "task:sudoku"):
        assert all(asks_for_its_format(r) for r in load_benchmark(name, limit=5)), name


# the reference's benchmarks (the picture ones read copies of the hub's own files: tests/test_images.py)
REFERENCE = sorted(b for b in BENCHMARKS if not PUBLIC[BENCHMARKS[b].dataset].raw_local)


@pytest.mark.parametrize("bench", REFERENCE)
def test_every_reference_benchmark_asks_for_what_it_scores(bench):
    if not TEST_DATA.is_dir():
        pytest.skip(f"{TEST_DATA} not found (../shared is absent)")
    rows = load_benchmark(bench, data_dir=str(TEST_DATA))
    assert rows and all(asks_for_its_format(r) for r in rows)


@pytest.mark.parametrize("bench", ["gsm8k", "math500"])
def test_known_answers_score_100_percent_and_shuffled_about_chance(bench):
    if not TEST_DATA.is_dir():
        pytest.skip(f"{TEST_DATA} not found (../shared is absent)")
    rows = load_benchmark(bench, data_dir=str(TEST_DATA))
    right = router.score([f"Step by step... so the answer is \\boxed{{{r['ground_truth']}}}." for r in rows], rows)
    perm = list(range(len(rows)))
    random.Random(0).shuffle(perm)
    wrong = router.score([f"\\boxed{{{rows[j]['ground_truth']}}}" for j in perm], rows)
    chance = sum(rows[i]["ground_truth"] == rows[j]["ground_truth"] for i, j in enumerate(perm)) / len(rows)
    accuracy, shuffled = (sum(r.score for r in results) / len(rows) for results in (right, wrong))
    print(f"{bench}: known answers {accuracy:.3f}, shuffled {shuffled:.3f} (identical answers by chance {chance:.3f})")
    assert accuracy == 1.0
    assert chance <= shuffled <= chance + 0.02
