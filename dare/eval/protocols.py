"""Evaluation protocols: a paper's way of prompting, reading answers, decoding and counting, so that a number from
DARE means what that paper's number means (``evaluate.py --protocol NAME``; ``python -m dare.eval.protocols`` lists
them with the source of every value).

* ``dare`` — DARE's convention: the row's own prompt through the chat template (bare GSM8K/MATH/AIME questions get
  the boxed instruction), scored by the RL rewards (``auto``); accuracy = samples correct.
* ``d1`` — d1's zero-shot scripts (github.com/dllm-reasoning/d1, ``eval/``; used by d1, wd1, SPG, AGRPO, d-TreeRPO,
  JustGRPO): its system prompt per task written before the question in one user turn, the chat template, the
  assistant turn opened with ``<reasoning>``, 256 tokens in blocks of 32 with steps = gen_length / 2, greedy,
  low-confidence remasking; Countdown on its 256 puzzles and Sudoku on 256 of the 500 (numpy seed 42, as d1 draws
  them); Sudoku's metric is d1's: empty cells filled correctly over all puzzles. Answers are read as d1's parser
  means to (box, else ``<answer>`` span) by DARE's rewards, which also read what d1's misses (thousands separators,
  negative answers, equivalent forms: ``docs/evaluation.md`` "Reproducing published numbers").

d1 pads a batch of 8 prompts (4 at 512 tokens) on the left and decodes without an attention mask (the pads are
attended); DARE masks them, so a prompt that d1 padded may decode differently.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from ..sampling import SamplingConfig

D1 = "github.com/dllm-reasoning/d1 @ 837888f, eval/"

# The system prompts exactly as d1's eval scripts write them (eval/gsm8k.py, math500.py, countdown.py, sudoku.py),
# trailing space and stray quote included: they are part of the prompt the published numbers were measured with.
D1_FORMAT = ("Respond in the following format:\n<reasoning>\nYour reasoning here\n</reasoning>\n<answer>\n"
             "\\boxed{...}\n</answer>")
D1_MATH = ("You are a math expert. You will be given a question to solve. Solve it step by step. Wrap the final answer "
           "in a")
D1_GSM8K = D1_MATH + " \\boxed{}. \n" + D1_FORMAT
D1_MATH500 = D1_MATH + " \\boxed{}.\n" + D1_FORMAT + '" \n'
D1_COUNTDOWN = ("Using only the provided numbers, create an arithmetic expression that evaluates to exactly the "
                "provided target number. You may use the operations +, -, *, and / as needed, but each number must be "
                "used exactly once. Think step-by-step. After reasoning, provide only your final expression inside "
                "\\boxed{} tags without including an equals sign or the target number. For example: \\boxed{a + b * c}"
                + D1_FORMAT)
D1_SUDOKU = """
Please solve the following 4x4 Sudoku puzzle. The puzzle is provided as a 16-character string reading left-to-right, \
top-to-bottom, where '0' represents empty cells.

Rules:
- Fill empty cells with digits 1-4
- Each row must contain digits 1-4 exactly once
- Each column must contain digits 1-4 exactly once
- Each 2x2 box must contain digits 1-4 exactly once

Important: Your solution must be a COMPLETE 16-character string with only the digits 1-4, representing your final \
solved grid.

