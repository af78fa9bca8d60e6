"""The benches cannot rot: the GPU check's dry run (tiny models, CPU, short lengths) runs every row of its table;
the live-tensor peak counts what is alive, never freed memory; the trained stand-in recipes train and feed
bench_sampling.py; the packing bench runs its quick mode; the RL bench splits a step and prints its rollout share."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, load_script
from test_recipes import STANDIN_RECIPES

import train_sft
from dare.config import parse


def test_gpu_check_dry_run_fills_every_row():
    check = load_script(ROOT / "bench" / "gpu_check.py", "dare_gpu_check")
    rows = check.main(["--dry-run"])
    families = {"llada", "dream", "sdar", "llada2", "sdar_moe", "diffusion_gemma"}
    assert {r[0] for r in rows} == families
    for family in families:
        measures = {r[1] for r in rows if r[0] == family}
        assert "numerics: argmax agreement" in measures and "rl d1: loss + backward s" in measures
        assert {f"sft{lora}{ckpt}: s / step" for lora in ("", " lora") for ckpt in ("", " ckpt")} <= measures
        assert sum(m.startswith("decode ") and "forwards" not in m for m in measures) == 4  # 2 variants x 2 lengths
    assert all(r[2] > 0 for r in rows if "tok/s" in r[3] or r[3] == "s")
    assert min(r[2] for r in rows if r[1] == "numerics: argmax agreement") > 0.9  # bf16 keeps the argmax



def test_bench_sglang_hf_half_runs_without_sglang(tmp_path):
    """What ran on the lent H200 (SGLang's kernels cannot be carried there): the hf engine's rows alone."""
    out = subprocess.run([sys.executable, "bench/bench_sglang.py", "--size", "tiny", "--engines", "hf", "--prompts",
                          "2", "--gen-length", "8", "--rl-steps", "0", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r"^\| (sdar|llada2) \| ([\d.e+]+) \|$", out.stdout, re.M)
    assert [r[0] for r in rows] == ["sdar", "llada2"] and all(float(r[1]) > 0 for r in rows), out.stdout


def test_bench_scoring_skips_columns_and_saves_time_and_memory():
    scoring = load_script(ROOT / "bench" / "bench_scoring.py", "dare_bench_scoring")
    (_, before, _, peak_before), (_, now, _, peak_now), _ = scoring.main(
        ["--hidden", "64", "--layers", "2", "--prompt", "32", "--completion", "32", "--repeats", "1", "--draws", "0"])
    assert now < before and peak_now < peak_before  # columns and live memory (times: the bench's table)


def test_bench_rollout_now_feeds_less_and_draws_the_same():
    rollout = load_script(ROOT / "bench" / "bench_rollout.py", "dare_bench_rollout")
    if subprocess.run(["git", "cat-file", "-e", f"{rollout.BEFORE}^{{commit}}"], cwd=ROOT).returncode:
        pytest.skip(f"the 'before' revision {rollout.BEFORE} is not in this clone's history")
    before, now = rollout.main(["--model", "tiny:sdar", "--prompts", "2", "--generations", "3", "--gen-length", "16",
                                "--repeats", "1"])
    assert now["identical"] == 1.0 and now["fed"] < before["fed"]  # the shared prefill alone feeds less

def test_live_peak_counts_live_tensors_not_freed_memory():
    """Three 16 MiB tensors made and freed one after another peak at 16 MiB (a resident-set high-water mark can read
    more: the allocator keeps freed pages); two alive at once peak at 32."""
    sys.path.insert(0, str(ROOT / "bench"))
    from _common import LivePeak
    with LivePeak() as one_at_a_time:
        for _ in range(3):
            x = torch.ones(4 * 2 ** 20)
            del x
    with LivePeak() as two_at_once:
        x, y = torch.ones(4 * 2 ** 20), torch.ones(4 * 2 ** 20)
        del x, y
    assert 16 <= one_at_a_time.mib < 16.5 and 32 <= two_at_once.mib < 32.5


@pytest.mark.parametrize("path", STANDIN_RECIPES, ids=lambda p: p.stem)
def test_standin_recipe_trains_and_benches(path, tmp_path):
    """The stand-in recipe trains (two steps here) into a normal folder, and bench_sampling.py --model times every
    decoding variant of its family on it, with the exact-answers column filled."""
    args = parse(train_sft.Args, ["--config", str(path)])
    assert args.data.path == "task:cycle" and args.model.startswith("tiny:")
    args.output_dir, args.max_steps, args.save_steps, args.data.limit = str(tmp_path / "standin"), 2, 2, 32
    train_sft.main(args)
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_sampling.py"), "--quick", "--masked", "--block",
                          "--causal", "--no-one-layer", "--model", str(tmp_path / "standin"), "--model-batch", "2",
                          "--jobs", "1"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| standin |")]
    # _sampling_jobs.BLOCK_METHODS, CAUSAL_METHODS, MASKED_METHODS
    assert len(rows) == {"sdar": 4, "nemotron_diffusion": 5}.get(path.stem, 8), out.stdout
    assert all(re.search(r"\| [\d.]+% \| [\d.]+ \|$", row) for row in rows), rows  # quality, wall seconds
    assert "trained (" in out.stdout and "held-out task:cycle questions" in out.stdout


def test_sequence_parallel_bench_halves_the_activations():
    """bench/bench_sequence_parallel.py runs (SP=1 in one process, SP=2 on two gloo ranks) and SP=2 holds less than
    SP=1 per process at a sequence where activations dominate the weights."""
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_sequence_parallel.py"), "--lengths", "512"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    row = next(line for line in out.stdout.splitlines() if line.startswith("| 512 |"))
    print(row)
    one, two = (float(x) for x in row.split("|")[2:4])
    assert two < 0.75 * one, row


def test_packing_bench_quick():
    """bench_packing.py --quick on the shared GSM8K SFT data: one step per mode; packing leaves the least padding."""
    sys.path.insert(0, str(ROOT / "bench"))
    table = load_script(ROOT / "bench" / "bench_packing.py", "dare_bench_packing").main(["--quick"])
    if not table:
        pytest.skip("the GSM8K SFT parquet of ../shared is absent")
    modes, rates, padding = zip(*table, strict=True)
    assert modes == ("pad max_length", "pad longest", "packed")
    assert padding[0] > padding[1] > padding[2] and min(rates) > 0


def test_rl_bench_splits_a_step_and_prints_the_rollout_share():
    """bench_rl.py on tiny LLaDA and SDAR: a row per (model, variant) whose parts add up to ``step s`` and whose
    share is rollout / step; 4 tokens per step takes less than half of one token per step's forwards."""
    out = subprocess.run([sys.executable, "bench/bench_rl.py", "--variants", "plain", "cache + 4 tok/step", "fast",
                          "--steps", "1", "--warmup", "0", "--gen-length", "16", "--prompts", "2", "--generations",
                          "2", "--micro-batch", "4"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {(cells[0], cells[1]): cells for line in out.stdout.splitlines() if line.startswith(("| llada", "| sdar"))
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}
    assert set(rows) == {(f, v) for f in ("llada", "sdar") for v in ("plain", "cache + 4 tok/step", "fast")}, rows
    for (family, _), cells in rows.items():
        rollout, reward, old, train, step = (float(c) for c in cells[3:8])
        assert abs(rollout + reward + old + train - step) < 2e-3 and step > 0
        share, r = int(cells[12].rstrip("%")), 5e-4  # the seconds are printed rounded to 3 decimals
        assert 100 * (rollout - r) / (step + r) - 0.5 <= share <= 100 * (rollout + r) / (step - r) + 0.5, cells
        assert int(rows[family, "cache + 4 tok/step"][11]) < 0.5 * int(rows[family, "plain"][11]), rows


def test_every_mutation_of_the_mutation_check_still_applies():
    """bench/mutations.py changes each distinguishing term by replacing a text that must occur exactly once: a
    refactor that moves the text makes the check stale, and this test says which."""
    mutations = load_script(ROOT / "bench" / "mutations.py", "mutations").MUTATIONS
    stale = [m.name for m in mutations if (ROOT / m.path).read_text().count(m.old) != 1]
    assert not stale, stale
    assert all((ROOT / t.split()[0].split("::")[0]).is_file() for m in mutations for t in m.tests)


def test_the_painting_tokenizer_learns_to_paint_flat_colours(tmp_path):
    """bench/draw_learns.py's tiny MAGVIT-v2, fit on random pictures of the six colours (never the task's), repaints the
    task's training pictures far better than its random start: measured 0.427 after 60 steps against 0.161 unfit,
    paired over the 59 pictures +0.266 ± 0.037; the threshold sits 3 standard errors above the unfit score (its
    negative control) and 4 below the fit one."""
    draw = load_script(ROOT / "bench" / "draw_learns.py", "dare_draw_learns")
    unfit = draw.repainted(Path(draw.painting_tokenizer(tmp_path / "unfit", 0)))
    fitted = draw.repainted(Path(draw.painting_tokenizer(tmp_path / "fitted", 60)))
    print(f"repainted colours reward: unfit {unfit:.3f}, 60 steps {fitted:.3f} (threshold 0.27)")
    assert unfit < 0.27 < fitted
