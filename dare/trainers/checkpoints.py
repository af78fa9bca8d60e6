"""Crash-safe checkpoints: a checkpoint counts only once its completion marker exists.

transformers' Trainer writes ``checkpoint-N/`` file by file; a crash mid-write would leave a folder that looks
like a checkpoint. We write ``checkpoint-N/COMPLETE`` last, atomically (temp file + rename, after every rank has
saved), and resume only from folders that have it.
"""

import os
import re
from pathlib import Path

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