Respond in this exact format:
<reasoning>
Your step-by-step solving process
</reasoning>
<answer>
[16-character solution string with no spaces or separators]
</answer>
"""


def user_text(row: dict) -> str:
    return [m for m in row["prompt"] if m["role"] == "user"][-1]["content"]


def countdown_question(row: dict) -> str:
    numbers = row["extra_info"]["numbers"]
    numbers = [int(n) for n in (numbers.strip("[]").split(",") if isinstance(numbers, str) else numbers)]
    return f"Numbers: {numbers}\nTarget: {int(float(row['ground_truth']))}"


def sudoku_question(row: dict) -> str:
    return f"Solve the following Sudoku puzzle: {row['extra_info']['puzzle']}\n"


@dataclass(frozen=True)
class Task:
    """One benchmark under one protocol: how its prompt is written, which reward reads the answers, what is counted."""

    reward: str = "auto"  # a registered reward (dare.rewards), or auto: the row's default
    system: str | None = None  # written before the question in the user turn (d1), with a blank line between
    question: Callable[[dict], str] | None = None  # the question as the protocol words it (None: the row's prompt)
    prefill: str = ""  # the assistant turn starts with this text (d1: "<reasoning>")
    subsample: int | None = None  # evaluate this many rows, drawn as numpy.random.RandomState(seed).choice
    seed: int = 42
    metric: str = "accuracy"  # accuracy (share of samples correct) | cells (sudoku: empty cells right, pooled)
    source: str = ""

    def weight(self, row: dict) -> float:
        """How much a sample counts in the metric (cells: the puzzle's empty cells)."""
        return float(row["extra_info"]["puzzle"].count("0")) if self.metric == "cells" else 1.0


@dataclass(frozen=True)
class Protocol:
    name: str
    about: str
    tasks: dict[str, Task] = field(default_factory=dict)  # empty: every benchmark, each with Task()
    decoding: dict = field(default_factory=dict)  # SamplingConfig values it fixes (a knob left at its default)
    steps_per_token: float | None = None  # steps = gen_length * this, unless --steps is given
    instructs: bool = True  # bare questions get the boxed instruction (the dare convention)
    source: str = ""

    def task(self, bench: str) -> Task:
        if not self.tasks:
            return Task()
        if bench not in self.tasks:
            raise ValueError(f"protocol {self.name} covers {', '.join(self.tasks)}, not {bench!r}")
        return self.tasks[bench]

    def sampling(self, config: SamplingConfig) -> SamplingConfig:
        """``config`` with this protocol's decoding settings where the user left a knob at its default."""
        default = SamplingConfig()
        changes = {k: v for k, v in self.decoding.items() if getattr(config, k) == getattr(default, k)}
        config = replace(config, **changes)
        if self.steps_per_token and config.steps is None:
            config = replace(config, steps=max(1, int(config.gen_length * self.steps_per_token)))
        return config

    def rows(self, bench: str, rows: list[dict], tokenizer) -> list[dict]:
        """The benchmark's rows with their prompts written this protocol's way (a chat, or the rendered text when
        the assistant turn is prefilled), subsampled as it draws them."""
        task = self.task(bench)
        if task.subsample is not None:  # d1 draws even when it keeps every row (countdown: 256 of 256, reordered)
            draw = np.random.RandomState(task.seed).choice(len(rows), min(task.subsample, len(rows)), replace=False)
            rows = [rows[i] for i in draw]
        if task.question is None and task.system is None and not task.prefill:
            return rows
        out = []
        for row in rows:
            question = task.question(row) if task.question else user_text(row)
            chat = [{"role": "user", "content": (task.system + "\n\n" if task.system else "") + question}]
            prompt = chat
            if task.prefill:
                prompt = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) + task.prefill
            out.append({**row, "prompt": prompt})
        return out

    def describe(self) -> str:
        lines = [f"{self.name}: {self.about}" + (f"  [{self.source}]" if self.source else "")]
        if self.decoding or self.steps_per_token:
            knobs = ", ".join(f"{k}={v}" for k, v in self.decoding.items())
            steps = f", steps=gen_length*{self.steps_per_token:g}" if self.steps_per_token else ""
            lines.append(f"  decoding: {knobs}{steps}")
        for bench, task in self.tasks.items():
            sub = f", {task.subsample} rows (numpy seed {task.seed})" if task.subsample else ""
            lines.append(f"  {bench}: reward {task.reward}, metric {task.metric}{sub}  [{task.source}]")
        return "\n".join(lines)


PROTOCOLS = {
    "dare": Protocol("dare", "the row's prompt, chat template, boxed instruction for bare questions, DARE's rewards",
                     source="dare/eval/benchmarks.py, dare/rewards"),
    "d1": Protocol(
        "d1", "d1's zero-shot evaluation of LLaDA: system prompt in the user turn, <reasoning> prefill",
        tasks={
            "gsm8k": Task("gsm8k_or_tag", D1_GSM8K, user_text, "<reasoning>", source=D1 + "gsm8k.py"),
            "math500": Task("math_or_tag", D1_MATH500, user_text, "<reasoning>", source=D1 + "math500.py"),
            "countdown": Task("countdown", D1_COUNTDOWN, countdown_question, "<reasoning>", subsample=256,
                              source=D1 + "countdown.py"),
            "sudoku": Task("sudoku", D1_SUDOKU, sudoku_question, "<reasoning>", subsample=256, metric="cells",
                           source=D1 + "sudoku.py, parse_and_get_acc.py"),
        },
        # eval.py: --gen_length 256 in run_eval.sh's headline runs, --block_length 32, diffusion_steps = gen_length
        # // 2; generate.py: temperature 0, cfg 0, remasking low_confidence
        decoding={"gen_length": 256, "block_length": 32, "temperature": 0.0, "remasking": "low_confidence",
                  "cfg_scale": 0.0},
        steps_per_token=0.5, instructs=False, source=D1 + "eval.py, generate.py, run_eval.sh"),
}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}; known: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


if __name__ == "__main__":
    print("\n\n".join(p.describe() for p in PROTOCOLS.values()))
