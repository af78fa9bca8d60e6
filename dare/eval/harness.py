"""Run a benchmark through an engine, resumably, and score it with the RL rewards.

Every finished sample is appended to ``samples.<rank>.jsonl`` as soon as its batch completes; a rerun reads every
samples file of the folder and skips the batches that are complete, so a crash loses at most the batch in flight
and the rerun (same batches, same seeds) reproduces what an uninterrupted run would have written. Records hold the
prompt, output, extracted answer, score, correctness and the sample's share of the batch's time and forward passes
(so tokens/s adds up exactly over any subset) and the forward passes its decoding took.

A folder's samples are reused only by a run that would have made them. ``fingerprint.json`` describes what produced
them (``fingerprint``: model name, hub revision, hashes of the weights and config, every sampling knob, seed, samples
per prompt, batch size, processes, engine micro-batch) and every record carries its short hash ``fp``, the hash
``row`` of its prompt's token ids and answer, and its ``batch`` ([first prompt index, number of prompts]; the batch
is seeded with seed + first index). A run whose fingerprint or prompts differ is refused (``StaleSamples``) unless
told to overwrite; a record whose batch is laid out differently (``--limit`` changed the last batch) is decoded
again. Speed counts only the batches decoded by the current run.
"""

import dataclasses
import hashlib
import json
import math
import sys
from pathlib import Path

from tqdm.auto import tqdm

from ..data.images import pictured_prompt
from ..engines.base import digest
from ..rewards.routing import RewardRouter
from . import benchmarks, report
from .protocols import PROTOCOLS, Protocol

WRITTEN = ("samples.*.jsonl", "report.json", "report.md", "fingerprint.json")  # what overwrite may delete
SPEED = ("tokens", "seconds", "forwards")  # summed over the samples decoded in a run


class StaleSamples(ValueError):
    """The output folder holds samples this run must not reuse."""


def fingerprint(engine, sampling, model_name: str = "", seed: int = 0, samples: int | None = None,
                batch_size: int = 16, processes: int = 1, protocol: str = "dare") -> dict:
    """What determines a sample besides its prompt (the prompts are checked per record, see ``expected``)."""
    return {"model": model_name, **engine.identity(), "sampling": dataclasses.asdict(sampling), "seed": seed,
            "samples": samples, "batch_size": batch_size, "processes": processes, "micro_batch": engine.max_batch_size,
            "protocol": protocol}


def _flat(fp: dict) -> dict:
    return {**{k: v for k, v in fp.items() if k != "sampling"}, **(fp.get("sampling") or {})}


_ADVICE = "Recompute them with --overwrite, or use another --output-dir."


def check_folder(folder: Path, fp: dict, plans: dict) -> None:
    """Raise ``StaleSamples`` unless every sample in ``folder`` was made under ``fp`` and, for the benchmarks in
    ``plans`` (name -> ``expected``), for the prompt this run has at its index."""
    path, key, records = folder / "fingerprint.json", digest(fp), read_records(folder)
    if records and path.exists():
        old, new = _flat(json.loads(path.read_text())), _flat(json.loads(json.dumps(fp)))
        diff = [k for k in dict.fromkeys([*old, *new]) if k != "model" and old.get(k) != new.get(k)]
        if diff or old.get("model") != new.get("model"):
            def say(f):
                return (f.get("model") or "an unnamed model") + (" with " if diff else "") + ", ".join(
                    f"{k}={f.get(k)}" for k in diff)
            raise StaleSamples(f"{folder} holds samples of {say(old)}; this run is {say(new)}. {_ADVICE}")
    if any(r.get("fp") != key for r in records):
        raise StaleSamples(f"{folder} holds samples that its fingerprint.json does not describe (written by an "
                           f"older DARE or another run; this run's fingerprint: {key}). {_ADVICE}")
    changed = sorted({(r["bench"], r["index"]) for r in records
                      if r["index"] in plans.get(r["bench"], {}) and r["row"] != plans[r["bench"]][r["index"]][0]})
    if changed:
        raise StaleSamples(f"{folder} holds samples made for other prompts or answers than this run's (benchmark, "
                           f"index) {changed[:4]}{' ...' if len(changed) > 4 else ''}: another data file, tokenizer "
                           f"or chat template? {_ADVICE}")


