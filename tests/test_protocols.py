"""Evaluation protocols: d1's prompts character for character (rendered once by d1's own dataset classes, stored in
tests/data/d1_prompts.json), answers read from real LLaDA-8B-Instruct completions (tests/data/d1_completions.jsonl,
each verdict checked by hand), d1's decoding settings and metric, and an end-to-end ``--protocol d1`` run."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import SHARED

from dare.data.public import PUBLIC
from dare.eval.harness import load_rows, metric_value, summarize
from dare.eval.protocols import PROTOCOLS, get_protocol
from dare.models.tokenizers import tiny_tokenizer
from dare.rewards import get_reward
from dare.sampling import SamplingConfig

DATA = Path(__file__).parent / "data"
TEST_DATA = SHARED / "data" / "rl" / "test"
D1_PROMPTS = json.loads((DATA / "d1_prompts.json").read_text())
D1_BENCHES = ("gsm8k", "math500", "countdown", "sudoku")
d1 = PROTOCOLS["d1"]


def llada_tokenizers():
    """The tiny LLaDA tokenizer (its compact copy of the chat template) and, with ../shared, the official template."""
    yield "tiny", tiny_tokenizer("llada")
    official = SHARED / "models" / "LLaDA-8B-Instruct" / "tokenizer_config.json"
    if official.exists():
        tok = tiny_tokenizer("llada")
        tok.chat_template = json.loads(official.read_text())["chat_template"]
        yield "official", tok


@pytest.mark.parametrize("bench", D1_BENCHES)
def test_d1_prompts_of_our_data_files_equal_d1s_character_for_character(bench):
    if not TEST_DATA.is_dir():
        pytest.skip(f"needs the reference's test files in {TEST_DATA}")
    for name, tok in llada_tokenizers():
        rows = load_rows(d1, bench, tok, str(TEST_DATA), limit=20)
        ours = [r["prompt"] for r in rows]
        theirs = [item["prompt"] for item in D1_PROMPTS[bench]]
        assert len(ours) == 20
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert a == b, f"{bench} #{i} ({name} template)"


def test_d1_prompts_from_hub_style_rows():
    """Without ../shared: rows as the hub converters (gsm8k, math500) and the row schema (countdown, sudoku) give
    them render d1's prompts too."""
    tok = tiny_tokenizer("llada")
    for bench in D1_BENCHES:
        rows = []
        for item in D1_PROMPTS[bench]:
            q = item["question"]
            if bench == "gsm8k":
                row = PUBLIC["openai/gsm8k:main"].convert({"question": q, "answer": "#### 1"})
            elif bench == "math500":
                row = PUBLIC["HuggingFaceH4/MATH-500"].convert({"problem": q, "answer": "1"})
            elif bench == "countdown":
                numbers, target = q.split("\n")
                row = {"prompt": [], "ground_truth": target.split(": ")[1], "data_source": "countdown",
                       "extra_info": {"numbers": numbers.split(": ")[1]}}
            else:
                row = {"prompt": [], "ground_truth": "", "data_source": "sudoku",
                       "extra_info": {"puzzle": q.split(": ")[1].strip()}}
            rows.append(row)
        task = replace(d1.task(bench), subsample=None)  # the fixture is already in d1's order
        protocol = replace(d1, tasks={bench: task})
        assert [r["prompt"] for r in protocol.rows(bench, rows, tok)] == [i["prompt"] for i in D1_PROMPTS[bench]]


def completions():
    lines = (DATA / "d1_completions.jsonl").read_text().splitlines()[1:]
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize("case", completions(), ids=lambda c: f"{c['task']}: {c['why'][:50]}")
def test_d1_rewards_read_real_completions(case):
    result = get_reward(d1.task(case["task"]).reward)(case["completion"], case["ground_truth"], case["extra_info"])
    if "cells" in case:
        assert result.score == pytest.approx(case["cells"])
    else:
        assert result.acc == case["acc"], (case["why"], result.pred)


def test_the_completions_include_cases_where_d1s_parser_is_wrong():
    """The fixture is not a copy of d1's verdicts: it holds cases where d1's parser errs, in both directions."""
    cases = [c for c in completions() if "acc" in c]
    assert sum(c["acc"] == 1 and not c["d1_parser"] for c in cases) >= 5  # thousands, bare answers, negatives, forms
    assert all(c["acc"] == c["d1_parser"] for c in cases if c["task"] == "countdown" and c["acc"] == 0)


