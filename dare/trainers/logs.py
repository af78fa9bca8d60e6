"""Logs a person can trust after a crash and read while training (a ``Trainer`` mixin for every DARE trainer).

One point per step, numbered alike everywhere: every log counts ``global_step`` after the optimiser step (from 1),
as ``trainer_state.json`` does. A resumed run continues each log from its checkpoint's step instead of appending to
what the killed run wrote after it:

- ``trainer_state.json``: Trainer's own (its ``log_history`` comes from the checkpoint);
- JSON-lines logs (``completions.jsonl``): records past the step are dropped, atomically, when training begins (a
  fresh run, step 0, starts them empty; a half-written last line is dropped too);
- TensorBoard: the resumed run writes into the killed run's folder (the newest under ``output_dir/runs``), starting
  with a session restart at ``step + 1`` (``purge_step``): TensorBoard's readers then discard the killed run's
  points from that step on (the Rust data server drops them as the replayed steps arrive), so each tag keeps one
  point per step. A fresh folder per run would show two runs, each holding the replayed steps;
- validation: with ``eval_on_start``, a run resumed from a checkpoint whose step was validated does not validate
  (and log) that step again (``fit``).

Console: ``compact`` (the default) writes one line per log above the progress bar (``tqdm.write``, so they do not
garble each other): step, loss, reward, accuracy, KL, learning rate, wall seconds per training step (validation
and checkpoint saves excluded) and rollout tokens/s, each where the trainer logs it. ``full`` prints Trainer's whole
dict. TensorBoard, wandb and ``log_history`` always get every metric.
"""

import json
import os
import threading
import time
from pathlib import Path

from transformers.integrations import TensorBoardCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback, TrainerCallback

CONSOLE = ("compact", "full")

# (logged key, console label, format) in the order the compact line shows them
SUMMARY_FIELDS = (("loss", "loss", ".4g"), ("reward", "reward", ".3f"), ("acc", "acc", ".3f"))  # a run's last step
TRAIN_FIELDS = (SUMMARY_FIELDS[0], ("diffusion_loss", "diffusion", ".4g"), ("causal_loss", "causal", ".4g"),
                *SUMMARY_FIELDS[1:],
                ("accuracy", "acc", ".3f"), ("margin", "margin", ".4g"), ("kl", "kl", ".3g"),
                ("grad_norm", "gnorm", ".3g"), ("learning_rate", "lr", ".3g"))
EVAL_FIELDS = (("eval_loss", "loss", ".4g"), ("eval_reward", "reward", ".3f"), ("eval_acc", "acc", ".3f"),
               ("eval_accuracy", "acc", ".3f"), ("eval_margin", "margin", ".4g"))


def trim_jsonl(path: str | Path, step: int) -> None:
    """Keep the records of ``path`` whose ``step`` is at most ``step`` (and that parse); rewrite it atomically."""
    path = Path(path)
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line + "\n")
        except (ValueError, KeyError, TypeError):
            continue  # a line cut short by the kill
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _created(event_file: Path) -> tuple[int, float]:
    """When an event file was created: the second its name starts with (``events.out.tfevents.<s>.<host>...``)."""
    second = event_file.name.split(".")[3]
    return int(second) if second.isdigit() else 0, event_file.stat().st_mtime


def newest_run(output_dir: str) -> str | None:
    """The folder under ``output_dir/runs`` holding the event file created last."""
    events = list(Path(output_dir, "runs").glob("**/events.out.tfevents.*"))
    return str(max(events, key=_created).parent) if events else None


def _after_existing_files(folder: str) -> None:
    """TensorBoard reads a folder's event files in name order, and a name starts with the second it was created in:
    wait (at most a second) so that the next file written here sorts after every file already there."""
    last = max((_created(p)[0] for p in Path(folder).glob("events.out.tfevents.*")), default=0)
    wait = last + 1 - time.time()
    if 0 < wait <= 1:  # (a file from a clock ahead of ours: nothing to wait for)
        time.sleep(wait)


class ResumableTensorBoard(TensorBoardCallback):
    """TensorBoard that stays one run across ``--resume`` (see the module docstring)."""

    def on_train_begin(self, args, state, control, **kwargs):
        if not (state.is_world_process_zero and state.global_step > 0 and self.tb_writer is None):
            return super().on_train_begin(args, state, control, **kwargs)
        if self.logging_dir is None:  # TENSORBOARD_LOGGING_DIR, when set, is kept
            from transformers.integrations.integration_utils import default_logdir
            self.logging_dir = newest_run(args.output_dir) or os.path.join(args.output_dir, default_logdir())
        _after_existing_files(self.logging_dir)
        self.tb_writer = self._SummaryWriter(log_dir=self.logging_dir, purge_step=state.global_step + 1)
        # TensorBoard's server-side reader takes a run's first session START for its beginning, not a restart, and
        # a folder written without purge_step has none: a second START makes the purge happen either way
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        self.tb_writer.file_writer.add_event(Event(step=state.global_step + 1,
                                                   session_log=SessionLog(status=SessionLog.START)))
        self.tb_writer.add_text("args", args.to_json_string(), state.global_step)  # the resumed run's arguments

    _epoch_step = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        # Trainer adds ``epoch`` to every log (training, validation, the final summary): keep one point per step
        if logs and "epoch" in logs:
            if state.global_step == self._epoch_step:
                logs = {k: v for k, v in logs.items() if k != "epoch"}
            self._epoch_step = state.global_step
        super().on_log(args, state, control, logs=logs, **kwargs)