def load_rows(protocol: Protocol, name: str, tokenizer, data_dir: str | None = None,
              limit: int | None = None, images: bool = False) -> list[dict]:
    """Benchmark ``name``'s rows as ``protocol`` writes and draws them, the first ``limit`` of its order (``images``:
    rows may hold pictures, for a model that reads them)."""
    task = protocol.task(name)
    rows = benchmarks.load_benchmark(name, data_dir, None if task.subsample else limit,
                                     "auto" if protocol.instructs else "none", images)
    return protocol.rows(name, rows, tokenizer)[:limit]


def write_fingerprint(folder: Path, fp: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".fingerprint.{digest(fp)}.tmp"  # replaced atomically: other processes may be reading it
    tmp.write_text(json.dumps(fp, indent=2))
    tmp.replace(folder / "fingerprint.json")


def clear(folder: Path) -> None:
    for pattern in WRITTEN:
        for path in folder.glob(pattern):
            path.unlink()


def read_records(folder: Path) -> list[dict]:
    """Every record of the folder's samples files, in order. A last line without its newline is a write cut by a
    crash (``repair`` removes it before the next append); any other line that is not a record is an error."""
    records = []
    for path in sorted(folder.glob("samples.*.jsonl")):
        lines = path.read_text().split("\n")
        for n, line in enumerate(lines[:-1], 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                raise StaleSamples(f"{path}:{n} is not a sample record. {_ADVICE}") from None
    return records


def repair(path: Path) -> None:
    """Cut a line left unfinished by a crash, so that the next record does not start in the middle of it."""
    data = path.read_bytes() if path.exists() else b""
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def chunks(indices: list[int], size: int) -> list[list[int]]:
    return [indices[i:i + size] for i in range(0, len(indices), size)]


def layout(n: int, world: int, batch_size: int) -> list[list[int]]:
    """The batches of every process: fixed chunks of its shard (rows rank, rank + world, ...)."""
    return [b for rank in range(world) for b in chunks(list(range(n))[rank::world], batch_size)]


def expected(engine, rows: list[dict], batches: list[list[int]]) -> dict:
    """index -> (hash of its prompt's token ids, answer, source and extra info; [first index, size] of its batch)."""
    ids = iter(engine.encode([pictured_prompt(rows[i]) for b in batches for i in b]))
    return {i: (digest([next(ids), rows[i]["ground_truth"], rows[i]["data_source"], rows[i].get("extra_info"),
                        *pictures_digest(rows[i])]), [b[0], len(b)]) for b in batches for i in b}


def pictures_digest(row: dict) -> list[str]:
    """What a record's prompt hash adds for the row's pictures (their placeholders alone say only their sizes)."""
    return [hashlib.blake2b(picture, digest_size=8).hexdigest() for picture in row.get("images") or ()]


def done_keys(folder: Path, bench: str, key: str, plan: dict) -> dict:
    """The records of ``bench`` this run can reuse, by (index, sample): made under fingerprint ``key``, for the
    prompt and in the batch that ``plan`` (``expected``) holds for their index."""
    return {(r["index"], r["sample"]): r for r in read_records(folder)
            if r["bench"] == bench and r.get("fp") == key and (r.get("row"), r.get("batch")) == plan.get(r["index"])}


def prompt_text(prompt) -> str:
    """What a record shows of its prompt: the rendered text, or the chat's last message."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def run_benchmark(engine, bench: str, rows: list[dict], indices: list[int], samples: int, config, router,
                  folder: Path, rank: int = 0, batch_size: int = 16, seed: int = 0, progress: bool = True,
                  key: str = "", task=None) -> dict:
    """Generate and score ``samples`` completions for the rows at ``indices`` (this process's shard), reusing the
    records made under fingerprint ``key``; ``task`` (a protocol's ``Task``) weighs each sample in the metric.
    Returns what this call decoded: samples, tokens, seconds, forwards."""
    folder.mkdir(parents=True, exist_ok=True)
    # batches are fixed chunks of the shard, so a rerun regenerates an unfinished batch exactly as before
    batches = chunks(indices, batch_size)
    plan = expected(engine, rows, batches)
    done = done_keys(folder, bench, key, plan)
    out = folder / f"samples.{rank}.jsonl"
    repair(out)
    todo = [b for b in batches if any((i, k) not in done for i in b for k in range(samples))]
    decoded = dict.fromkeys(("decoded", *SPEED), 0)
    desc = f"{bench} (rank {rank})" if rank else bench  # another machine's first process says which it is
    bar = tqdm(total=sum(map(len, todo)) * samples, desc=desc, disable=not progress)
    for batch in todo:
        rollout = engine.generate([pictured_prompt(rows[i]) for i in batch], samples, config, seed=seed + batch[0])
        expanded = [rows[i] for i in batch for _ in range(samples)]
        results = router.score(rollout.texts, expanded)
        lengths = rollout.completion_mask.sum(-1).tolist()
        total = max(sum(lengths), 1)
        forwards = rollout.nfe / math.ceil(len(expanded) / engine.max_batch_size)  # the engine's micro-batches
        with out.open("a") as f:
            finished = zip(expanded, rollout.texts, results, lengths, strict=True)
            for j, (row, text, result, tokens) in enumerate(finished):
                index, sample = batch[j // samples], j % samples
                if (index, sample) in done:
                    continue  # its record survived the crash: the batch is decoded whole, its records written once
                share = tokens / total
                f.write(json.dumps({"bench": bench, "index": index, "sample": sample, "source": row["data_source"],
                                    "prompt": prompt_text(row["prompt"]), "output": text, "pred": result.pred,
                                    "ground_truth": row["ground_truth"], "score": result.score, "correct": result.acc,
                                    "weight": task.weight(row) if task else 1.0,
                                    "tokens": tokens, "seconds": rollout.seconds * share,
                                    "forwards": forwards,  # every sequence goes through each forward
                                    "fp": key, "row": plan[index][0], "batch": plan[index][1]}) + "\n")
        decoded["decoded"] += len(expanded)
        decoded["tokens"] += sum(lengths)
        decoded["seconds"] += rollout.seconds
        decoded["forwards"] += forwards * len(expanded)
        bar.update(len(batch) * samples)
    bar.close()
    return decoded


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(records: list[dict], ks=(1,), decoded: dict | None = None, metric: str = "accuracy") -> dict:
    """Accuracy (mean correctness over all samples), mean score, pass@k per prompt averaged, the protocol's
    ``metric`` (accuracy, or cells: the score pooled over the samples' weights, i.e. empty sudoku cells right over
    all empty cells) and the speed of ``decoded`` (what this run decoded: ``run_benchmark``'s return; None: all of
    ``records``), None when this run decoded nothing."""
    if decoded is None:
        decoded = {"decoded": len(records), **{k: sum(r[k] for r in records) for k in SPEED}}
    tokens, seconds, n = decoded["tokens"], decoded["seconds"], max(len(records), 1)
    speed = {"tokens_per_s": None, "examples_per_s": None, "forwards_per_token": None}
    if decoded["decoded"]:
        speed = {"tokens_per_s": tokens / seconds if seconds else 0.0,
                 "examples_per_s": decoded["decoded"] / seconds if seconds else 0.0,
                 "forwards_per_token": decoded["forwards"] / tokens if tokens else 0.0}
    by_prompt = {}
    for r in records:
        by_prompt.setdefault(r["index"], []).append(r["correct"] >= 1.0)
    summary = {"prompts": len(by_prompt), "samples": len(records),
               "decoded": decoded["decoded"], "reused": len(records) - decoded["decoded"],
               "accuracy": sum(r["correct"] for r in records) / n, "score": sum(r["score"] for r in records) / n,
               "metric": metric, "value": metric_value(records, metric), **speed,
               "mean_length": sum(r["tokens"] for r in records) / n}
    for k in ks:
        usable = [v for v in by_prompt.values() if len(v) >= k]
        if usable:
            summary[f"pass@{k}"] = sum(pass_at_k(len(v), sum(v), k) for v in usable) / len(usable)
    return summary


def metric_value(records: list[dict], metric: str = "accuracy") -> float:
    """accuracy: the share of samples correct; cells: sum(score * weight) / sum(weight) (d1's sudoku metric)."""
    if metric == "accuracy":
        return sum(r["correct"] for r in records) / max(len(records), 1)
    if metric == "cells":
        weight = sum(r["weight"] for r in records)
        return sum(r["score"] * r["weight"] for r in records) / weight if weight else 0.0
    raise ValueError(f"unknown metric {metric!r}; known: accuracy, cells")


def evaluate_benchmarks(engine, names: list[str], sampling, folder: Path, data_dir: str | None = None,
                        limit: int | None = None, samples: int | None = None, pass_k=(1,), batch_size: int = 16,
                        seed: int = 0, model_name: str = "", state=None, overwrite: bool = False,
                        protocol: Protocol = PROTOCOLS["dare"], max_positions: int | None = None) -> dict:
    """Run and score every benchmark in ``names`` (this process's shard of each) under ``protocol`` (its prompts,
    rewards and metric; ``sampling`` already carries its decoding settings), then, on the main process, write
    and print the report. ``state``: accelerate's PartialState (None: a single process). Raises ``StaleSamples``
    when ``folder`` holds samples of another model, sampling or prompts; ``overwrite`` deletes them first. Every
    benchmark's longest prompt is checked against ``max_positions`` before anything decodes."""
    rank, world = (state.process_index, state.num_processes) if state else (0, 1)
    main = state is None or state.is_main_process
    pictures = engine.family.pictures  # a model that reads pictures: a benchmark's rows may hold them
    loaded = {name: load_rows(protocol, name, engine.tokenizer, data_dir, limit, pictures) for name in names}
    for name, rows in loaded.items():  # a prompt too long for the model fails now, not after earlier benchmarks
        longest = max(map(len, engine.encode([pictured_prompt(r) for r in rows])), default=0)
        sampling.check(engine.family, f"{name}", longest, max_positions)
    routers = {name: RewardRouter([protocol.task(name).reward]) for name in names}
    summaries = {}
    plans = {name: expected(engine, rows, layout(len(rows), world, batch_size)) for name, rows in loaded.items()}
    fp = fingerprint(engine, sampling, model_name, seed, samples, batch_size, world, protocol.name)
    key = digest(fp)
    if overwrite and main:
        clear(folder)
    if state:
        state.wait_for_everyone()
    check_folder(folder, fp, plans)  # every process reads the same files, so all refuse together
    if main:
        write_fingerprint(folder, fp)
    for name, rows in loaded.items():
        n = samples or (benchmarks.BENCHMARKS[name].samples if name in benchmarks.BENCHMARKS else 1)
        decoded = run_benchmark(engine, name, rows, list(range(len(rows)))[rank::world], n, sampling, routers[name],
                                folder, rank, batch_size, seed, state is None or state.is_local_main_process, key,
                                protocol.task(name))
        if world > 1:
            from accelerate.utils import gather_object
            parts = gather_object([decoded])  # also waits for every process to finish its shard
            decoded = {k: sum(p[k] for p in parts) for k in decoded}
        summaries[name] = summarize(list(done_keys(folder, name, key, plans[name]).values()), pass_k, decoded,
                                    protocol.task(name).metric)
    if main:
        meta = {"model": model_name, "protocol": protocol.name, "sampling": vars(sampling), "limit": limit,
                "fingerprint": fp, "fp": key}
        print(report.write_report(folder, summaries, meta))
        for name, s in summaries.items():
            speed = (f"{s['tokens_per_s']:.1f} tokens/s, {s['examples_per_s']:.3f} examples/s, "
                     f"{s['forwards_per_token']:.3f} forward passes per token"
                     if s["decoded"] else "no speed: every sample was reused")
            print(f"[{name} ({protocol.name} protocol): {s['metric']} {s['value']:.4f} over {s['samples']} samples "
                  f"({s['decoded']} decoded in this run, {s['reused']} reused), {speed}]", file=sys.stderr)
        print(f"[report: {folder / 'report.md'}, samples: {folder}/samples.*.jsonl]", file=sys.stderr)
    return summaries
