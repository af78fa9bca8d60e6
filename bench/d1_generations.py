"""Score d1's published LLaDA-8B-Instruct generations with DARE's ``d1`` protocol and set them beside d1's numbers.

    git clone https://github.com/dllm-reasoning/d1 && python bench/d1_generations.py d1/eval/eval_baselines

d1 publishes the generations behind its Table 1 (``<task>_instruct_<gen length>_<steps>_<rank>_generations.json``).
Each is read as the protocol's reward reads a DARE sample (the text up to the end-of-turn token) and counted with the
protocol's metric (Sudoku: empty cells right, pooled); the table shows the paper's number and the gap. Where DARE
and d1's parser disagree, DARE reads what d1's misses (docs/evaluation.md "Reproducing published numbers").
"""

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from dare.eval.harness import metric_value
from dare.eval.protocols import PROTOCOLS
from dare.rewards import get_reward

# d1 (arXiv 2504.12216), Table 1, LLaDA-8B-Instruct at generation lengths 128 / 256 / 512
PAPER = {"gsm8k": (68.7, 76.7, 78.2), "math500": (26.0, 32.4, 36.2), "countdown": (20.7, 19.5, 16.0),
         "sudoku": (11.7, 6.7, 5.5)}
LENGTHS = (128, 256, 512)
END_OF_TURN = ("<|eot_id|>", "<|endoftext|>")


def as_row(task: str, item: dict) -> tuple[str, str, dict]:
    """A d1 generation record as DARE's reward inputs: (completion, ground truth, extra_info)."""
    text = item["generations"]
    for stop in END_OF_TURN:
        text = text.split(stop)[0]
    truth, extra = item["ground_truth"], {}
    if task == "countdown":
        numbers, truth = truth
        extra = {"numbers": numbers}
    elif task == "sudoku":
        extra = {"puzzle": re.search(r"[0-9]{16}", item["question"]).group(0)}
    elif task == "gsm8k":
        # d1 stores a float; its regex drops a minus sign, so negative answers come out as None
        truth = "" if truth is None else str(int(truth)) if float(truth).is_integer() else str(truth)
    return text, str(truth), extra


def score(folder: Path) -> dict:
    protocol, records = PROTOCOLS["d1"], defaultdict(list)
    for path in sorted(folder.glob("*_generations.json")):
        task, _, length = path.name.split("_")[:3]
        task = "math500" if task == "math" else task
        spec = protocol.task(task)
        reward = get_reward(spec.reward)
        for item in json.loads(path.read_text())["generations"]:
            text, truth, extra = as_row(task, item)
            result = reward(text, truth, extra) if truth else None  # d1 could not read this question's answer
            weight = spec.weight({"extra_info": extra}) if spec.metric == "cells" else 1.0
            records[task, int(length)].append({"score": result.score if result else 0.0,
                                               "correct": result.acc if result else 0.0, "weight": weight,
                                               "unread": result is None})
    return records


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="d1's eval/eval_baselines folder")
    args = parser.parse_args()
    if not args.folder.is_dir():
        raise SystemExit(f"{args.folder} is not a folder (d1's eval/eval_baselines)")
    records = score(args.folder)
    if not records:
        raise SystemExit(f"no *_generations.json in {args.folder}")
    print("| task | length | samples | metric | d1 paper | DARE d1 protocol | gap | ground truth d1 cannot read |")
    print("|---|---|---|---|---|---|---|---|")
    for (task, length), rows in sorted(records.items()):
        metric = PROTOCOLS["d1"].task(task).metric
        value = 100 * metric_value(rows, metric)
        paper = PAPER[task][LENGTHS.index(length)] if length in LENGTHS else None
        gap = f"{value - paper:+.2f}" if paper is not None else ""
        print(f"| {task} | {length} | {len(rows)} | {metric} | {paper if paper is not None else ''} | {value:.2f} | "
              f"{gap} | {sum(r['unread'] for r in rows)} |")


if __name__ == "__main__":
    main()
