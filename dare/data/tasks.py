"""Procedurally generated tasks with verifiable answers, in the row schema of the real RL data (``data_source``,
chat ``prompt``, ``reward_model.ground_truth``, ``extra_info``), plus a reference ``extra_info.solution`` text an
SFT stage can learn from. Seeded and deterministic. The splits are disjoint *by question*: a question belongs to
the test split when a hash of its text falls in the test tenth (``split_of``), so no test question is ever trained on,
however many rows are drawn. A visual task's rows hold their pictures (``images``, ``dare.data.images``) and split by
the question and the picture's scene.

    rows = make_task("countdown", n=1000, seed=0, split="train")
    write_task("sudoku", "data/sudoku_test.parquet", n=200, seed=1, split="test")
"""

import hashlib
import json
import os
import random
from pathlib import Path

FORMAT = ("Respond in the following format:\n<reasoning>\n...\n</reasoning>\n<answer>\n...\n</answer>\n\n")


def _row(source, index, split, question, truth, solution, **extra):
    return {"data_source": source, "prompt": [{"role": "user", "content": question}],
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": index, "task": "math", "solution": solution, **extra}}


def arithmetic(rng: random.Random, index: int, split: str) -> dict:
    """Two-term sums and differences of numbers in [0, 20]; the answer goes in \\boxed{}."""
    a, b, op = rng.randint(0, 20), rng.randint(0, 20), rng.choice("+-")
    value = a + b if op == "+" else a - b
    return _row("arithmetic", index, split, f"What is {a} {op} {b}? Put the final answer in \\boxed{{}}.",
                str(value), f"{a} {op} {b} = {value}. The answer is \\boxed{{{value}}}.")


def addition(rng: random.Random, index: int, split: str) -> dict:
    """Single-digit sums answered directly (no worked line): short completions, learnable by the tiny models of
    the tests and the quickstart."""
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    return _row("addition", index, split, f"What is {a} + {b}? Put the final answer in \\boxed{{}}.",
                str(a + b), f"The answer is \\boxed{{{a + b}}}.")


def sum4(rng: random.Random, index: int, split: str) -> dict:
    """Four single digits summed (10,000 distinct questions, about 1,000 held out), answered directly: a held-out
    question is a sum the model never saw, so it must add, not recall. The tiny test models reach about a fifth of
    them by SFT, which leaves RL room to show a gain."""
    terms = [rng.randint(0, 9) for _ in range(4)]
    return _row("sum4", index, split, f"What is {' + '.join(map(str, terms))}? Put the final answer in \\boxed{{}}.",
                str(sum(terms)), f"The answer is \\boxed{{{sum(terms)}}}.")


def countdown(rng: random.Random, index: int, split: str, size: int = 3) -> dict:
    """Numbers and a target reachable with + - * using each number once (the generating expression is the
    reference solution); the prompt is the real countdown prompt."""
    numbers = [rng.randint(1, 20) for _ in range(size)]
    order = rng.sample(numbers, size)
    expression, value = str(order[0]), order[0]
    for n in order[1:]:
        op = rng.choice("+-*" if value * n <= 400 else "+-")
        expression = f"({expression}){op}{n}" if op == "*" and not expression.isdigit() else f"{expression}{op}{n}"
        value = value + n if op == "+" else value - n if op == "-" else value * n
    question = (FORMAT + f"Using only the numbers {numbers}, create an arithmetic expression that evaluates to "
                f"exactly {value}. You must use all numbers from the list, and each number must be used exactly "
                "once. You may use the operations +, -, *, and / as needed. After reasoning, provide only your "
                "final expression inside <answer></answer> tags without including an equals sign or the target "
                "number.")
    return _row("countdown", index, split, question, str(value),
                f"<reasoning>\n{expression} = {value}\n</reasoning>\n<answer>\n{expression}\n</answer>",
                numbers=json.dumps(numbers))


def sudoku(rng: random.Random, index: int, split: str, empty: int = 6) -> dict:
    """A random valid 4x4 grid (relabelled, row/column-permuted base pattern) with ``empty`` cells blanked."""
    base = [[0, 1, 2, 3], [2, 3, 0, 1], [1, 0, 3, 2], [3, 2, 1, 0]]
    digits = rng.sample("1234", 4)
    bands = rng.sample([[0, 1], [2, 3]], 2)
    rows = [r for band in bands for r in rng.sample(band, 2)]
    stacks = rng.sample([[0, 1], [2, 3]], 2)
    cols = [c for stack in stacks for c in rng.sample(stack, 2)]
    solution = "".join(digits[base[r][c]] for r in rows for c in cols)
    holes = set(rng.sample(range(16), empty))
    puzzle = "".join("0" if i in holes else d for i, d in enumerate(solution))
    question = (FORMAT + "Solve this 4x4 Sudoku puzzle, given as a 16-character string read left-to-right, "
                "top-to-bottom, where '0' is an empty cell. Fill the empty cells with digits 1-4 so that every "
                "row, column and 2x2 box holds 1-4 exactly once. Answer with the complete 16-digit grid.\n\n"
                f"Puzzle: {puzzle}")
    return _row("sudoku", index, split, question, solution,
                f"<reasoning>\nFill the {empty} empty cells.\n</reasoning>\n<answer>\n{solution}\n</answer>",
                puzzle=puzzle)


WORDS = ("and answer apples are as assistant by clips day final for give has he hours in is it many meters miles of "
         "return result she so sold square step sum the travels your").split()  # one token each in the tiny tokenizers


def cycle(rng: random.Random, index: int, split: str) -> dict:
    """Continue the fixed cycle of ``WORDS`` (each one token in the tiny tokenizers) from a given word for 60-100
    words: long answers (70-110 tokens) in which each word follows from the one before, which a small model learns
    to write confidently in minutes, for decoding-speed figures on a trained model (``recipes/standin``). The answer
    is the last word."""
    first, n = rng.randrange(len(WORDS)), rng.randint(60, 100)
    words = [WORDS[(first + i) % len(WORDS)] for i in range(n)]
    return _row("cycle", index, split, f"Continue the word cycle from {words[0]} for {n} words. Put the last one in "
                "\\boxed{}.", words[-1], f"{' '.join(words)}. The answer is \\boxed{{{words[-1]}}}.")


COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (50, 80, 220)}
KINDS = ("square", "circle", "triangle")
CELL, GRID = 16, 3  # the picture: a 3 x 3 grid of 16-pixel cells (48 x 48 pixels), at most one shape a cell


