"""Logs a person can trust and read: after a kill and ``--resume`` every log holds one point per step, numbered as
``trainer_state.json`` numbers it (global_step after the optimiser step, from 1); the compact console prints one
line per logged step, not Trainer's dict."""

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator as PluginEventAccumulator
from test_train_rl import data, rl_args  # noqa: F401  (the data fixture)
from transformers import TrainerCallback

import dare.trainers
import train_rl
import train_sft
from dare.trainers import fit
from dare.trainers.logs import trim_jsonl


class Killed(Exception):
    pass


class KillAfter(TrainerCallback):
    """Dies right after step ``step`` is logged (TensorBoard and log_history included), before any later save."""

    def __init__(self, step):
        self.step = step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs and state.global_step == self.step:
            raise Killed


def killed_at(step, monkeypatch):
    def fit_then_die(trainer, *args, **kwargs):
        trainer.add_callback(KillAfter(step))
        return fit(trainer, *args, **kwargs)
    monkeypatch.setattr(dare.trainers, "fit", fit_then_die)  # train_rl.main imports it when it runs


def tensorboard_steps(out: Path, server: bool = False) -> dict[str, Counter]:
    """Scalar steps per tag as TensorBoard's readers see them, over every run folder under ``out``: the classic
    ``EventAccumulator``, or (``server``) the one TensorBoard's Python data provider loads runs with."""
    steps: dict[str, Counter] = {}
    for folder in sorted({p.parent for p in out.rglob("events.out.tfevents.*")}):
        reader = (PluginEventAccumulator if server else EventAccumulator)(str(folder))
        reader.Reload()
        for tag in reader.Tags()["tensors" if server else "scalars"]:
            events = reader.Tensors(tag) if server else reader.Scalars(tag)
            steps.setdefault(tag, Counter()).update(e.step for e in events)
    return steps


