"""TRL-style trainers: transformers' Trainer with the diffusion objectives plugged in."""

from .checkpoints import COMPLETE, fit, latest_complete_checkpoint, resume_from, start_or_resume
from .sft import DiffusionSFTTrainer, StopAtLoss

__all__ = ["COMPLETE", "DiffusionSFTTrainer", "StopAtLoss", "fit", "latest_complete_checkpoint", "resume_from",
           "start_or_resume"]
