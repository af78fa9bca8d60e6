"""SFT trainer: ``transformers.Trainer`` (logging, evaluation, checkpointing, accumulation, mixed precision,
gradient checkpointing, ``report_to``, DDP/FSDP/DeepSpeed through Accelerate) with the family's masked-diffusion
SFT loss from ``dare.objectives``; only ``compute_loss`` and checkpoint completion are ours."""

from transformers import Trainer

from ..objectives import sft_loss
from .checkpoints import CompleteCheckpoints


class DiffusionSFTTrainer(CompleteCheckpoints, Trainer):
    def __init__(self, *args, family, **kwargs):
        super().__init__(*args, **kwargs)
        self.family = family
        self.loss_is_scaled_for_ga = False  # sft_loss is a micro-batch mean: let Trainer divide by accumulation

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
