"""Real 2-process CPU DDP through accelerate (gloo): train_sft.py end to end, and tests/ddp_check.py for rank-equal
parameters after steps on different data. `accelerate launch --cpu --num_processes 2` would silently start ONE
process; `ACCELERATE_USE_CPU=1 ... --multi_gpu` starts two (spec environment.md, "Distributed on CPU")."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(script_args: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), *script_args]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)}\nexit {result.returncode}\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-6000:]}"
    return result


@pytest.mark.parametrize("model", ["tiny:sdar", "tiny:diffusion_gemma"])
def test_two_process_ddp_keeps_ranks_equal(model):
    """Parameters stay identical across ranks after optimizer steps on different per-rank batches (DiffusionGemma:
    its training layout is one call of the wrapped model, encoder and decoder)."""
    check = _launch(["tests/ddp_check.py", model])
    out = check.stdout + check.stderr
    for rank in (0, 1):
        assert f"ddp_check rank={rank} world_size=2" in out and f"ddp_check rank={rank} OK" in out, out[-3000:]


def test_two_process_cpu_ddp(tmp_path):
    """train_sft.py under a 2-process launch writes a complete checkpoint."""
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps({"q": f"{a}+{b}=?", "a": f"{a}+{b}={a + b}"}) + "\n"
                            for a, b in ((i % 10, (3 * i) % 10) for i in range(64))))
    out_dir = tmp_path / "out"
    _launch(["train_sft.py", "--model", "tiny:sdar", "--data.path", str(data), "--data.prompt-key", "q",
             "--data.response-key", "a", "--data.max-length", "48", "--data.pad-to", "longest", "--max-steps", "4",
             "--save-steps", "4", "--per-device-train-batch-size", "2", "--logging-steps", "1",
             "--report-to", "none", "--output-dir", str(out_dir)])
    checkpoint = out_dir / "checkpoint-4"
    assert (checkpoint / "COMPLETE").exists()
    # both processes saved their RNG state (the Trainer writes rng_state_<rank>.pth only when world size > 1) ...
    assert (checkpoint / "rng_state_0.pth").exists() and (checkpoint / "rng_state_1.pth").exists()
    # ... and every optimizer step consumed 2 processes x 2 rows = 4 of the 64 rows (1 process: 2/64)
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    epochs = [h["epoch"] for h in history if "loss" in h]
    assert epochs == pytest.approx([4 / 64 * step for step in range(1, 5)]), epochs


def test_two_process_diffusion_gemma_full_sft_with_gradient_checkpointing(tmp_path):
    """transformers' Trainer turns DDP's unused-parameter detection off under gradient checkpointing; DiffusionGemma's
    vision tower, never fed by text, is frozen at load (dare.models.diffusion_gemma.text_only), so DDP runs."""
    out_dir = tmp_path / "out"
    _launch(["train_sft.py", "--model", "tiny:diffusion_gemma", "--data.path", "tests/data/arith.jsonl",
             "--data.prompt-key", "q", "--data.response-key", "a", "--data.max-length", "64", "--max-steps", "2",
             "--save-steps", "2", "--gradient-checkpointing", "--report-to", "none", "--output-dir", str(out_dir)])
    assert (out_dir / "checkpoint-2" / "COMPLETE").exists()


@pytest.mark.parametrize("algo, extra", [
    ("d1", []),
    ("cj-grpo", ["--algo-config.mini-batches", "2"]),  # per-step (vector) normalisers, one per mini-batch
    ("d-treerpo", ["--algo-config.branch", "2", "--algo-config.num-iterations", "1"]),  # rows = tree parents
])
def test_two_process_cpu_rl(algo, extra, tmp_path):
    """train_rl.py under a 2-process launch: each rank rolls out its own prompts (the normaliser and metrics are
    reduced over both), validation is sharded and gathered, and the checkpoint is complete."""
    from dare.data.tasks import write_task
    train = write_task("addition", str(tmp_path / "train.jsonl"), 64, 0, "train")
    test = write_task("addition", str(tmp_path / "test.jsonl"), 5, 0, "test")
    out_dir = tmp_path / "out"
    _launch(["train_rl.py", "--algo", algo, "--model", "tiny:llada", "--data.path", train, "--data.eval-path", test,
             "--max-steps", "2", "--save-steps", "2", "--eval-steps", "2", "--prompts-per-step", "4",
             "--num-generations", "2", "--micro-batch-size", "2", "--rollout.gen-length", "8",
             "--validation.gen-length", "8", "--output-dir", str(out_dir), *extra])
    checkpoint = out_dir / "checkpoint-2"
    assert (checkpoint / "COMPLETE").exists()
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    train_logs = [h for h in history if "loss" in h]
    assert len(train_logs) == 2 and all(h["grad_norm"] == h["grad_norm"] for h in train_logs)  # not NaN
    rollouts = train_logs if algo != "cj-grpo" else train_logs[:1]  # two mini-batch steps share one rollout
    assert all("reward/addition" in h and "rollout/tokens_per_s" in h for h in rollouts)
    if algo == "d1":
        assert [h["epoch"] for h in train_logs] == pytest.approx([4 / 64, 8 / 64])  # 2 ranks x 2 prompts per step
    assert any("eval_acc/addition" in h for h in history)


def test_two_process_evaluation(tmp_path):
    """evaluate.py under a 2-process launch: each rank decodes its shard into its own samples file; the report
    covers every prompt once."""
    result = _launch(["evaluate.py", "--model", "tiny:llada", "--bench", "task:addition", "--limit", "5",
                      "--gen-length", "8", "--output-dir", str(tmp_path)])
    assert (tmp_path / "samples.0.jsonl").exists() and (tmp_path / "samples.1.jsonl").exists()
    indices = sorted(json.loads(line)["index"] for part in ("samples.0.jsonl", "samples.1.jsonl")
                     for line in (tmp_path / part).read_text().splitlines())
    assert indices == [0, 1, 2, 3, 4]
    summary = json.loads((tmp_path / "report.json").read_text())["benchmarks"]["task:addition"]
    assert summary["prompts"] == 5 and "tokens/s" in result.stderr