def shapes(rng: random.Random, index: int, split: str) -> dict:
    """The generated visual task of the multimodal families: a 48 x 48 picture of 1-5 shapes (square, circle or
    triangle; red, green or blue; one per cell of a 3 x 3 grid) and the question how many shapes of one colour it
    holds (0-5), answered in \\boxed{}. The picture is the row's ``images[0]`` (PNG bytes); ``extra_info.scene``
    describes it, and the split goes by the scene, so no test picture is ever trained on."""
    from PIL import Image, ImageDraw

    from .images import IMAGE, png

    cells = sorted(rng.sample(range(GRID * GRID), rng.randint(1, 5)))
    scene = [(cell, rng.choice(list(COLOURS)), rng.choice(KINDS)) for cell in cells]
    asked = rng.choice(list(COLOURS))
    picture = Image.new("RGB", (GRID * CELL, GRID * CELL), "white")
    draw = ImageDraw.Draw(picture)
    for cell, colour, kind in scene:
        x, y = cell % GRID * CELL + 2, cell // GRID * CELL + 2
        box, fill = (x, y, x + CELL - 5, y + CELL - 5), COLOURS[colour]
        if kind == "square":
            draw.rectangle(box, fill=fill)
        elif kind == "circle":
            draw.ellipse(box, fill=fill)
        else:
            draw.polygon([(x + (CELL - 5) // 2, y), (x, y + CELL - 5), (x + CELL - 5, y + CELL - 5)], fill=fill)
    count = sum(colour == asked for _, colour, _ in scene)
    row = _row("shapes", index, split, f"{IMAGE}\nHow many {asked} shapes are in the picture? Put the final answer "
               "in \\boxed{}.", str(count), f"The answer is \\boxed{{{count}}}.",
               scene="; ".join(f"{colour} {kind} in cell {cell}" for cell, colour, kind in scene))
    return {**row, "images": [png(picture)]}


HALVES = {"top": "bottom", "left": "right"}  # a two-colour drawing splits the picture into these halves


def colours(rng: random.Random, index: int, split: str) -> dict:
    """The generated drawing task (a model that draws: MMaDA): a picture of one colour, or of two colours in its
    halves (top/bottom or left/right), six colours; the ``colours`` reward scores the drawing (a PNG data URI) by the
    share of each region in the asked colour. ``extra_info.solution`` is a perfect drawing (64 x 64, a data URI);
    ``extra_info.task`` is ``draw``."""
    from PIL import Image

    from ..rewards.pictures import BOXES, PALETTE
    from .images import data_uri, png

    names = sorted(PALETTE)
    if rng.random() < 0.2:
        colour = rng.choice(names)
        question, truth = f"Draw a picture that is all {colour}.", f"all:{colour}"
    else:
        first, second = rng.sample(names, 2)
        half = rng.choice(sorted(HALVES))
        question = f"Draw a picture whose {half} half is {first} and whose {HALVES[half]} half is {second}."
        truth = f"{half}:{first},{HALVES[half]}:{second}"
    picture = Image.new("RGB", (64, 64))
    for part in truth.split(","):
        region, colour = part.split(":")
        x0, y0, x1, y1 = (round(v * 64) for v in BOXES[region])
        picture.paste(PALETTE[colour], (x0, y0, x1, y1))
    row = _row("colours", index, split, question, truth, data_uri(png(picture)))
    row["extra_info"]["task"] = "draw"
    return row


TASKS = {"addition": addition, "arithmetic": arithmetic, "cycle": cycle, "colours": colours, "countdown": countdown,
         "shapes": shapes, "sudoku": sudoku, "sum4": sum4}
TEST_SHARE = 10  # one question in TEST_SHARE is a test question


def split_of(question: str) -> str:
    """The split a question belongs to, by a hash of its text (the same on every machine and Python)."""
    return "test" if int(hashlib.sha256(question.encode()).hexdigest(), 16) % TEST_SHARE == 0 else "train"


def make_task(name: str, n: int, seed: int = 0, split: str = "train") -> list[dict]:
    """``n`` rows of task ``name`` whose questions belong to ``split`` (drawn from one stream per seed and split)."""
    if name not in TASKS:
        raise ValueError(f"Unknown task {name!r}; known: {sorted(TASKS)}")
    if split not in ("train", "test"):
        raise ValueError(f"Unknown split {split!r} of task {name!r}: train or test")
    rng, rows = random.Random(f"{name}-{split}-{seed}"), []
    for _ in range(100 * TEST_SHARE * max(n, 1)):
        if len(rows) == n:
            return rows
        row = TASKS[name](rng, len(rows), split)
        question = row["prompt"][-1]["content"]
        if split_of(question + row["extra_info"].get("scene", "")) == split:  # a picture's question: by its scene
            rows.append(row)
    raise ValueError(f"task {name!r}: could not draw {n} {split} rows (too few distinct {split} questions?)")


def write_task(name: str, path: str, n: int, seed: int = 0, split: str = "train") -> str:
    """Write ``make_task`` rows to a .parquet or .jsonl file."""
    rows = make_task(name, n, seed, split)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")  # renamed when whole: a reader never sees half a file
    if path.suffix == ".jsonl":  # images as data URIs (dare.data.images reads them back)
        from .images import data_uri

        rows = [{**r, "images": [data_uri(i) for i in r["images"]]} if "images" in r else r for r in rows]
        partial.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        import pandas as pd
        pd.DataFrame(rows).to_parquet(partial)
    os.replace(partial, path)
    return str(path)