def test_resume_leaves_one_point_per_step_in_every_log(data, tmp_path, monkeypatch, capsys):  # noqa: F811
    """Checkpoints at 2 and 4; killed after step 3 was logged (past the last checkpoint), then resumed: step 3 is
    trained and logged again, and every log ends with steps 1..4 exactly once (validation: 0, 2 and 4 once; the
    resumed run does not validate step 2 again on start)."""
    kw = dict(max_steps=4, save_steps=2, report_to="tensorboard", log_completions=1, eval_steps=2, eval_on_start=True)
    with monkeypatch.context() as patch:
        killed_at(3, patch)
        with pytest.raises(Killed):
            train_rl.main(rl_args(data, tmp_path, **kw))
    assert not (tmp_path / "checkpoint-4").exists()
    capsys.readouterr()
    train_rl.main(rl_args(data, tmp_path, resume=True, **kw))
    state = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2, 3, 4]
    assert [h["step"] for h in state["log_history"] if "eval_acc" in h] == [0, 2, 4]

    completions = [json.loads(line)["step"] for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert completions == [1, 2, 3, 4]  # one rollout per step, numbered as trainer_state.json numbers it
    assert completions == [h["step"] for h in state["log_history"] if "reward" in h]

    for server in (False, True):
        steps = tensorboard_steps(tmp_path, server)
        assert steps["train/loss"] == Counter({1: 1, 2: 1, 3: 1, 4: 1})
        assert steps["train/reward"] == Counter({1: 1, 2: 1, 3: 1, 4: 1})
        assert steps["eval/acc"] == Counter({0: 1, 2: 1, 4: 1})
        scalars = [tag for tag in steps if "text_summary" not in tag]
        assert len(scalars) > 20
        for tag in scalars:
            assert max(steps[tag].values()) == 1, f"{tag}: {steps[tag]}"

    # the resumed run's console: one compact line per step it trained, no dict
    out = capsys.readouterr().out
    assert "{" not in out and "'loss'" not in out
    assert re.findall(r"^step (\d+)/4  loss ", out, re.M) == ["3", "4"]


def test_compact_console_is_one_line_per_step(data, tmp_path, capsys):  # noqa: F811
    train_rl.main(rl_args(data, tmp_path, max_steps=2, eval_steps=2, algo_config__beta=0.1))
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    train, rest = lines[:2], lines[2:]
    for n, line in enumerate(train, 1):
        assert re.fullmatch(rf"step {n}/2  loss \S+  reward \S+  acc \S+  kl \S+  gnorm \S+  lr \S+  "
                            r"\S+ s/step  rollout \S+ s  \d+ tok/s(  flat \d+%)?", line), line
    assert len(rest) == 2 and re.fullmatch(r"step 2/2  eval  reward \S+  acc \S+  \(\S+ s\)", rest[0]), rest
    assert rest[1].startswith("step 2/2  done in ")
    assert all(len(line) < 160 for line in lines)


def test_a_rollout_shows_progress_and_tied_groups_are_named(data, tmp_path, capsys, monkeypatch):  # noqa: F811
    """A rollout prints a line every few seconds (here 0.01 s) with its forwards so far; a step whose groups all tie
    (every reward 0) shows "flat 100%" and warns once, naming what to change."""
    from dare.trainers.logs import RolloutProgress
    monkeypatch.setattr(RolloutProgress, "every", 0.01)
    train_rl.main(rl_args(data, tmp_path, max_steps=2, rewards=["test_length:0"], data__eval_path=None,
                          rollout__gen_length=64))  # 64 forwards a rollout: several 0.01 s ticks on any CPU
    captured = capsys.readouterr()
    progress = re.findall(r"^rollout (\d) \(8 completions\): decoding, \d+ s, (\d+) forwards$", captured.out, re.M)
    assert {n for n, _ in progress} == {"1", "2"} and int(progress[-1][1]) > 0, captured.out
    steps = [line for line in captured.out.splitlines() if line.startswith("step ")]
    assert all(line.endswith("flat 100%") for line in steps[:2]), steps
    assert captured.err.count("of the rollout's groups have every completion scored alike") == 1, captured.err
    monkeypatch.setattr(RolloutProgress, "every", 60.0)  # a rollout quicker than that prints nothing
    train_rl.main(rl_args(data, tmp_path / "quick", max_steps=1, save_steps=1, data__eval_path=None))
    assert "decoding" not in capsys.readouterr().out


def test_the_end_of_a_run_says_what_it_produced(data, tmp_path, capsys):  # noqa: F811
    """The last lines name the model, the last training and validation numbers, the logs and the curves (a PNG of
    loss, reward and accuracy beside the logs); the whole log is written beside the model."""
    train_rl.main(rl_args(data, tmp_path, max_steps=2, eval_steps=2))
    out = capsys.readouterr().out
    assert f"done: the model is in {tmp_path}\n" in out
    assert re.search(r"^  last training step \(step 2\): loss \S+  reward \S+  acc \S+$", out, re.M), out
    assert re.search(r"^  last validation \(step 2\): reward \S+  acc \S+$", out, re.M), out
    assert f"  curves: {tmp_path / 'curves.png'}" in out and f"{tmp_path / 'completions.jsonl'}" in out
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    history = json.loads((tmp_path / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in history if "loss" in h] == [1, 2]


def test_the_start_of_a_run_says_what_it_will_do(data, tmp_path, capsys):  # noqa: F811
    """The first lines name the model's family and size (and how much of it trains: a LoRA run trains its adapters
    alone), the steps, the rate, the folder, and one step's work; each number is the run's own."""
    trainer = train_rl.main(rl_args(data, tmp_path, lora__rank=4, export_merged=False))
    out = capsys.readouterr().out
    total = sum(p.numel() for p in trainer.model.parameters())
    trained = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    assert 0 < trained < total / 2
    rows = len(Path(data[0]).read_text().splitlines())
    assert (f"start: a llada model of {total / 1e6:.2f}M parameters ({trained / 1e6:.2f}M trained), 2 steps at lr "
            f"0.001, saved to {tmp_path}\n  a step: d1, 2 prompts x 4 completions of up to 8 tokens; {rows} "
            "training rows\n") in out, out
    train_sft.main(train_sft.Args(model="tiny:llada", output_dir=str(tmp_path / "sft"), max_steps=1,
                                  per_device_train_batch_size=3, gradient_accumulation_steps=2,
                                  data=train_sft.SFTDataConfig(path="task:sum4", max_length=96, limit=40)))
    assert "\n  a step: 6 examples; 40 training rows\n" in capsys.readouterr().out


def test_full_console_keeps_the_dict(data, tmp_path, capsys):  # noqa: F811
    train_rl.main(rl_args(data, tmp_path, max_steps=2, console="full", data__eval_path=None))
    assert capsys.readouterr().out.count("{'loss'") == 2


def test_sft_console_is_compact(tmp_path, capsys):
    path = tmp_path / "arith.jsonl"
    path.write_text("".join(json.dumps({"q": f"{a}+1=?", "a": f"{a}+1={a + 1}"}) + "\n" for a in range(32)))
    args = train_sft.Args(output_dir=str(tmp_path / "out"), max_steps=3, logging_steps=1,
                          per_device_train_batch_size=8, save_steps=1000)
    args.data.path, args.data.prompt_key, args.data.response_key, args.data.max_length = str(path), "q", "a", 32
    train_sft.main(args)
    out = capsys.readouterr().out
    assert "{" not in out
    assert len(re.findall(r"^step \d/3  loss \S+  gnorm \S+  lr \S+  \S+ s/step$", out, re.M)) == 3


def test_trim_jsonl_keeps_steps_up_to_the_checkpoint(tmp_path):
    path = tmp_path / "completions.jsonl"
    path.write_text("".join(json.dumps({"step": s, "text": "x"}) + "\n" for s in (1, 2, 2, 3)) + '{"step": 4, "te')
    trim_jsonl(path, 2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 2]
    trim_jsonl(path, 0)
    assert path.read_text() == "" and [p.name for p in tmp_path.iterdir()] == ["completions.jsonl"]
