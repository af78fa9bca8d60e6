"""A resume honours the checkpoint or refuses, before the weights load: other settings are named; what may change
(the planned length, logging and checkpoint cadence) is taken as given, and a longer --max-steps trains the extra
steps; --resume with nothing to resume says so, and --resume-must fails."""

import json
import os
import shutil

import pytest
from test_train_rl import data, rl_args  # noqa: F401  (the fixture)
from test_train_sft import args_for, arithmetic  # noqa: F401  (the fixture)

import train_rl
import train_sft
from dare.trainers.checkpoints import MAY_CHANGE, SETTINGS, flat_settings, settings_diff


def steps_of(folder) -> int:
    return json.loads((folder / "trainer_state.json").read_text())["global_step"]


@pytest.fixture
def sft_run(arithmetic, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    train_sft.main(args_for(arithmetic, out, max_steps=2, save_steps=2))
    return arithmetic, out


def test_every_checkpoint_records_the_runs_settings_and_is_readable_by_the_group(sft_run):
    _, out = sft_run
    for folder in (out, out / "checkpoint-2"):  # transformers writes weights 0600; the umask (022 here) is honoured
        mask = os.umask(0)
        os.umask(mask)
        assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~mask
    saved = json.loads((out / "checkpoint-2" / SETTINGS).read_text())
    assert saved["learning_rate"] == 3e-3 and saved["data.max_length"] == 64 and saved["model"] == "tiny:llada"


@pytest.mark.parametrize("change", [{"learning_rate": 1e-3}, {"model": "tiny:dream"}, {"seed": 7},
                                    {"per_device_train_batch_size": 4}])
def test_a_resume_with_other_settings_is_refused_naming_them(sft_run, change):
    rows, out = sft_run
    name = next(iter(change))
    with pytest.raises(ValueError, match=rf"other settings: {name}="):
        train_sft.main(args_for(rows, out, max_steps=4, save_steps=2, resume=True, **change))
    assert not (out / "checkpoint-4").exists()  # refused before anything trained


def logged(folder, key: str) -> dict:
    history = json.loads((folder / "trainer_state.json").read_text())["log_history"]
    return {h["step"]: h[key] for h in history if key in h}


def test_a_finished_run_resumed_with_more_steps_trains_them_on_the_longer_schedule(sft_run, tmp_path):
    rows, out = sft_run
    train_sft.main(args_for(rows, out, max_steps=4, save_steps=2, resume=True))  # max_steps may change
    assert steps_of(out / "checkpoint-4") == 4
    train_sft.main(args_for(rows, tmp_path / "straight", max_steps=4, save_steps=2))
    lr, straight = logged(out / "checkpoint-4", "learning_rate"), logged(tmp_path / "straight" / "checkpoint-4",
                                                                          "learning_rate")
    assert lr[3] == pytest.approx(straight[3]) and lr[4] == pytest.approx(straight[4])  # 4 steps, not 2
    assert lr[2] != straight[2]  # the first two steps ran on the 2-step schedule, as they did


def test_resume_with_nothing_to_resume_says_so_or_fails(arithmetic, tmp_path, capsys):  # noqa: F811
    with pytest.raises(FileNotFoundError, match="--resume-must: .* has no complete checkpoint"):
        train_sft.main(args_for(arithmetic, tmp_path / "a", max_steps=1, resume=True, resume_must=True))
    train_sft.main(args_for(arithmetic, tmp_path / "b", max_steps=1, resume=True))
    assert "no complete checkpoint" in capsys.readouterr().err and (tmp_path / "b" / "model.safetensors").exists()


def test_an_rl_resume_with_another_algorithm_or_length_is_refused(data, tmp_path):  # noqa: F811
    train_rl.main(rl_args(data, tmp_path))
    other = rl_args(data, tmp_path, algo="spg", max_steps=4, resume=True)
    other.algo = "spg"  # as --algo spg sets it
    with pytest.raises(ValueError, match="other settings: algo='d1' \\(now 'spg'\\)"):
        train_rl.main(other)
    with pytest.raises(ValueError, match="rollout.gen_length=8 \\(now 16\\)"):
        train_rl.main(rl_args(data, tmp_path, max_steps=4, resume=True, rollout__gen_length=16))
    train_rl.main(rl_args(data, tmp_path, max_steps=4, resume=True))  # the same run, longer: trains on
    assert steps_of(tmp_path / "checkpoint-4") == 4


def test_what_may_change_is_only_cadence_and_length():
    assert settings_diff({"a.max_steps": 2, "save_steps": 5, "x": 1}, {"a.max_steps": 9, "save_steps": 6, "x": 1}) == []
    assert settings_diff({"x": 1}, {"x": 2}) == ["x=1 (now 2)"]
    assert not MAY_CHANGE & {"learning_rate", "model", "algo", "seed", "gen_length", "max_length", "lr_scheduler_type"}
    flat = flat_settings(args_for("d.jsonl", "out"))
    assert "data.path" in flat and "lora.rank" in flat


def test_logged_losses_across_a_resume_equal_the_uninterrupted_runs(arithmetic, tmp_path):  # noqa: F811
    """A checkpoint between two logged steps (save every 2, log every 3): the resumed run's log at step 3 averages
    steps 1-3 like the uninterrupted run's, not only step 3."""
    kw = dict(max_steps=6, save_steps=2, logging_steps=3)
    train_sft.main(args_for(arithmetic, tmp_path / "straight", **kw))
    shutil.copytree(tmp_path / "straight" / "checkpoint-2", tmp_path / "killed" / "checkpoint-2")  # killed after 2
    train_sft.main(args_for(arithmetic, tmp_path / "killed", **kw, resume=True))
    straight, resumed = (logged(tmp_path / name / "checkpoint-6", "loss") for name in ("straight", "killed"))
    assert list(straight) == [3, 6] and resumed == straight


@pytest.mark.parametrize("damage", ["model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json"])
def test_a_damaged_checkpoint_file_is_named_before_anything_loads(sft_run, damage):
    rows, out = sft_run
    path = out / "checkpoint-2" / damage
    content = bytearray(path.read_bytes())
    at = 8 if damage.endswith(".safetensors") else len(content) // 2  # safetensors: its header (data has no sums)
    content[at:at + 64] = b"\xff" * 64  # bytes overwritten, the size kept
    path.write_bytes(bytes(content))
    with pytest.raises(ValueError, match=rf"checkpoint-2/{damage} is damaged .*: remove .*checkpoint-2"):
        train_sft.main(args_for(rows, out, max_steps=4, save_steps=2, resume=True))
    path.write_bytes(bytes(content[:len(content) // 3]))  # cut short
    with pytest.raises(ValueError, match=rf"{damage} is damaged"):
        train_sft.main(args_for(rows, out, max_steps=4, save_steps=2, resume=True))


def test_a_fresh_run_never_mixes_with_another(sft_run, capsys):
    """A fresh run into a used folder was silent: it overwrote checkpoint-2 and the model, kept the old run's later
    checkpoints, and a later --resume continued the old run. Now it is refused before anything loads; with
    --overwrite-output-dir the old run's checkpoints, model and logs go first (other files stay); a resume names the
    checkpoint it took."""
    rows, out = sft_run
    train_sft.main(args_for(rows, out, max_steps=4, save_steps=2, resume=True))  # the old run: checkpoints 2 and 4
    (out / "notes.txt").write_text("mine")
    assert "--resume: continuing from " + str(out / "checkpoint-2") + " (step 2)" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"holds another run \(checkpoint-2, checkpoint-4, .+\): --resume to continue "
                                         r"it, --overwrite-output-dir to replace it"):
        train_sft.main(args_for(rows, out, max_steps=2, save_steps=2, learning_rate=1e-3))
    assert steps_of(out / "checkpoint-4") == 4  # refused before anything was written
    train_sft.main(args_for(rows, out, max_steps=2, save_steps=2, learning_rate=1e-3, overwrite_output_dir=True))
    assert not (out / "checkpoint-4").exists() and (out / "notes.txt").read_text() == "mine"
    assert json.loads((out / "checkpoint-2" / SETTINGS).read_text())["learning_rate"] == 1e-3
    assert "deleted the previous run" in capsys.readouterr().err
    with pytest.raises(ValueError, match="is the --model folder"):  # --overwrite-output-dir must not delete the start
        train_sft.main(args_for(rows, out, model=str(out), max_steps=2, overwrite_output_dir=True))
    assert (out / "model.safetensors").exists()
