"""Generated tasks: real-data schema, determinism, disjoint splits, and reference solutions that are correct."""

import ast
import itertools
import json
import re

import pytest
from conftest import SHARED

from dare.data import load_rows
from dare.data.tasks import TASKS, make_task, split_of, write_task


def evaluate(expression: str) -> float:
    return eval(compile(ast.parse(expression, mode="eval"), "<expr>", "eval"), {"__builtins__": {}})


@pytest.mark.parametrize("name", sorted(TASKS))
def test_deterministic_and_splits_disjoint_by_question(name):
    assert make_task(name, 20, seed=3) == make_task(name, 20, seed=3)
    n = 50 if name == "addition" else 4000  # single-digit sums: 100 questions in all
    # a question is its text, and for a visual task its picture too (described by its scene)
    questions = {split: {r["prompt"][-1]["content"] + r["extra_info"].get("scene", "") for seed in (0, 1)
                         for r in make_task(name, n, seed, split)} for split in ("train", "test")}
    assert len(questions["train"] & questions["test"]) == 0  # no held-out question is ever trained on
    assert all(split_of(q) == split for split, qs in questions.items() for q in qs)
    assert {r["extra_info"]["split"] for r in make_task(name, 5, 0, "test")} == {"test"}


def test_sum4_has_thousands_of_held_out_questions():
    test = {r["prompt"][-1]["content"] for r in make_task("sum4", 800, 0, "test")}
    train = {r["prompt"][-1]["content"] for r in make_task("sum4", 4000, 0, "train")}
    assert len(test) > 500 and len(train) > 3000 and not test & train
    for row in make_task("sum4", 50):
        terms = re.findall(r"\d", row["prompt"][0]["content"].split("?")[0])
        assert sum(map(int, terms)) == int(row["reward_model"]["ground_truth"]) and len(terms) == 4


def test_countdown_solutions_reach_the_target_with_each_number_once():
    for row in make_task("countdown", 200, seed=1):
        numbers = json.loads(row["extra_info"]["numbers"])
        answer = re.findall(r"<answer>\s*(.*?)\s*</answer>", row["extra_info"]["solution"], re.S)[-1]
        assert sorted(int(n) for n in re.findall(r"\d+", answer)) == sorted(numbers)
        assert evaluate(answer) == int(row["reward_model"]["ground_truth"])


def test_sudoku_solutions_are_valid_and_match_the_puzzle():
    for row in make_task("sudoku", 200, seed=2):
        grid, puzzle = row["reward_model"]["ground_truth"], row["extra_info"]["puzzle"]
        cells = [[int(grid[4 * r + c]) for c in range(4)] for r in range(4)]
        groups = cells + [list(col) for col in zip(*cells, strict=True)] + [
            [cells[r][c] for r in (br, br + 1) for c in (bc, bc + 1)] for br in (0, 2) for bc in (0, 2)]
        assert all(sorted(g) == [1, 2, 3, 4] for g in groups)
        assert all(p in ("0", s) for p, s in zip(puzzle, grid, strict=True)) and puzzle.count("0") == 6


def test_arithmetic_answers():
    for row in make_task("arithmetic", 100):
        a, op, b = re.search(r"What is (\d+) ([+-]) (\d+)\?", row["prompt"][0]["content"]).groups()
        assert int(row["reward_model"]["ground_truth"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
        assert f"\\boxed{{{row['reward_model']['ground_truth']}}}" in row["extra_info"]["solution"]


def test_written_files_have_the_real_schema(tmp_path):
    path = write_task("countdown", str(tmp_path / "cd.parquet"), 10)
    rows = load_rows(path)
    assert len(rows) == 10 and rows[0]["prompt"][0]["role"] == "user"
    jsonl = load_rows(write_task("sudoku", str(tmp_path / "s.jsonl"), 5))
    assert jsonl[0]["reward_model"]["style"] == "rule"
    real = SHARED / "data" / "rl" / "test" / "countdown_1.parquet"
    if real.exists():
        assert set(load_rows(str(real)).column_names) == set(rows.column_names)
    with pytest.raises(ValueError, match="Unknown task 'chess'"):
        make_task("chess", 1)
    with pytest.raises(ValueError, match="Unknown split 'validation' of task 'sum4': train or test"):
        make_task("sum4", 1, split="validation")


@pytest.mark.parametrize("name,reward_name", [("arithmetic", "math"), ("countdown", "countdown"),
                                              ("sudoku", "sudoku")])
def test_reference_solutions_earn_full_reward(name, reward_name):
    from dare.rewards import get_reward, score_for_source
    rows = make_task(name, 30, seed=4)
    assert score_for_source(rows[0]["data_source"]) == reward_name
    fn = get_reward(reward_name)
    for row in rows:
        result = fn(row["extra_info"]["solution"], row["reward_model"]["ground_truth"], row["extra_info"])
        assert (result.score, result.acc) == (1.0, 1.0), (row["extra_info"]["solution"], result)
    wrong = fn("<answer>\n1\n</answer> \\boxed{-999}", rows[0]["reward_model"]["ground_truth"], rows[0]["extra_info"])
    assert wrong.score < 1.0


def test_cycle_answers_follow_the_word_cycle():
    from dare.data.tasks import WORDS
    for row in make_task("cycle", 100):
        first, n = re.search(r"cycle from (\w+) for (\d+) words", row["prompt"][0]["content"]).groups()
        words = row["extra_info"]["solution"].split(". The answer")[0].split()
        assert words[0] == first and len(words) == int(n) and 60 <= len(words) <= 100
        assert all(WORDS[(WORDS.index(a) + 1) % len(WORDS)] == b for a, b in itertools.pairwise(words))
        assert row["reward_model"]["ground_truth"] == words[-1] and row["extra_info"]["solution"].endswith(
            f"\\boxed{{{words[-1]}}}.")


def test_task_paths_load_as_rows_with_disjoint_splits():
    train, test = load_rows("task:cycle"), load_rows("task:cycle", "test")
    assert (len(train), len(test)) == (10_000, 500)
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in test}
    with pytest.raises(ValueError, match="split must be one of"):
        load_rows("task:cycle", "validation")
    with pytest.raises(ValueError, match="Unknown task 'nope'"):
        load_rows("task:nope")
