"""The offline quickstart end to end (recipes/quickstart/run.py): SFT a tiny LLaDA on generated four-digit sums
until it answers about a fifth of the held-out questions, run d1, measure before and after on held-out questions it
never trained on. Every stage leaves its artefact, and RL raises the held-out reward at T = 1 by at least 3 standard
errors of the paired change, while d1 on the negated reward (its negative control, recipes/lab/compare.py's
``d1:control``) lowers it by at least 3; the margins are printed. About three minutes on one CPU thread."""

import json

from conftest import ROOT, load_script


def test_quickstart_sft_then_d1_raises_held_out_reward_and_its_control_lowers_it(tmp_path, margin):
    quickstart = load_script(ROOT / "recipes" / "quickstart" / "run.py", "quickstart")
    result = quickstart.main(quickstart.Args(output_dir=str(tmp_path)))
    for artefact in ("data/train.jsonl", "sft/model.safetensors", "rl/model.safetensors", "rl/completions.jsonl",
                     "summary.md", "summary.json", "curve.png"):
        assert (tmp_path / artefact).exists(), artefact
    assert json.loads((tmp_path / "summary.json").read_text())["reward"] == result["reward"]
    reward = result["reward"]
    margin(f"quickstart, d1 on llada: held-out T=1 reward {reward['before']:.3f} -> {reward['after']:.3f}: "
           f"{reward['gain']:+.3f} ± {reward['se']:.3f} = {reward['z']:+.1f} SE (margin {reward['z'] - 3:+.1f} SE)")
    assert 0.05 < reward["before"] < 0.5, f"the SFT model should answer some held-out questions, not all: {reward}"
    assert reward["z"] >= 3, reward
    lab = load_script(ROOT / "recipes" / "lab" / "compare.py", "lab_compare")
    settings = lab.Lab()
    start = str(tmp_path / "sft")
    control = lab.run_one("d1:control", "llada", 0, start, lab.measure(start, settings), settings, tmp_path / "lab")
    margin(f"quickstart, d1 on the negated reward: {control['reward_before']:.3f} -> {control['reward_after']:.3f} = "
           f"{control['reward_z']:+.1f} SE (margin {-control['reward_z'] - 3:+.1f} SE)")
    assert control["reward_z"] <= -3, control
