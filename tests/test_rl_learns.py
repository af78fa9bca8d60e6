"""Every algorithm learns, on any machine: from one SFT start on the sum4 task (a tiny model answers about a fifth of
the held-out questions), RL raises the held-out reward at T = 1 by at least 3 standard errors of the paired change,
and the same algorithm trained on the negated reward (every advantage flipped) lowers it by at least 3.

The settings are recipes/lab/compare.py's. CI runs CI_CASES (with d1 on LLaDA in tests/test_quickstart.py): an
online masked-diffusion algorithm with its own estimator (coupled-grpo) and block diffusion (d1 on SDAR); offline
preference optimisation is checked in CI on what it optimises, the held-out preference margin (tests/test_vrpo.py).
Every algorithm runs with DARE_LAB=1 on LLaDA (tracerl also with its value model, dmpo also at its lab profile),
d1, ebpo, mdpo, d-treerpo, tracerl (with and without its value model) and dipo also on SDAR, and the three algorithms of
uniform noise (d1, wd1, gdpo) on DiffusionGemma, and d1 and MaskGRPO on LLaDA-V counting shapes in pictures
(task:shapes; one to fifteen minutes each on one core); the ones that do not learn at the shared settings fail there,
as the README's lab table says."""

import os

import pytest
from conftest import ROOT, load_script

from dare.algos import known

CI_CASES = {("coupled-grpo", "llada"), ("d1", "sdar")}
MIN_Z = 3.0


lab_module = load_script(ROOT / "recipes" / "lab" / "compare.py", "lab_compare")


@pytest.fixture(scope="module")
def starts(tmp_path_factory):
    """One SFT start per family (made on first use) and its held-out measures."""
    out, made = tmp_path_factory.mktemp("lab"), {}

    def start(family):
        if family not in made:
            lab = lab_module.Lab(families=[family], task=TASKS.get(family, "sum4"))
            folder = lab_module.sft_start(family, lab, out)
            made[family] = (folder, lab_module.measure(folder, lab))
        return made[family]
    return start, out


CASES = [(algo, "llada") for algo in known()]
CASES += [(algo, "sdar") for algo in ("d1", "ebpo", "mdpo", "d-treerpo", "tracerl", "tracerl:value", "dipo")]
CASES += [("tracerl:value", "llada"), ("dmpo:lab", "llada")]  # a value model; dmpo's lab profile (the mean baseline)
CASES += [(algo, "diffusion_gemma") for algo in ("d1", "wd1", "gdpo")]  # uniform noise (SFT to a loss of 0.26)
CASES += [(algo, "llada_v") for algo in ("d1", "maskgrpo")]  # pictures: counting shapes (task:shapes)
TASKS = {"llada_v": "shapes"}  # a family's task where it is not sum4


@pytest.mark.parametrize("algo,family", CASES)
def test_algorithm_learns_and_its_flipped_control_unlearns(algo, family, starts, margin):
    if (algo, family) not in CI_CASES and not os.environ.get("DARE_LAB"):
        pytest.skip("runs in the lab (DARE_LAB=1 python -m pytest tests/test_rl_learns.py), not in CI")
    start, out = starts
    lab = lab_module.Lab(families=[family], task=TASKS.get(family, "sum4"))
    folder, before = start(family)
    runs = {spec: lab_module.run_one(spec, family, 0, folder, before, lab, out) for spec in (algo, f"{algo}:control")}
    trained, control = runs[algo], runs[f"{algo}:control"]
    margin(f"{algo} on {family}: held-out T=1 reward {trained['reward_before']:.3f} -> {trained['reward_after']:.3f} "
           f"({trained['reward_z']:+.1f} SE; margin {trained['reward_z'] - MIN_Z:+.1f} SE over the {MIN_Z:.0f} SE "
           f"threshold); flipped control -> {control['reward_after']:.3f} ({control['reward_z']:+.1f} SE; margin "
           f"{-control['reward_z'] - MIN_Z:+.1f} SE)")
    assert trained["reward_z"] >= MIN_Z, trained
    assert control["reward_z"] <= -MIN_Z, control