def test_d1_decoding_settings_and_their_overrides():
    config = d1.sampling(SamplingConfig())
    assert (config.gen_length, config.block_length, config.steps, config.temperature, config.remasking) == \
        (256, 32, 128, 0.0, "low_confidence")
    assert d1.sampling(SamplingConfig(gen_length=512)).steps == 256  # d1: steps = gen_length // 2
    assert d1.sampling(SamplingConfig(gen_length=512, steps=64)).steps == 64  # an explicit knob wins
    assert PROTOCOLS["dare"].sampling(SamplingConfig()) == SamplingConfig()
    for protocol in PROTOCOLS.values():
        assert set(protocol.decoding) <= set(vars(SamplingConfig()))
        assert all(task.source for task in protocol.tasks.values())  # every value names where it comes from


def test_d1_covers_its_four_tasks_only():
    with pytest.raises(ValueError, match="covers gsm8k, math500, countdown, sudoku"):
        d1.task("humaneval")
    with pytest.raises(ValueError, match="unknown protocol"):
        get_protocol("lm-eval")


def test_sudoku_cells_pool_the_empty_cells_as_d1_counts():
    speed = {"tokens": 1, "seconds": 1.0, "forwards": 1}
    records = [{"correct": 0.0, "score": 0.5, "weight": 2.0, "index": 0, **speed},  # 1 of 2 empty cells
               {"correct": 1.0, "score": 1.0, "weight": 8.0, "index": 1, **speed}]  # 8 of 8
    assert metric_value(records, "cells") == pytest.approx(9 / 10)  # pooled, not the mean of 0.5 and 1.0
    assert metric_value(records, "accuracy") == 0.5
    summary = summarize(records, metric="cells")
    assert (summary["metric"], summary["value"]) == ("cells", pytest.approx(0.9))


def test_d1_subsample_is_d1s_draw():
    if not TEST_DATA.is_dir():
        pytest.skip(f"needs the reference's test files in {TEST_DATA}")
    rows = load_rows(d1, "sudoku", tiny_tokenizer("llada"), str(TEST_DATA))
    assert len(rows) == 256
    assert [r["extra_info"]["puzzle"] for r in rows[:20]] == \
        [i["question"].split(": ")[1].strip() for i in D1_PROMPTS["sudoku"]]


def test_evaluate_runs_the_d1_protocol_end_to_end(tmp_path):
    if not TEST_DATA.is_dir():
        pytest.skip(f"needs the reference's test files in {TEST_DATA}")
    out = tmp_path / "eval"
    cmd = [sys.executable, "evaluate.py", "--model", "tiny:llada", "--protocol", "d1", "--bench", "countdown,sudoku",
           "--data-dir", str(TEST_DATA), "--limit", "2", "--gen-length", "32", "--batch-size", "2", "--output-dir",
           str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["meta"]["protocol"] == "d1" and report["meta"]["sampling"]["steps"] == 16
    assert report["benchmarks"]["sudoku"]["metric"] == "cells"
    assert report["benchmarks"]["countdown"]["examples_per_s"] > 0
    records = [json.loads(line) for line in (out / "samples.0.jsonl").read_text().splitlines()]
    first = next(r for r in records if r["bench"] == "sudoku" and r["index"] == 0)
    assert first["prompt"] == D1_PROMPTS["sudoku"][0]["prompt"]
    again = subprocess.run(cmd[:5] + ["dare"] + cmd[6:], capture_output=True, text=True,
                           cwd=Path(__file__).parents[1], timeout=600)
    assert again.returncode != 0 and "protocol" in again.stderr  # samples of another protocol are not reused


def test_d1_generations_bench_scores_files_in_d1s_format(tmp_path):
    """bench/d1_generations.py on files written in d1's published format from the real completions above."""
    cases = completions()
    for task, name in (("countdown", "countdown"), ("sudoku", "sudoku"), ("gsm8k", "gsm8k")):
        items = []
        for c in (c for c in cases if c["task"] == task):
            truth = c["ground_truth"]
            if task == "countdown":
                truth = [c["extra_info"]["numbers"], int(truth)]
            elif task == "gsm8k":
                truth = None if truth.startswith("-") else float(truth.replace(",", ""))  # as d1 stores it
            question = f"Solve the following Sudoku puzzle: {c['extra_info']['puzzle']}\n" if task == "sudoku" else ""
            items.append({"question": question, "generations": c["completion"] + "<|eot_id|><|endoftext|>",
                          "ground_truth": truth})
        (tmp_path / f"{name}_instruct_256_128_0_generations.json").write_text(json.dumps({"generations": items}))
    proc = subprocess.run([sys.executable, "bench/d1_generations.py", str(tmp_path)], capture_output=True, text=True,
                          cwd=Path(__file__).parents[1], timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in proc.stdout.splitlines()[2:]}
    countdown = [c for c in cases if c["task"] == "countdown"]
    right = 100 * sum(c["acc"] for c in countdown) / len(countdown)
    assert float(rows["countdown"][5]) == pytest.approx(right, abs=0.01)
    assert rows["sudoku"][3] == "cells" and rows["gsm8k"][7].strip(" |") == "1"  # the negative answer d1 cannot read