def compact_line(logs: dict, state, seconds_per_step: float | None) -> str:
    """One console line for one ``Trainer.log`` call."""
    def fields(spec):
        return [f"{label} {logs[key]:{fmt}}" for key, label, fmt in spec
                if isinstance(logs.get(key), (int, float))]

    step = f"step {state.global_step}/{state.max_steps}" if state.max_steps else f"step {state.global_step}"
    if "train_runtime" in logs:  # the summary Trainer logs when training ends
        return f"{step}  done in {logs['train_runtime']:.1f} s" + (
            f"  mean loss {logs['train_loss']:.4g}" if isinstance(logs.get("train_loss"), float) else "")
    if any(key.startswith("eval_") for key in logs):
        seconds = [f"({logs[k]:.1f} s)" for k in ("eval_seconds", "eval_runtime") if k in logs][:1]
        return "  ".join([step, "eval", *fields(EVAL_FIELDS), *seconds])
    parts = [step, *fields(TRAIN_FIELDS)]
    if seconds_per_step is not None:
        parts.append(f"{seconds_per_step:.2f} s/step")
    if isinstance(logs.get("time/rollout"), (int, float)):
        parts.append(f"rollout {logs['time/rollout']:.2f} s")
    if isinstance(logs.get("rollout/tokens_per_s"), (int, float)):
        parts.append(f"{logs['rollout/tokens_per_s']:.0f} tok/s")
    if logs.get("rollout/flat_groups"):
        parts.append(f"flat {logs['rollout/flat_groups']:.0%}")
    return "  ".join(parts)


class RolloutProgress:
    """A console line every ``every`` seconds while a rollout decodes (the first after ``every``: a quick rollout
    prints nothing): its label, the seconds so far and the policy's forwards so far (DARE's samplers on ``policy``;
    an engine server's decoding shows the time only), so a long first rollout is never silent."""

    every = 5.0

    def __init__(self, label: str, policy, show: bool):
        self.label, self.policy, self.show, self.forwards = label, policy, show, 0

    def __enter__(self):
        if self.show:
            self.hook = self.policy.register_forward_hook(self._count)
            self.done = threading.Event()
            self.thread = threading.Thread(target=self._report, daemon=True)
            self.thread.start()
        return self

    def _count(self, *_):
        self.forwards += 1

    def _report(self):
        from tqdm.auto import tqdm

        start = time.perf_counter()
        while not self.done.wait(self.every):
            forwards = f", {self.forwards} forwards" if self.forwards else ""
            tqdm.write(f"{self.label}: decoding, {time.perf_counter() - start:.0f} s{forwards}")

    def __exit__(self, *exc):
        if self.show:
            self.done.set()
            self.thread.join()
            self.hook.remove()


