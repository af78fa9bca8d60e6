"""Benchmark evaluation: exact scoring on known outputs (a scripted engine), pass@k, the resumable sample log,
reports and comparisons, clear errors, and evaluate.py end to end on tiny models."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dare.engines import Rollout
from dare.eval import benchmarks, harness, report
from dare.rewards.routing import RewardRouter

ROOT = Path(__file__).resolve().parents[1]
SHARED_TEST = ROOT.parent / "shared" / "data" / "rl" / "test"


class ScriptedEngine:
    """Returns the given completion texts in order (the engine is not under test here)."""

    max_batch_size = 64

    def __init__(self, outputs):
        self.outputs, self.calls = list(outputs), 0

    def generate(self, prompts, n, config, seed=None):
        self.calls += 1
        texts = [self.outputs.pop(0) for _ in range(len(prompts) * n)]
        mask = torch.ones(len(texts), 4, dtype=torch.long)
        return Rollout(torch.zeros(len(texts), 2, dtype=torch.long), torch.ones(len(texts), 2, dtype=torch.long),
                       torch.zeros(len(texts), 4, dtype=torch.long), mask, mask, mask, texts, nfe=4, seconds=0.5)


def test_pass_at_k_unbiased_estimator():
    assert harness.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert harness.pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2)
    assert harness.pass_at_k(3, 0, 2) == 0.0 and harness.pass_at_k(3, 2, 2) == 1.0


def test_scoring_is_exact_on_known_outputs(tmp_path):
    rows = benchmarks.load_benchmark("task:addition", limit=3)
    truths = [r["ground_truth"] for r in rows]
    right, wrong = (lambda t: f"The answer is \\boxed{{{t}}}."), (lambda t: f"\\boxed{{{int(t) + 1}}}")
    # prompt 0: 3/3 right, prompt 1: 1/3 right, prompt 2: 0/3 right (3 samples each, one batch)
    outputs = [right(truths[0])] * 3 + [wrong(truths[1]), right(truths[1]), wrong(truths[1])] + [wrong(truths[2])] * 3
    harness.run_benchmark(ScriptedEngine(outputs), "task:addition", rows, [0, 1, 2], 3, None, RewardRouter(["auto"]),
                          tmp_path, progress=False)
    records = list(harness.done_keys(tmp_path, "task:addition").values())
    summary = harness.summarize(records, (1, 2))
    assert summary["accuracy"] == pytest.approx(4 / 9) and summary["pass@1"] == pytest.approx(4 / 9)
    assert summary["pass@2"] == pytest.approx((1 + harness.pass_at_k(3, 1, 2) + 0) / 3)
    assert summary["tokens_per_s"] == pytest.approx(9 * 4 / 0.5) and summary["forwards_per_token"] == 1.0
    first = next(r for r in records if r["index"] == 1 and r["sample"] == 1)
    assert first["pred"] == truths[1] and first["correct"] == 1.0 and "What is" in first["prompt"]


def test_rerun_skips_finished_batches_and_reproduces(tmp_path):
    rows = benchmarks.load_benchmark("task:addition", limit=4)
    outputs = [f"\\boxed{{{r['ground_truth']}}}" for r in rows]
    harness.run_benchmark(ScriptedEngine(outputs), "b", rows, [0, 1, 2, 3], 1, None, RewardRouter(["auto"]),
                          tmp_path, batch_size=2, progress=False)
    full = (tmp_path / "samples.0.jsonl").read_text().splitlines()
    # crash while writing the second batch: its first record is there, the second was cut mid-line
    (tmp_path / "samples.0.jsonl").write_text("\n".join(full[:3]) + "\n" + full[3][:20])
    engine = ScriptedEngine(outputs[2:])
    harness.run_benchmark(engine, "b", rows, [0, 1, 2, 3], 1, None, RewardRouter(["auto"]), tmp_path, batch_size=2,
                          progress=False)
    assert engine.calls == 1  # only the unfinished batch, regenerated whole
    records = harness.done_keys(tmp_path, "b")
    assert sorted(records) == [(i, 0) for i in range(4)] and all(r["correct"] == 1.0 for r in records.values())


def test_reports_and_comparison(tmp_path):
    for name, acc in (("base", 0.25), ("rl", 0.5)):
        (tmp_path / name).mkdir()
        text = report.write_report(tmp_path / name, {"gsm8k": {"prompts": 4, "accuracy": acc}}, {"model": name})
        assert "| gsm8k | 4 | " in text
    table = report.compare([str(tmp_path / n / "report.json") for n in ("base", "rl")], str(tmp_path / "c.png"))
    assert "| gsm8k | 0.2500 | 0.5000 |" in table and (tmp_path / "c.png").stat().st_size > 1000


def test_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="Unknown benchmark 'nope'; known: .*gsm8k.*task:addition"):
        benchmarks.load_benchmark("nope")
    with pytest.raises(FileNotFoundError, match=r"countdown: no data. Tried: .*countdown_1.parquet.*--data-dir"):
        benchmarks.load_benchmark("countdown", data_dir=str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    result = subprocess.run([sys.executable, "evaluate.py", "--model", str(tmp_path), "--bench", "task:addition"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "Unknown model family 'gpt2'" in result.stderr


def run_evaluate(tmp_path, *flags):
    result = subprocess.run([sys.executable, "evaluate.py", "--model", "tiny:llada", "--gen-length", "8",
                             "--output-dir", str(tmp_path), *flags], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "report.json").read_text())


def test_evaluate_end_to_end_on_generated_and_real_files(tmp_path):
    benches = "task:addition,task:sudoku" + (",gsm8k,countdown,humaneval" if SHARED_TEST.is_dir() else "")
    first = run_evaluate(tmp_path, "--bench", benches, "--limit", "3", "--data-dir", str(SHARED_TEST))
    assert set(first["benchmarks"]) == set(benches.split(","))
    assert (tmp_path / "report.md").exists() and (tmp_path / "samples.0.jsonl").exists()
    for summary in first["benchmarks"].values():
        assert summary["prompts"] == 3 and summary["tokens_per_s"] > 0 and 0 <= summary["accuracy"] <= 1
    lines = (tmp_path / "samples.0.jsonl").read_text().splitlines()
    shutil.copy(tmp_path / "report.json", tmp_path / "first.json")
    again = run_evaluate(tmp_path, "--bench", benches, "--limit", "3", "--data-dir", str(SHARED_TEST))
    assert (tmp_path / "samples.0.jsonl").read_text().splitlines() == lines  # nothing recomputed
    assert again["benchmarks"] == first["benchmarks"]


@pytest.mark.parametrize("family_name", ["llada", "dream", "sdar"])
def test_continuation_elbo(family_name):
    """A one-token continuation is scored exactly (every draw masks it, p = 1); rows are independent of their
    batch (grouped by length, no padding after a continuation)."""
    from dare.eval.loglik import continuation_elbo
    from dare.models import load_pretrained
    model, tok, fam = load_pretrained(f"tiny:{family_name}")
    ctx, answer = "What is 2+2? ", "4"
    ids, target = tok(ctx, add_special_tokens=False)["input_ids"], tok(answer, add_special_tokens=False)["input_ids"]
    assert len(target) == 1
    x = torch.tensor([ids + [fam.mask_id]])
    clean = torch.tensor([ids + target]) if fam.is_block_diffusion else None
    with torch.no_grad():
        exact = fam.logits(model, x, clean_ids=clean)[0, len(ids)].log_softmax(-1)[target[0]].double()
    together = continuation_elbo(model, fam, tok, [ctx, "Hello there", ctx], [answer, "5 and six", "seven"], 4)
    assert torch.allclose(together[0], exact, atol=1e-5)
    alone = continuation_elbo(model, fam, tok, ["Hello there"], ["5 and six"], 4)
    assert torch.allclose(together[1], alone[0], atol=1e-5)
