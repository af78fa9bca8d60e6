"""Run a benchmark through an engine, resumably, and score it with the RL rewards.

Every finished sample is appended to ``samples.<rank>.jsonl`` as soon as its batch completes; a rerun reads every
samples file of the folder and skips the batches that are complete, so a crash loses at most the batch in flight
and the rerun (same batches, same seeds) reproduces what an uninterrupted run would have written. Records hold the
prompt, output, extracted answer, score, correctness and the sample's share of the batch's time and forward passes
(so tokens/s adds up exactly over any subset) and the forward passes its decoding took.
"""

import json
import math
import sys
from pathlib import Path

from tqdm.auto import tqdm


def done_keys(folder: Path, bench: str) -> dict:
    records = {}
    for path in sorted(folder.glob("samples.*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a crash
                continue
            if r["bench"] == bench:
                records[(r["index"], r["sample"])] = r
    return records


def run_benchmark(engine, bench: str, rows: list[dict], indices: list[int], samples: int, config, router,
                  folder: Path, rank: int = 0, batch_size: int = 16, seed: int = 0, progress: bool = True) -> None:
    """Generate and score ``samples`` completions for the rows at ``indices`` (this process's shard)."""
    folder.mkdir(parents=True, exist_ok=True)
    done = done_keys(folder, bench)
    out = folder / f"samples.{rank}.jsonl"
    # batches are fixed chunks of the shard, so a rerun regenerates an unfinished batch exactly as before
    batches = [indices[i:i + batch_size] for i in range(0, len(indices), batch_size)]
    todo = [b for b in batches if any((i, k) not in done for i in b for k in range(samples))]
    bar = tqdm(total=sum(map(len, todo)) * samples, desc=f"{bench} (rank {rank})", disable=not progress)
    for batch in todo:
        rollout = engine.generate([rows[i]["prompt"] for i in batch], samples, config, seed=seed + batch[0])
        expanded = [rows[i] for i in batch for _ in range(samples)]
        results = router.score(rollout.texts, expanded)
        lengths = rollout.completion_mask.sum(-1).tolist()
        total = max(sum(lengths), 1)
        forwards = rollout.nfe / math.ceil(len(expanded) / engine.max_batch_size)  # the engine's micro-batches
        with out.open("a") as f:
            for j, (row, text, result, tokens) in enumerate(zip(expanded, rollout.texts, results, lengths)):
                index, sample = batch[j // samples], j % samples
                share = tokens / total
                f.write(json.dumps({"bench": bench, "index": index, "sample": sample, "source": row["data_source"],
                                    "prompt": row["prompt"][-1]["content"], "output": text, "pred": result.pred,
                                    "ground_truth": row["ground_truth"], "score": result.score, "correct": result.acc,
                                    "tokens": tokens, "seconds": rollout.seconds * share,
                                    "forwards": forwards}) + "\n")  # every sequence goes through each forward
        bar.update(len(batch) * samples)
    bar.close()


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(records: list[dict], ks=(1,)) -> dict:
    """Accuracy (mean correctness over all samples), mean score, pass@k per prompt averaged, and speed."""
    by_prompt = {}
    for r in records:
        by_prompt.setdefault(r["index"], []).append(r["correct"] >= 1.0)
    tokens = sum(r["tokens"] for r in records)
    seconds = sum(r["seconds"] for r in records)
    summary = {"prompts": len(by_prompt), "samples": len(records),
               "accuracy": sum(r["correct"] for r in records) / max(len(records), 1),
               "score": sum(r["score"] for r in records) / max(len(records), 1),
               "tokens_per_s": tokens / seconds if seconds else 0.0,
               "forwards_per_token": sum(r["forwards"] for r in records) / tokens if tokens else 0.0,
               "mean_length": tokens / max(len(records), 1)}
    for k in ks:
        usable = [v for v in by_prompt.values() if len(v) >= k]
        if usable:
            summary[f"pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in usable) / len(usable)
    return summary


def evaluate_benchmarks(engine, names: list[str], sampling, folder: Path, data_dir: str | None = None,
                        limit: int | None = None, samples: int | None = None, pass_k=(1,), batch_size: int = 16,
                        seed: int = 0, model_name: str = "", state=None) -> dict:
    """Run and score every benchmark in ``names`` (this process's shard of each), then, on the main process, write
    and print the report. ``state``: accelerate's PartialState (None: a single process)."""
    from ..rewards.routing import RewardRouter
    from . import benchmarks, report
    rank, world = (state.process_index, state.num_processes) if state else (0, 1)
    router, summaries = RewardRouter(["auto"]), {}
    loaded = {name: benchmarks.load_benchmark(name, data_dir, limit) for name in names}  # fail before decoding
    for name, rows in loaded.items():
        n = samples or (benchmarks.BENCHMARKS[name].samples if name in benchmarks.BENCHMARKS else 1)
        run_benchmark(engine, name, rows, list(range(len(rows)))[rank::world], n, sampling, router, folder, rank,
                      batch_size, seed, state is None or state.is_local_main_process)
        if state:
            state.wait_for_everyone()
        records = [r for (i, k), r in done_keys(folder, name).items() if i < len(rows) and k < n]
        summaries[name] = summarize(records, pass_k)
    if state is None or state.is_main_process:
        meta = {"model": model_name, "sampling": vars(sampling), "limit": limit}
        print(report.write_report(folder, summaries, meta))
        for name, s in summaries.items():
            print(f"[{name}: accuracy {s['accuracy']:.4f} over {s['samples']} samples, {s['tokens_per_s']:.1f} "
                  f"tokens/s, {s['forwards_per_token']:.3f} forward passes per token]", file=sys.stderr)
        print(f"[report: {folder / 'report.md'}, samples: {folder}/samples.*.jsonl]", file=sys.stderr)
    return summaries