class _Compact:
    """The compact console: one line per log; the clock restarts after validation and checkpoint saves."""

    _since, _since_step = None, 0

    def _restart(self, state):
        self._since, self._since_step = time.perf_counter(), state.global_step

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        self._restart(state)

    def on_evaluate(self, args, state, control, **kwargs):
        super().on_evaluate(args, state, control, **kwargs)
        self._restart(state)

    def on_save(self, args, state, control, **kwargs):
        super().on_save(args, state, control, **kwargs)
        self._restart(state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        seconds = None
        if "loss" in logs and self._since is not None and state.global_step > self._since_step:
            seconds = (time.perf_counter() - self._since) / (state.global_step - self._since_step)
            self._restart(state)
        self._write(compact_line(logs, state, seconds))


class CompactProgress(_Compact, ProgressCallback):
    def _write(self, line: str):
        if self.training_bar is not None:
            self.training_bar.write(line)  # above the bar, which is redrawn below it
        else:
            print(line, flush=True)


class CompactPrinter(_Compact, PrinterCallback):
    """``disable_tqdm``: no bar, just the lines."""

    def _write(self, line: str):
        print(line, flush=True)


class _TrimOnTrainBegin(TrainerCallback):
    def __init__(self, files):
        self.files = files

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            for name in self.files:
                trim_jsonl(os.path.join(args.output_dir, name), state.global_step)


class TrainerLogs:
    """Trainer mixin: resume-safe TensorBoard and ``jsonl_logs``, and the ``console`` format (``compact`` | ``full``).
    A trainer appending JSON lines with a ``step`` field under ``output_dir`` names them in ``jsonl_logs``."""

    jsonl_logs: tuple[str, ...] = ()

    def __init__(self, *args, console: str = "compact", **kwargs):
        if console not in CONSOLE:
            raise ValueError(f"console={console!r}: expected one of {list(CONSOLE)}")
        super().__init__(*args, **kwargs)
        callbacks = self.callback_handler.callbacks
        for i, callback in enumerate(callbacks):
            if type(callback) is TensorBoardCallback:
                callbacks[i] = ResumableTensorBoard(callback.tb_writer)
            elif console == "compact" and type(callback) is ProgressCallback:
                callbacks[i] = CompactProgress()
            elif console == "compact" and type(callback) is PrinterCallback:
                callbacks[i] = CompactPrinter()
        if self.jsonl_logs:
            self.add_callback(_TrimOnTrainBegin(self.jsonl_logs))


CURVES = (("loss", "eval_loss", "loss"), ("reward", "eval_reward", "reward"), ("acc", "eval_acc", "accuracy"))


def plot_curves(history: list[dict], path: str | Path) -> bool:
    """The run's loss, reward and accuracy per step (training and validation, where logged) as a PNG; False when
    nothing was logged to draw."""
    panels = [(train, held, label) for train, held, label in CURVES
              if any(train in h or held in h for h in history)]
    if not panels:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
    for ax, (train, held, label) in zip(axes[0], panels, strict=True):
        for key, name, style in ((train, "training", {"lw": 1}), (held, "validation", {"marker": "o"})):
            points = [(h["step"], h[key]) for h in history if isinstance(h.get(key), (int, float))]
            if points:
                ax.plot(*zip(*points, strict=True), label=name, **style)
        ax.set_xlabel("optimiser step")
        ax.set_ylabel(label)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def run_plan(trainer) -> str:
    """What a run is about to do, printed as it starts: the model and how much of it trains, the steps and the rate,
    where it saves, and one step's work (the trainer's ``step_plan``, else its examples per step)."""
    sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in trainer.model.parameters()]  # ZeRO-3: whole
    total, trained = sum(n for n, _ in sizes), sum(n for n, grad in sizes if grad)
    args, family = trainer.args, getattr(trainer, "family", None)
    steps = (f"{args.max_steps} step{'s' * (args.max_steps != 1)}" if args.max_steps > 0
             else f"{args.num_train_epochs:g} epochs")
    model = f"{family.name} model" if family is not None else "model"
    step = trainer.step_plan() if hasattr(trainer, "step_plan") else (
        f"{args.per_device_train_batch_size * args.gradient_accumulation_steps * trainer.data_parallel[1]} examples")
    rows = len(trainer.train_dataset)
    return (f"start: a {model} of {total / 1e6:.2f}M parameters ({trained / 1e6:.2f}M trained), {steps} at lr "
            f"{args.learning_rate:g}, saved to {args.output_dir}\n  a step: {step}; {rows} training rows")


def run_summary(output_dir: str, history: list[dict], merged_dir: str | None, curves: bool) -> str:
    """What a finished run produced: where its model, logs and curves are, and its last logged numbers."""
    out = Path(output_dir)
    adapters = (out / "adapter_config.json").exists()
    lines = [f"done: the model is in {out}" + (" (LoRA adapters; a folder every DARE script takes as a model)"
                                              if adapters else "")]
    if merged_dir:
        lines.append(f"  merged model (plain Hugging Face folder): {merged_dir}")
    for prefix, name in (("", "last training step"), ("eval_", "last validation")):
        numbers = next((h for h in reversed(history) if any(f"{prefix}{k}" in h for k, _, _ in SUMMARY_FIELDS)),
                       None)
        if numbers:
            shown = "  ".join(f"{label} {numbers[prefix + key]:{fmt}}" for key, label, fmt in SUMMARY_FIELDS
                              if isinstance(numbers.get(prefix + key), (int, float)))
            lines.append(f"  {name} (step {numbers.get('step', '?')}): {shown}")
    logs = [f"{out / 'trainer_state.json'} (every logged metric)"]
    if (out / "runs").is_dir():
        logs.append(f"{out / 'runs'} (TensorBoard)")
    if (out / "completions.jsonl").exists():
        logs.append(f"{out / 'completions.jsonl'} (sample completions)")
    lines.append("  logs: " + ", ".join(logs))
    if curves:
        lines.append(f"  curves: {out / 'curves.png'}")
    return "\n".join(lines)
