"""Crash-safe checkpoints: a checkpoint counts only once its completion marker exists, and a resume honours it.

transformers' Trainer writes ``checkpoint-N/`` file by file; a crash mid-write would leave a folder that looks
like a checkpoint. We write ``checkpoint-N/COMPLETE`` last, atomically (temp file + rename, after every rank has
saved), and resume only from folders that have it.

Each checkpoint also holds the script's settings (``dare_settings.json``). ``resume_from`` (called before the weights
load) refuses a resume whose settings differ from the checkpoint's, naming each field, except those a resumed run
honours as given (``MAY_CHANGE``: the planned length, logging, checkpoint cadence, validation cadence, console);
a longer ``--max-steps`` trains the extra steps (the learning-rate schedule is laid out again over the new length).
"""

import dataclasses
import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import torch

from ..lora import export_merged
from .logs import plot_curves, run_plan, run_summary

COMPLETE = "COMPLETE"
SETTINGS = "dare_settings.json"
WINDOW = "dare_log_window"  # + .<process>.json: the loss not yet logged when the checkpoint was written
# settings a resumed run takes as given (the last part of a field's dotted name)
MAY_CHANGE = {"max_steps", "num_train_epochs", "logging_steps", "save_steps", "save_total_limit", "report_to",
              "console", "resume", "resume_must", "eval_steps", "eval_on_start", "log_completions", "export_merged",
              "reward_workers", "output_dir", "config", "overwrite_output_dir"}


def share_like_umask(folder: str) -> None:
    """Give files written private (transformers 5.24 saves ``*.safetensors`` as 0600) the mode the umask allows, as
    every other file of the folder has: a second account of the group can read the model."""
    mask = os.umask(0)
    os.umask(mask)
    for path in Path(folder).glob("*.safetensors"):
        if path.stat().st_mode & 0o777 == 0o600:
            path.chmod(0o666 & ~mask)


def mark_complete(folder: str) -> None:
    """Write the marker: the size of every file of the checkpoint, so a file cut short later is found."""
    sizes = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(Path(folder).rglob("*")) if p.is_file()}
    tmp = Path(folder) / f".{COMPLETE}.tmp"
    tmp.write_text(json.dumps(sizes, indent=0))
    os.replace(tmp, Path(folder) / COMPLETE)


