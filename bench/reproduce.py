"""Published numbers of the base checkpoints, the DARE command that should reproduce each, and (on a GPU) the run.

    python bench/reproduce.py                       # the README's reproduction table (measured cells from --results)
    python bench/reproduce.py --run --only d1       # run the commands of one protocol (a GPU machine with the weights)
    python bench/reproduce.py --results outputs/reproduce/measured.json

``--run`` runs each row's command (its output folder under ``--out``), reads the row's metric from the report it
wrote and records it in ``measured.json``; the table's "DARE measured" column shows only values recorded that way.
OpenCompass rows read the run's ``summary/summary_*.csv``.
"""

import argparse
import csv
import json
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

D1 = "d1, arXiv 2504.12216, Table 1"
DARE_OC = "DARE's README, base-model table (spec algorithms.md §6.1)"
DARE_RL = "DARE's README, algorithm table, Baseline (spec algorithms.md §6.2-6.3)"
FAST_DLLM = "Fast-dLLM, arXiv 2505.22618, Table 1 baseline (github.com/NVlabs/Fast-dLLM llada/eval.md)"
DREAM = "Dream, arXiv 2508.15487 (as github.com/ZHZisZZ/dllm examples/dream/README.md quotes it)"
LLADA = "github.com/ML-GSAI/LLaDA EVAL.md (OpenCompass, gen 256, block 8)"
TEST = "--data-dir ../shared/data/rl/test"


@dataclass(frozen=True)
class Row:
    protocol: str
    model: str
    bench: str
    published: float
    source: str
    command: str = ""  # {out}: this row's output folder
    metric: tuple = ()  # where the number is in what the command writes: (file or glob, key, ...)


def d1(bench: str, length: int, published: float) -> Row:
    name = {"gsm8k": "GSM8K", "math500": "MATH500", "countdown": "Countdown", "sudoku": "Sudoku (cells)"}[bench]
    return Row("d1", "GSAI-ML/LLaDA-8B-Instruct", f"{name}, {length} tokens", published, D1,
               f"python evaluate.py --model GSAI-ML/LLaDA-8B-Instruct --protocol d1 --bench {bench} {TEST} "
               f"--gen-length {length} --output-dir {{out}}", ("report.json", "benchmarks", bench, "value"))


FAMILY = {"GSAI-ML/LLaDA-8B-Instruct": "llada", "Dream-org/Dream-v0-Instruct-7B": "dream", "JetLM/SDAR-8B-Chat": "sdar",
          "inclusionAI/LLaDA2.0-mini": "llada2"}


def opencompass(model: str, bench: str, published: float) -> Row:
    config = f"recipes/opencompass/{FAMILY[model]}_{bench.lower()}.py"
    return Row("OpenCompass (DARE)", model, bench, published, DARE_OC, f"opencompass {config} -w {{out}}",
               ("**/summary/summary_*.csv", bench.lower()))


def dare(family: str, model: str, bench: str, published: float) -> Row:
    return Row("dare", model, bench, published, DARE_RL,
               f"python evaluate.py --config recipes/{family}/eval.yaml --bench {bench} {TEST} --output-dir {{out}}",
               ("report.json", "benchmarks", bench, "value"))


