"""The offline quickstart end to end (recipes/quickstart/run.py): SFT a tiny LLaDA on generated single-digit sums
until it answers some held-out prompts, run d1, evaluate before and after. Every stage leaves its artefact, and
RL raises held-out accuracy (greedy, 200 prompts) measurably. About a minute and a half on one CPU thread."""

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_quickstart():
    spec = importlib.util.spec_from_file_location("quickstart", ROOT / "recipes" / "quickstart" / "run.py")
    module = sys.modules["quickstart"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_sft_then_d1_raises_held_out_accuracy(tmp_path):
    quickstart = load_quickstart()
    result = quickstart.main(quickstart.Args(output_dir=str(tmp_path)))
    for artefact in ("data/train.jsonl", "sft/model.safetensors", "eval-sft/report.json", "rl/model.safetensors",
                     "rl/completions.jsonl", "eval-rl/report.json", "summary.md", "curve.png"):
        assert (tmp_path / artefact).exists(), artefact
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["before"]["prompts"] == 200 and summary["after"]["prompts"] == 200
    before, after = result["before"], result["after"]
    assert 0.05 < before < 0.5, f"the SFT model should answer some held-out prompts, not all: {before}"
    assert after >= before + 0.05, f"held-out accuracy {before:.3f} -> {after:.3f}"
