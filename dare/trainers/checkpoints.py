"""Crash-safe checkpoints: a checkpoint counts only once its completion marker exists.

transformers' Trainer writes ``checkpoint-N/`` file by file; a crash mid-write would leave a folder that looks
like a checkpoint. We write ``checkpoint-N/COMPLETE`` last, atomically (temp file + rename, after every rank has
saved), and resume only from folders that have it.
"""

import json
import os
import re
from pathlib import Path

from ..lora import export_merged

COMPLETE = "COMPLETE"


def mark_complete(folder: str) -> None:
    tmp = Path(folder) / f".{COMPLETE}.tmp"
    tmp.write_text("ok\n")
    os.replace(tmp, Path(folder) / COMPLETE)


def latest_complete_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-N`` under ``output_dir`` whose completion marker exists."""
    if not Path(output_dir).is_dir():
        return None
    steps = [(int(m.group(1)), p) for p in Path(output_dir).iterdir()
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / COMPLETE).exists()]
    return str(max(steps)[1]) if steps else None


class CompleteCheckpoints:
    """Trainer mixin: mark every checkpoint complete once all ranks have written it."""

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            mark_complete(os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}"))


def finished(checkpoint: str) -> bool:
    """The checkpoint is the end of its run (its step reached the run's planned number of steps)."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    return 0 < state.get("max_steps", 0) <= state["global_step"]


def validated(checkpoint: str) -> bool:
    """The checkpoint's own step was validated before it was saved (its log has that step's eval metrics)."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    return any(h.get("step") == state["global_step"] and any(k.startswith("eval_") for k in h)
               for h in state.get("log_history", []))


def fit(trainer, resume: bool = False, merged_dir: str | None = None):
    """Train (with ``resume``: from the newest complete checkpoint), save the final model to ``output_dir`` and,
    for a LoRA model with ``merged_dir``, a merged plain-HF copy there. Resuming a run whose last checkpoint is its
    final step trains nothing: the checkpoint's weights are exported again."""
    output_dir = trainer.args.output_dir
    checkpoint = latest_complete_checkpoint(output_dir) if resume else None
    if resume and checkpoint is None:
        print(f"--resume: no complete checkpoint in {output_dir}; starting from scratch")
    if checkpoint and trainer.args.eval_on_start and validated(checkpoint):
        trainer.args.eval_on_start = False  # validating that step again would log it twice
    if checkpoint and finished(checkpoint):
        print(f"--resume: {checkpoint} is the last step of a finished run; exporting it, training nothing")
        trainer._load_from_checkpoint(checkpoint)
    else:
        trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model(output_dir)
    if merged_dir:
        export_merged(trainer, trainer.processing_class, merged_dir)
    return trainer