def latest_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` under ``output_dir`` whose completion marker exists."""
    if not Path(output_dir).is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in Path(output_dir).iterdir()
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / COMPLETE).exists()]
    return str(max(steps)[1]) if steps else None


class CompleteCheckpoints:
    """Trainer mixin: write the run's settings (``run_settings``, set by ``fit``) into every checkpoint and mark it
    complete once all ranks have written it."""

    run_settings: dict | None = None

    def _load_optimizer_and_scheduler(self, checkpoint):
        # The optimiser state brings back the learning rate the old schedule had reached (0 at the end of a finished
        # run); this run's schedule (laid out over its own --max-steps) sets it again at the checkpoint's step. With
        # an unchanged length it is the same number.
        super()._load_optimizer_and_scheduler(checkpoint)
        schedule = getattr(self.lr_scheduler, "scheduler", self.lr_scheduler)  # accelerate wraps it
        if checkpoint is not None and isinstance(schedule, torch.optim.lr_scheduler.LambdaLR):
            rates = [base * fn(schedule.last_epoch) for base, fn in zip(schedule.base_lrs, schedule.lr_lambdas,
                                                                         strict=True)]
            for group, rate in zip(self.optimizer.param_groups, rates, strict=True):
                group["lr"] = rate
            schedule._last_lr = rates

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        os.makedirs(folder, exist_ok=True)
        # this process's loss summed since the last logged step: the resumed run logs the uninterrupted run's mean
        window = {"loss": float(self._tr_loss), "last_logged": self._globalstep_last_logged}
        Path(folder, f"{WINDOW}.{self.args.process_index}.json").write_text(json.dumps(window))
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            share_like_umask(folder)
            if self.run_settings is not None:
                Path(folder, SETTINGS).write_text(json.dumps(self.run_settings, indent=1, sort_keys=True))
            mark_complete(folder)

    def _load_rng_state(self, checkpoint):
        super()._load_rng_state(checkpoint)  # called once per resume, after Trainer reset its logging window
        path = Path(checkpoint, f"{WINDOW}.{self.args.process_index}.json") if checkpoint else None
        if path is not None and path.exists():
            window = json.loads(path.read_text())
            self._tr_loss += window["loss"]
            self._globalstep_last_logged = window["last_logged"]


def flat_settings(args) -> dict:
    """A script's arguments (a dataclass, nested sections included) as ``{"section.field": JSON value}``."""
    out = {}

    def walk(value, prefix):
        if dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                walk(getattr(value, f.name), f"{prefix}{f.name}.")
        else:
            out[prefix[:-1]] = json.loads(json.dumps(value, default=str))

    walk(args, "")
    return out


def settings_diff(saved: dict, now: dict) -> list[str]:
    """The fields (other than ``MAY_CHANGE``) whose values differ, as ``name=saved (now: value)``."""
    names = sorted(set(saved) | set(now))
    return [f"{k}={saved.get(k)!r} (now {now.get(k)!r})" for k in names
            if k.rsplit(".", 1)[-1] not in MAY_CHANGE and saved.get(k) != now.get(k)]


def check_files(checkpoint: str) -> None:
    """Refuse a checkpoint with a file that cannot be read back (weights, optimiser, scheduler, RNG, trainer state),
    naming it: a damaged file found before anything loads, not as a traceback mid-resume."""
    from safetensors import SafetensorError, safe_open

    advice = f"remove {checkpoint} to resume from the checkpoint before it, or start a new --output-dir"
    try:
        sizes = json.loads(Path(checkpoint, COMPLETE).read_text())
    except ValueError:
        sizes = {}  # an older marker ("ok")
    for name, size in sizes.items():
        path = Path(checkpoint, name)
        if not path.exists() or path.stat().st_size != size:
            found = path.stat().st_size if path.exists() else "missing"
            raise ValueError(f"{path} is damaged (written with {size} bytes, now {found}): {advice}")
    for path in sorted(Path(checkpoint).rglob("*")):
        if path.name == COMPLETE:
            continue
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".safetensors":
                with safe_open(str(path), "pt") as f:
                    f.keys()
            elif path.suffix in (".pt", ".pth"):
                with zipfile.ZipFile(path) as archive:  # torch.save's format: every entry's CRC checked
                    bad = archive.testzip()
                if bad is not None:
                    raise ValueError(f"entry {bad} fails its checksum")
        except (ValueError, UnicodeDecodeError, SafetensorError, zipfile.BadZipFile, OSError) as e:
            raise ValueError(f"{path} is damaged ({e}): {advice}") from None


# what a run writes into its output_dir: a fresh run refuses a folder holding them (another run's), and
# --overwrite-output-dir deletes them first; any other file of the folder is left alone
RUN_FILES = ("checkpoint-*", "runs", "merged", "completions.jsonl", "trainer_state.json", "curves.png", "*.safetensors",
             "*.safetensors.index.json", SETTINGS)


def start_or_resume(args) -> str | None:
    """The checkpoint this run continues from (``--resume``: ``resume_from``), or None for a fresh run. A fresh run
    never mixes with another: a folder holding another run's checkpoints or model is refused, unless
    ``--overwrite-output-dir``, which deletes them (``RUN_FILES``) first. Call it before the weights load."""
    folder, model = Path(args.output_dir), Path(os.path.expanduser(args.model))
    if folder.exists() and model.exists() and folder.resolve() == model.resolve():
        raise ValueError(f"--output-dir {folder} is the --model folder: write the run into another folder")
    if args.resume:
        return resume_from(args.output_dir, args, args.resume_must)
    found = sorted({p for pattern in RUN_FILES for p in folder.glob(pattern)}) if folder.is_dir() else []
    if not found:
        return None
    if not args.overwrite_output_dir:
        names = ", ".join(p.name for p in found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise ValueError(f"{folder} holds another run ({names}): --resume to continue it, --overwrite-output-dir "
                         "to replace it (its checkpoints, model and logs are deleted), or another --output-dir")
    for path in found:  # every process may do this before they join: a file already gone is no error
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if os.environ.get("RANK", "0") == "0":
        print(f"--overwrite-output-dir: deleted the previous run in {folder} ({len(found)} entries)", file=sys.stderr)
    return None


def resume_from(output_dir: str, args, must: bool = False) -> str | None:
    """The checkpoint a ``--resume`` continues from (None: there is none, said on stderr; with ``must`` an error),
    refused when it was made with other settings than ``args`` (see the module docstring). Call it before the
    weights load."""
    checkpoint = latest_complete_checkpoint(output_dir)
    if checkpoint is None:
        if must:
            raise FileNotFoundError(f"--resume-must: {output_dir} has no complete checkpoint to resume from")
        print(f"warning: --resume: no complete checkpoint in {output_dir}; starting from scratch", file=sys.stderr)
        return None
    check_files(checkpoint)
    path = Path(checkpoint, SETTINGS)
    if not path.exists():
        print(f"warning: --resume: {checkpoint} records no settings (an older DARE); they are not checked",
              file=sys.stderr)
        announce(checkpoint)
        return checkpoint
    try:
        saved = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not readable JSON ({e}): a damaged checkpoint") from None
    diff = settings_diff(saved, flat_settings(args))
    if diff:
        shown = "; ".join(diff[:6]) + (f"; and {len(diff) - 6} more" if len(diff) > 6 else "")
        raise ValueError(f"--resume: {checkpoint} was made with other settings: {shown}. Resume with the "
                         f"checkpoint's values, or start a new --output-dir")
    announce(checkpoint)
    return checkpoint


def announce(checkpoint: str) -> None:
    """Say which checkpoint a resume took, and its step (the first process only)."""
    if os.environ.get("RANK", "0") == "0":
        step = json.loads((Path(checkpoint) / "trainer_state.json").read_text()).get("global_step", "?")
        print(f"--resume: continuing from {checkpoint} (step {step})", file=sys.stderr)


def finished(checkpoint: str, max_steps: int = -1) -> bool:
    """The checkpoint is the end of the run: its step reached ``max_steps`` (> 0: this run's plan), or else the
    planned number of steps of the run that wrote it."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    planned = max_steps if max_steps > 0 else state.get("max_steps", 0)
    return 0 < planned <= state["global_step"]


def validated(checkpoint: str) -> bool:
    """The checkpoint's own step was validated before it was saved (its log has that step's eval metrics)."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    return any(h.get("step") == state["global_step"] and any(k.startswith("eval_") for k in h)
               for h in state.get("log_history", []))


def fit(trainer, checkpoint: str | None = None, merged_dir: str | None = None, settings=None):
    """Train (from ``checkpoint``, ``resume_from``'s answer, when given), save the final model to ``output_dir``
    and, for a LoRA model with ``merged_dir``, a merged plain-HF copy there; every checkpoint records ``settings``
    (the script's arguments). Resuming a run whose checkpoint is already at this run's last step trains nothing:
    the checkpoint's weights are exported again."""
    output_dir = trainer.args.output_dir
    trainer.run_settings = flat_settings(settings) if settings is not None else None
    if checkpoint and trainer.args.eval_on_start and validated(checkpoint):
        trainer.args.eval_on_start = False  # validating that step again would log it twice
    if checkpoint and finished(checkpoint, trainer.args.max_steps):
        print(f"--resume: {checkpoint} is the last step of this run; exporting it, training nothing")
        trainer._load_from_checkpoint(checkpoint)
    else:
        if trainer.is_world_process_zero():
            print(run_plan(trainer), flush=True)
        trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(output_dir)
    if trainer.args.should_save:
        share_like_umask(output_dir)
    if merged_dir:
        export_merged(trainer, trainer.processing_class, merged_dir)
        if trainer.args.should_save:
            share_like_umask(merged_dir)
    if trainer.is_world_process_zero():  # the whole log beside the model, its curves, and what the run produced
        trainer.state.save_to_json(os.path.join(output_dir, "trainer_state.json"))
        history = trainer.state.log_history
        curves = plot_curves(history, os.path.join(output_dir, "curves.png"))
        print(run_summary(output_dir, history, merged_dir, curves), flush=True)
    return trainer
