"""SFT trainer: ``transformers.Trainer`` (logging, evaluation, checkpointing, accumulation, mixed precision,
gradient checkpointing, ``report_to``, DDP/FSDP/DeepSpeed through Accelerate) with the family's masked-diffusion
SFT loss from ``dare.objectives``; only ``compute_loss``, checkpoint completion and the logs (``logs.py``) are ours."""

import torch
from transformers import Trainer

from ..objectives import sft_loss
from .checkpoints import CompleteCheckpoints
from .logs import TrainerLogs


class DiffusionSFTTrainer(TrainerLogs, CompleteCheckpoints, Trainer):
    def __init__(self, *args, family, **kwargs):
        super().__init__(*args, **kwargs)
        self.family = family
        self.loss_is_scaled_for_ga = False  # sft_loss is a micro-batch mean: let Trainer divide by accumulation

    def evaluate(self, *args, **kwargs):
        """The held-out loss with the same masks at every evaluation (seeded from ``args.seed``), so evaluations
        compare; the training RNG state is restored after, so evaluating does not change the training run."""
        with torch.random.fork_rng(devices=[self.args.device] if self.args.device.type == "cuda" else []):
            torch.manual_seed(self.args.seed)
            return super().evaluate(*args, **kwargs)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        with torch.no_grad():
            return self.compute_loss(model, self._prepare_inputs(inputs)).detach(), None, None

    def floating_point_ops(self, inputs):
        return 0  # Trainer would recount the parameters every step for a FLOPs estimate nobody reads

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, parts = sft_loss(model, self.family, inputs["input_ids"], inputs["loss_mask"],
                               inputs["attention_mask"], return_parts=True)
        if self.model.training and self.state.global_step % max(self.args.logging_steps, 1) == 0:
            self._masked_fraction = float(parts["n_masked"].sum() / parts["answer_len"].sum().clamp(min=1))
        return (loss, None) if return_outputs else loss

    def log(self, logs, *args, **kwargs):
        if "loss" in logs and hasattr(self, "_masked_fraction"):
            logs["masked_fraction"] = round(self._masked_fraction, 4)
        super().log(logs, *args, **kwargs)
