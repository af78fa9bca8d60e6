"""kill -9 at seeded random moments of SFT, RL (TraceRL with its value model too), VRPO and evaluation runs; rerun
each with --resume (evaluation: the same command) and compare with an uninterrupted run: the weights bit for bit (the
value model's included), every logged step's metrics, the RL completions log and the evaluation samples (each record
once). Any moment is a valid kill point (before the first checkpoint, inside a checkpoint write, after the end): the
property holds for all of them.

One seeded kill point per run here (CI's time budget); ``DARE_FAULT_POINTS=3 python -m pytest -q
tests/test_fault_injection.py`` kills each run at three (about 12 minutes on 2 cores)."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from safetensors.torch import load_file

TRAIN = ["--model", "tiny:llada", "--seed", "0"]
RUNS = {
    "sft": (["train_sft.py", *TRAIN, "--data.path", "tests/data/arith.jsonl", "--data.prompt-key", "q",
             "--data.response-key", "a", "--data.max-length", "64", "--max-steps", "6", "--save-steps", "2",
             "--logging-steps", "1"], ["--resume"]),
    "rl": (["train_rl.py", "--algo", "d1", *TRAIN, "--data.path", "tests/data/addition.jsonl", "--max-steps", "4",
            "--save-steps", "1", "--prompts-per-step", "2", "--num-generations", "4", "--micro-batch-size", "4",
            "--rollout.gen-length", "8", "--logging-steps", "1"], ["--resume"]),
    "rl-value": (["train_rl.py", "--algo", "tracerl", "--model", "tiny:sdar", "--seed", "0", "--data.path",
                  "tests/data/addition.jsonl", "--algo-config.value.model", "policy", "--max-steps", "4",
                  "--save-steps", "1", "--prompts-per-step", "2", "--num-generations", "4", "--micro-batch-size", "4",
                  "--rollout.gen-length", "8", "--logging-steps", "1"], ["--resume"]),
    "vrpo": (["train_rl.py", "--algo", "vrpo", *TRAIN, "--preference.path", "task:addition", "--max-steps", "4",
              "--save-steps", "2", "--prompts-per-step", "8", "--micro-batch-size", "4", "--logging-steps", "1"],
             ["--resume"]),
    "eval": (["evaluate.py", "--model", "tiny:llada", "--bench", "task:addition", "--limit", "12", "--batch-size", "2",
              "--gen-length", "16"], []),
}
TIMING = ("time", "second", "runtime", "per_s", "tok", "flos")  # wall-clock measurements differ run to run
# One math thread per run: bit-for-bit comparisons across processes need reductions that do not depend on how the
# library splits work under load (a resumed VRPO step once differed from the straight run's in the last bit of one
# gradient, on a loaded machine; 32 resumes of the same checkpoint on a quieter one all matched).
SINGLE = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run(argv: list[str], out: Path, kill_after: float | None = None) -> None:
    flag = "--output-dir"
    proc = subprocess.Popen([sys.executable, *argv, flag, str(out)], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=SINGLE)
    if kill_after is None:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-2000:]
        return
    time.sleep(kill_after)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)


def weights(out: Path) -> dict:
    """The final model's weights, and its value model's (``value/``) where the run has one."""
    value = out / "value" / "model.safetensors"
    return {**load_file(str(out / "model.safetensors")),
            **({f"value.{k}": v for k, v in load_file(str(value)).items()} if value.exists() else {})}


def steps(out: Path) -> list[dict]:
    """Every logged step's metrics of the final checkpoint, wall-clock ones left out."""
    final = max(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    history = json.loads((final / "trainer_state.json").read_text())["log_history"]
    return [{k: v for k, v in h.items() if not any(t in k for t in TIMING) and k != "train_loss"} for h in history
            if "train_runtime" not in h]


def completions(out: Path) -> list[dict]:
    path = out / "completions.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [{k: v for k, v in json.loads(line).items() if not any(t in k for t in TIMING)} for line in lines]


def samples(out: Path) -> list[tuple]:
    records = [json.loads(line) for p in sorted(out.glob("samples.*.jsonl")) for line in p.read_text().splitlines()]
    return sorted((r["index"], r["sample"], r["output"], r["score"]) for r in records)


@pytest.mark.parametrize("name", list(RUNS))
def test_kill_nine_then_resume_equals_the_uninterrupted_run(name, tmp_path):
    argv, again = RUNS[name]
    start = time.monotonic()
    run(argv, tmp_path / "straight")
    duration = time.monotonic() - start
    rng = random.Random(f"fault-{name}")
    for point in range(int(os.environ.get("DARE_FAULT_POINTS", "1"))):
        out = tmp_path / f"killed{point}"
        delay = duration * rng.uniform(0.3, 0.95)  # seeded; startup takes most of the first seconds
        run(argv, out, kill_after=delay)
        run(argv + again, out)
        if name == "eval":
            assert samples(out) == samples(tmp_path / "straight"), f"kill at {delay:.1f}s"
            assert len(samples(out)) == 12  # each record once
            continue
        a, b = weights(tmp_path / "straight"), weights(out)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"kill at {delay:.1f}s"
        assert steps(out) == steps(tmp_path / "straight"), f"kill at {delay:.1f}s"
        assert completions(out) == completions(tmp_path / "straight"), f"kill at {delay:.1f}s"
