"""Benchmark evaluation: exact scoring on known outputs (a scripted engine), pass@k, the resumable sample log and
its fingerprint (a folder made by another model, weights, sampling or prompts is refused, never reused), reports and
comparisons, clear errors, and evaluate.py end to end on tiny models."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dare.engines import HFEngine, Rollout
from dare.eval import benchmarks, harness, report
from dare.models import load_pretrained
from dare.rewards.routing import RewardRouter
from dare.sampling import SamplingConfig

ROOT = Path(__file__).resolve().parents[1]
SHARED_TEST = ROOT.parent / "shared" / "data" / "rl" / "test"


class ScriptedEngine:
    """Returns the given completion texts in order (the engine is not under test here)."""

    max_batch_size = 64

    def __init__(self, outputs, seconds=0.5):
        self.outputs, self.calls, self.seconds = list(outputs), 0, seconds

    def encode(self, prompts):
        return [list(json.dumps(p).encode()) for p in prompts]

    def generate(self, prompts, n, config, seed=None):
        self.calls += 1
        texts = [self.outputs.pop(0) for _ in range(len(prompts) * n)]
        mask = torch.ones(len(texts), 4, dtype=torch.long)
        return Rollout(torch.zeros(len(texts), 2, dtype=torch.long), torch.ones(len(texts), 2, dtype=torch.long),
                       torch.zeros(len(texts), 4, dtype=torch.long), mask, mask, mask, texts, nfe=4,
                       seconds=self.seconds)


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
    records = harness.read_records(tmp_path)
    summary = harness.summarize(records, (1, 2))
    assert summary["accuracy"] == pytest.approx(4 / 9) and summary["pass@1"] == pytest.approx(4 / 9)
    assert summary["pass@2"] == pytest.approx((1 + harness.pass_at_k(3, 1, 2) + 0) / 3)
    assert summary["tokens_per_s"] == pytest.approx(9 * 4 / 0.5) and summary["forwards_per_token"] == 1.0
    assert summary["examples_per_s"] == pytest.approx(9 / 0.5)
    first = next(r for r in records if r["index"] == 1 and r["sample"] == 1)
    assert first["pred"] == truths[1] and first["correct"] == 1.0 and "What is" in first["prompt"]


def crash_and_rerun(folder, seconds):
    """Two batches of two prompts; a crash while writing the second (its first record written, the second cut
    mid-line); then a rerun whose engine takes ``seconds`` per batch."""
    rows = benchmarks.load_benchmark("task:addition", limit=4)
    outputs = [f"\\boxed{{{r['ground_truth']}}}" for r in rows]
    harness.run_benchmark(ScriptedEngine(outputs), "b", rows, [0, 1, 2, 3], 1, None, RewardRouter(["auto"]), folder,
                          batch_size=2, progress=False)
    full = (folder / "samples.0.jsonl").read_text().splitlines()
    (folder / "samples.0.jsonl").write_text("\n".join(full[:3]) + "\n" + full[3][:20])
    engine = ScriptedEngine(outputs[2:], seconds)
    decoded = harness.run_benchmark(engine, "b", rows, [0, 1, 2, 3], 1, None, RewardRouter(["auto"]), folder,
                                    batch_size=2, progress=False)
    plan = harness.expected(engine, rows, [[0, 1], [2, 3]])
    return full, engine, decoded, harness.done_keys(folder, "b", "", plan)


def test_rerun_repairs_a_cut_line_and_regenerates_only_the_unfinished_batch(tmp_path):
    full, engine, _, records = crash_and_rerun(tmp_path, 0.5)
    assert engine.calls == 1  # only the unfinished batch, regenerated whole
    # the cut line is gone, not glued to the next record; the second batch's first record is not written twice
    lines = (tmp_path / "samples.0.jsonl").read_text().splitlines()
    assert lines[:3] == full[:3] and len(lines) == 4
    assert [json.loads(line)["index"] for line in lines] == [0, 1, 2, 3]
    assert sorted(records) == [(i, 0) for i in range(4)] and all(r["correct"] == 1.0 for r in records.values())
    with (tmp_path / "samples.0.jsonl").open("a") as f:
        f.write("not a record\n" + full[0] + "\n")
    with pytest.raises(harness.StaleSamples, match=r"samples.0.jsonl:5 is not a sample record"):
        harness.read_records(tmp_path)  # a damaged line inside the file is never skipped silently


def test_resumed_speed_counts_only_this_runs_batches(tmp_path):
    _, _, decoded, records = crash_and_rerun(tmp_path, seconds=2.0)  # the first run took 0.5 s per batch
    summary = harness.summarize(list(records.values()), decoded=decoded)
    assert summary["decoded"] == 2 and summary["reused"] == 2 and summary["samples"] == 4
    assert summary["tokens_per_s"] == pytest.approx(2 * 4 / 2.0) and summary["forwards_per_token"] == 1.0
    assert summary["examples_per_s"] == pytest.approx(2 / 2.0)
    nothing = harness.summarize(list(records.values()), decoded=dict.fromkeys(("decoded", *harness.SPEED), 0))
    assert nothing["reused"] == 4 and nothing["tokens_per_s"] is None and nothing["forwards_per_token"] is None
    assert "| — |" in report.markdown({"b": nothing})


def tiny_engine(model="tiny:llada"):
    network, tokenizer, family = load_pretrained(model)
    return HFEngine(network, tokenizer, family, max_batch_size=4)


def evaluate(folder, engine, model="tiny:llada", limit=4, overwrite=False, **sampling):
    summaries = harness.evaluate_benchmarks(engine, ["task:addition"], SamplingConfig(gen_length=8, **sampling),
                                            folder, limit=limit, batch_size=2, model_name=model, overwrite=overwrite)
    return summaries["task:addition"]


def same_samples(a, b):
    """The records of two folders, without their timings."""
    records = [[{k: v for k, v in r.items() if k != "seconds"} for r in harness.read_records(f)] for f in (a, b)]
    return records[0] == records[1]


def test_another_model_or_sampling_is_refused_and_overwrite_recomputes(tmp_path):
    llada, sdar = tiny_engine(), tiny_engine("tiny:sdar")
    evaluate(tmp_path / "a", llada)
    before = (tmp_path / "a" / "samples.0.jsonl").read_text()
    model_changed = r"of tiny:llada with weights=\w+, config=\w+; this run is tiny:sdar with weights=\w+, config=\w+\."
    with pytest.raises(harness.StaleSamples, match=model_changed + " Recompute them with --overwrite"):
        evaluate(tmp_path / "a", sdar, "tiny:sdar")
    with pytest.raises(harness.StaleSamples, match=r"tiny:llada with temperature=0.0, top_k=None; this run is "
                                                   r"tiny:llada with temperature=1.0, top_k=3\."):
        evaluate(tmp_path / "a", llada, temperature=1.0, top_k=3)
    assert (tmp_path / "a" / "samples.0.jsonl").read_text() == before  # nothing reused, nothing appended
    # the same settings on other prompts (another data file) are refused too
    rows = benchmarks.load_benchmark("task:addition", limit=4)
    rows[1] = {**rows[1], "ground_truth": "-1"}
    fp = json.loads((tmp_path / "a" / "fingerprint.json").read_text())
    with pytest.raises(harness.StaleSamples, match=r"other prompts or answers .*\[\('task:addition', 1\)\]"):
        harness.check_folder(tmp_path / "a", fp, {"task:addition": harness.expected(llada, rows, [[0, 1], [2, 3]])})

    again = evaluate(tmp_path / "a", sdar, "tiny:sdar", overwrite=True, temperature=1.0)
    fresh = evaluate(tmp_path / "b", sdar, "tiny:sdar", temperature=1.0)
    assert again["decoded"] == fresh["decoded"] == 4 and again["reused"] == 0
    speed = ("tokens_per_s", "examples_per_s", "forwards_per_token")
    assert {k: v for k, v in again.items() if k not in speed} == {k: v for k, v in fresh.items() if k not in speed}
    assert same_samples(tmp_path / "a", tmp_path / "b")
    reports = [json.loads((tmp_path / f / "report.json").read_text()) for f in "ab"]
    assert reports[0]["meta"]["fingerprint"] == reports[1]["meta"]["fingerprint"]
    assert reports[0]["meta"]["fingerprint"]["model"] == "tiny:sdar"


def test_same_settings_resume_exactly_and_a_longer_limit_decodes_only_new_batches(tmp_path):
    engine = tiny_engine()
    first = evaluate(tmp_path, engine, limit=3)  # batches [0, 1] and [2]
    lines = (tmp_path / "samples.0.jsonl").read_text()
    again = evaluate(tmp_path, engine, limit=3)
    assert (tmp_path / "samples.0.jsonl").read_text() == lines
    assert (again["decoded"], again["reused"], again["tokens_per_s"]) == (0, 3, None)
    assert again["accuracy"] == first["accuracy"] and again["mean_length"] == first["mean_length"]
    more = evaluate(tmp_path, engine, limit=4)  # batch [2] became [2, 3]: decoded again, with prompt 3
    assert (more["decoded"], more["reused"], more["samples"]) == (2, 2, 4)
    evaluate(tmp_path / "fresh", engine, limit=4)
    latest = {(r["index"], r["sample"]): r for r in harness.read_records(tmp_path)}
    fresh = {(r["index"], r["sample"]): r for r in harness.read_records(tmp_path / "fresh")}
    assert {k: r["output"] for k, r in latest.items()} == {k: r["output"] for k, r in fresh.items()}


def test_fingerprint_changes_with_the_weights_under_the_same_name():
    engine = tiny_engine()
    before = harness.fingerprint(engine, SamplingConfig(), "tiny:llada")
    with torch.no_grad():
        next(engine.model.parameters()).view(-1)[0] += 1e-3
    after = harness.fingerprint(engine, SamplingConfig(), "tiny:llada")
    assert [k for k in before if before[k] != after[k]] == ["weights"]
    assert harness.digest(before) != harness.digest(after)


def test_reports_and_comparison(tmp_path):
    for name, acc in (("base", 0.25), ("rl", 0.5)):
        (tmp_path / name).mkdir()
        text = report.write_report(tmp_path / name, {"gsm8k": {"prompts": 4, "accuracy": acc}}, {"model": name})
        assert "| gsm8k | 4 | " in text
    table = report.compare([str(tmp_path / n / "report.json") for n in ("base", "rl")], str(tmp_path / "c.png"))
    assert "| gsm8k | 0.2500 | 0.5000 |" in table and (tmp_path / "c.png").stat().st_size > 1000


def test_comparison_plot_is_readable(tmp_path):
    """Short run names from the paths' distinguishing part, a value on every bar, the legend outside the axes."""
    reports = []
    for name, acc in (("base", 0.25), ("d1", 0.5), ("cj-grpo", 0.625)):
        folder = tmp_path / "outputs" / f"eval-llada-{name}"
        folder.mkdir(parents=True)
        report.write_report(folder, {"gsm8k": {"accuracy": acc}, "math500": {"accuracy": acc / 2}}, {"model": "m"})
        reports.append(str(folder / "report.json"))
    table = report.compare(reports, str(tmp_path / "c.png"))
    assert table.startswith("| benchmark | base | d1 | cj-grpo |") and f"- d1: m ({reports[1]})" in table
    assert report.run_names(["a/run1/report.json", "a/run2/report.json"]) == ["run1", "run2"]
    assert report.run_names(["x/llada/base/report.json", "x/sdar/base/report.json"]) == ["llada", "sdar"]
    runs = [json.loads(Path(r).read_text()) for r in reports]
    fig = report.plot_comparison(str(tmp_path / "c2.png"), ["base", "d1", "cj-grpo"], ["gsm8k", "math500"], runs,
                                 "accuracy")
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["base", "d1", "cj-grpo"]
    renderer = fig.canvas.get_renderer()
    assert legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1  # right of the bars
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == sorted(["0.25", "0.50", "0.62", "0.12", "0.25", "0.31"])  # a value on every bar
    width, height = fig.get_size_inches()
    assert 4 <= width <= 12 and 3 <= height <= 6


def test_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="Unknown benchmark 'nope'; known: .*gsm8k.*task:addition"):
        benchmarks.load_benchmark("nope")
    with pytest.raises(FileNotFoundError, match=r"benchmark countdown: countdown_1.parquet, split 'test': no local "
                                                r"copy in .*countdown_1.parquet"):
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
    for name, summary in again["benchmarks"].items():
        assert summary["decoded"] == 0 and summary["reused"] == 3 and summary["tokens_per_s"] is None
        assert {k: summary[k] for k in ("accuracy", "score", "pass@1", "mean_length")} == \
               {k: first["benchmarks"][name][k] for k in ("accuracy", "score", "pass@1", "mean_length")}
    refused = subprocess.run([sys.executable, "evaluate.py", "--model", "tiny:llada", "--gen-length", "16",
                              "--output-dir", str(tmp_path), "--bench", "task:addition"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: ")
    assert "holds samples of tiny:llada with gen_length=8; this run is tiny:llada with gen_length=16" in refused.stderr


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