ROWS = [
    *(d1(bench, length, value) for bench, values in
      {"gsm8k": (76.7, 78.2), "math500": (32.4, 36.2), "countdown": (19.5, 16.0), "sudoku": (6.7, 5.5)}.items()
      for length, value in zip((256, 512), values, strict=True)),
    *(dare(family, model, bench, value) for family, model, values in (
        ("llada", "GSAI-ML/LLaDA-8B-Instruct", {"gsm8k": 76.5, "math500": 34.6, "humaneval": 46.9, "mbpp": 37.9,
                                               "countdown": 16.8, "sudoku": 26.2}),
        ("dream", "Dream-org/Dream-v0-Instruct-7B", {"gsm8k": 77.2, "math500": 39.6, "humaneval": 57.9, "mbpp": 56.2}))
      for bench, value in values.items()),
    *(Row("lm-eval", "GSAI-ML/LLaDA-8B-Instruct", f"gsm8k 5-shot, {n} tokens", value, FAST_DLLM,
          "python -m dare.eval.lm_harness --model dare --tasks gsm8k --num_fewshot 5 --batch_size 8 --model_args "
          f"pretrained=GSAI-ML/LLaDA-8B-Instruct,gen_length={n},steps={n},block_length=32 --output_path {{out}}",
          ("**/results_*.json", "results", "gsm8k", "exact_match,flexible-extract"))
      for n, value in ((256, 79.3), (512, 77.5))),
    Row("lm-eval", "Dream-org/Dream-v0-Instruct-7B", "gsm8k_cot 0-shot chat, 256 tokens", 81.0, DREAM,
        "python -m dare.eval.lm_harness --model dare --tasks gsm8k_cot --apply_chat_template --batch_size 8 "
        "--model_args pretrained=Dream-org/Dream-v0-Instruct-7B,gen_length=256,steps=256,temperature=0.1,top_p=0.9,"
        "remasking=entropy --output_path {out}",
        ("**/results_*.json", "results", "gsm8k_cot", "exact_match,flexible-extract")),
    Row("OpenCompass (LLaDA)", "GSAI-ML/LLaDA-8B-Instruct", "GSM8K", 78.9, LLADA,
        "opencompass recipes/opencompass/llada_gsm8k.py -w {out}", ("**/summary/summary_*.csv", "gsm8k")),
    *(opencompass(model, bench, value) for model, values in {
        "GSAI-ML/LLaDA-8B-Instruct": (79.68, 41.08, 46.34, 38.80),
        "Dream-org/Dream-v0-Instruct-7B": (83.24, 48.02, 78.05, 56.40),
        "JetLM/SDAR-8B-Chat": (91.36, 78.40, 79.88, 71.60),
        "inclusionAI/LLaDA2.0-mini": (88.48, 81.50, 81.10, 64.80)}.items()
      for bench, value in zip(("GSM8K", "MATH", "HumanEval", "MBPP"), values, strict=True)),
]


def key(row: Row) -> str:
    return f"{row.protocol} | {row.model} | {row.bench}"


def table(measured: dict) -> str:
    lines = ["| protocol | model | benchmark | published | source | DARE command | DARE measured |",
             "|---|---|---|---|---|---|---|"]
    for row in ROWS:
        command = f"`{row.command.format(out='OUT')}`"
        value = measured.get(key(row))
        lines.append(f"| {key(row)} | {row.published:g} | {row.source} | {command} | "
                     f"{'' if value is None else f'{value:.2f}'} |")
    return "\n".join(lines)


def read_metric(folder: Path, path: tuple) -> float | None:
    files = sorted(folder.glob(path[0])) if path else []
    if not files:
        return None
    if files[-1].suffix == ".csv":  # OpenCompass's summary: dataset, version, metric, mode, <model> (percent)
        rows = list(csv.reader(files[-1].read_text().splitlines()))
        return next((float(r[-1]) for r in rows[1:] if path[1] in r[0].lower() and r[-1] not in ("", "-")), None)
    value = json.loads(files[-1].read_text())
    for part in path[1:]:
        value = value[part]
    return 100 * float(value)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="store_true", help="run the commands (a GPU machine with the weights)")
    parser.add_argument("--only", help="with --run: only rows of this protocol (d1, lm-eval, OpenCompass (DARE))")
    parser.add_argument("--out", type=Path, default=Path("outputs/reproduce"), help="where the runs write")
    parser.add_argument("--results", type=Path, default=None, help="measured.json to show (default: OUT's)")
    args = parser.parse_args()
    results = args.results or args.out / "measured.json"
    measured = json.loads(results.read_text()) if results.exists() else {}
    if args.run:
        for i, row in enumerate(ROWS):
            if not row.command or (args.only and row.protocol != args.only):
                continue
            folder = args.out / f"row{i:02d}"
            print(f"[{key(row)}] {row.command.format(out=folder)}", file=sys.stderr)
            done = subprocess.run(shlex.split(row.command.format(out=folder)), cwd=Path(__file__).parents[1])
            value = read_metric(folder, row.metric) if done.returncode == 0 else None
            if value is not None:
                measured[key(row)] = value
                results.parent.mkdir(parents=True, exist_ok=True)
                results.write_text(json.dumps(measured, indent=2))
    print(table(measured))


if __name__ == "__main__":
    main()
