"""SFT trainer: ``transformers.Trainer`` (logging, evaluation, checkpointing, accumulation, mixed precision,
gradient checkpointing, ``report_to``, DDP/FSDP/DeepSpeed through Accelerate) with the family's masked-diffusion
SFT loss from ``dare.objectives``; only ``compute_loss``, checkpoint completion, the logs (``logs.py``) and the optional
generation accuracy of held-out prompts at each evaluation (``validation.py``) are ours."""

import torch
from transformers import Trainer, TrainerCallback

from ..diffusion import DRAWING, DRAWING_TEXT_DROPOUT, uniform
from ..models.readers import EveryPosition
from ..objectives import sft_loss, sft_noise, sft_units
from .checkpoints import CompleteCheckpoints
from .distributed import ShardedTraining
from .logs import TrainerLogs
from .validation import generation_metrics

GENERATION_BATCH = 16  # held-out prompts decoded together by the optional generation accuracy
REWARD_WORKERS = 8  # threads scoring those answers (train_rl.py's default)


class DiffusionSFTTrainer(TrainerLogs, CompleteCheckpoints, ShardedTraining, Trainer):
    def __init__(self, *args, family, generation=None, sequence_parallel: int = 1, pictures=None, **kwargs):
        """``generation``: ``(rows, sampling, rewards)``, held-out RL rows decoded with ``sampling`` and scored by
        ``rewards`` at every evaluation, beside the held-out loss (``eval_acc``, ``eval_reward``, per data source).
        ``sequence_parallel``: processes sharing each row in training (``ShardedTraining``). ``pictures``: the
        model's picture reader (``dare.models.pictures``): a batch with pictures is scored by the model handed them."""
        self.sequence_parallel = sequence_parallel
        super().__init__(*args, **kwargs)
        self.family, self.generation, self.pictures = family, generation, pictures
        self._terms, self._terms_since = {}, 0
        self.loss_is_scaled_for_ga = True  # each micro-batch loss divides by the whole step's count (below)

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The micro-batches of one optimiser step, each with its noise drawn now (the same draws, in the same order,
        as drawing them in each micro-step), and the step's normaliser: the rows or masked tokens (``sft_units``)
        of every micro-batch on every process, over the processes (which average gradients)."""
        batches, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        self._step = batches, None
        self._draw_noise()
        return self._step

    def _draw_noise(self):
        """(Re)draw the step's noise; the normaliser (two counts with a causal loss) is made once, then updated in
        place, since the training loop already holds it when a resume redraws."""
        batches, normaliser = self._step
        units = 0
        for batch in batches:
            segments = batch.get("segment_ids")  # packed rows: noise and units per example
            recipe = DRAWING if "uncond_ids" in batch else None  # a drawing's codes: MaskGIT's noise
            batch["t"], batch["masked"] = sft_noise(self.family, batch["input_ids"], batch["loss_mask"], recipe,
                                                    segment_ids=segments)
            if recipe is not None:  # and the rows trained without their text
                batch["drop_text"] = uniform(batch["input_ids"].shape[:1], None, batch["input_ids"].device) < \
                    DRAWING_TEXT_DROPOUT
            units = units + sft_units(self.family, batch["loss_mask"], batch["masked"], recipe, segments)
        units = self.accelerator.reduce(units.to(self.args.device), "sum") / self.accelerator.num_processes
        if normaliser is None:
            self._step = batches, units
        else:
            normaliser.copy_(units)

    def _load_rng_state(self, checkpoint):
        """A resumed run restores the RNG only after fetching its first step's micro-batches: their noise is drawn
        again from the restored state (the normaliser updated in place), as the uninterrupted run drew it."""
        super()._load_rng_state(checkpoint)
        if getattr(self, "_step", None) is not None:
            self._draw_noise()

    def evaluate(self, *args, **kwargs):
        """The held-out loss with the same masks at every evaluation (seeded from ``args.seed``), so evaluations
        compare; the training RNG state is restored after, so evaluating does not change the training run."""
        with torch.random.fork_rng(devices=[self.args.device] if self.args.device.type == "cuda" else []):
            torch.manual_seed(self.args.seed)
            return super().evaluate(*args, **kwargs)

    def evaluation_loop(self, *args, metric_key_prefix: str = "eval", **kwargs):
        output = super().evaluation_loop(*args, metric_key_prefix=metric_key_prefix, **kwargs)
        if self.generation is not None:
            rows, sampling, rewards = self.generation
            output.metrics.update(generation_metrics(self, rows, sampling, rewards, REWARD_WORKERS, GENERATION_BATCH,
                                                     metric_key_prefix))
        return output

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        with torch.no_grad():
            return self.compute_loss(model, self._prepare_inputs(inputs)).detach(), None, None

    def floating_point_ops(self, inputs):
        return 0  # Trainer would recount the parameters every step for a FLOPs estimate nobody reads

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        sp = self.sp if self.model.training else None  # evaluation: whole rows per process, as without SP
        if "pixel_values" in inputs:  # the tower and projector run in every forward: they get their gradients
            model = self.pictures.wrap(model, inputs["pixel_values"], inputs["image_sizes"], fixed=False)
        ids, attention, recipe = inputs["input_ids"], inputs["attention_mask"], None
        if "uncond_ids" in inputs:  # drawings: MMaDA's positions over every column, some rows without their text
            model, recipe, drop = EveryPosition(model), DRAWING, inputs.get("drop_text")
            if drop is not None:
                ids = torch.where(drop[:, None], inputs["uncond_ids"], ids)
                attention = torch.where(drop[:, None], inputs["uncond_attention_mask"], attention)
        loss, parts = sft_loss(model, self.family, ids, inputs["loss_mask"], attention, recipe=recipe,
                               segment_ids=inputs.get("segment_ids"), t=inputs.get("t"), masked=inputs.get("masked"),
                               normaliser=num_items_in_batch, sp=sp, return_parts=True)
        if sp is not None:
            loss = loss * sp.size  # the group's shares add up to the loss; DDP averages over every process
        if self.model.training and self.state.global_step % max(self.args.logging_steps, 1) == 0:
            self._masked_fraction = float(parts["n_masked"].sum() / parts["answer_len"].sum().clamp(min=1))
        if self.model.training and "causal_loss" in parts:  # the joint loss's two terms, summed until the next log
            if not self._terms:
                self._terms_since = self.state.global_step
            for key in ("diffusion_loss", "causal_loss"):
                self._terms[key] = self._terms.get(key, 0.0) + parts[key]
        return (loss, None) if return_outputs else loss

    def log(self, logs, *args, **kwargs):
        """Training logs gain the masked fraction and, for a joint loss, its unweighted terms (each the mean per step
        over the window and the processes, as ``loss`` is)."""
        if "loss" in logs and hasattr(self, "_masked_fraction"):
            logs["masked_fraction"] = round(self._masked_fraction, 4)
        if "loss" in logs and self._terms:
            steps = max(self.state.global_step - self._terms_since, 1)
            for key, value in self._terms.items():
                logs[key] = round(float(self.accelerator.reduce(value, "mean")) / steps, 4)
            self._terms = {}
        super().log(logs, *args, **kwargs)


class StopAtLoss(TrainerCallback):
    """Ends training at the first logged training loss (the mean over its ``logging_steps``) below ``target``: a
    small model whose loss falls off a plateau at a step no one can predict (a different one on each CPU) stops just
    past the same point, whatever that step is. The decision reads only the logged window, so a resume (at a
    checkpoint on a logging boundary) stops where the uninterrupted run would."""

    def __init__(self, target: float):
        self.target = target

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and logs["loss"] < self.target:  # the logged loss is every process's mean
            if state.is_world_process_zero:
                print(f"stop_at_loss: training loss {logs['loss']:.4f} < {self.target} at step {state.global_step}")
            control.should_training_stop = True
