"""The offline preference trainer (VRPO): transformers' ``Trainer`` on fixed (prompt, chosen, rejected) pairs, the
algorithm (``dare.algos.vrpo``) supplying the noise, the ELBOs and the loss. No rollout, no reward.

One optimiser step = ``per_device_train_batch_size x gradient_accumulation_steps x ranks`` pairs (shuffled per epoch,
an incomplete last step dropped, so every step averages the same number of pairs). For each micro-batch: the masks of
each pair are drawn from a local generator seeded by (seed, step, pair index) — never the global RNG, and
independent of the rank, the micro-batch size and the padding; the reference's ELBOs under ``no_grad``, then the
policy's with gradient, on the SAME masks (antithetic); the loss is the micro-batch's mean over pairs (Trainer
divides by the accumulation). Validation scores the held-out pairs the same way with masks seeded by the pair index
only, so every evaluation sees the same noise: ``eval_margin`` (0 at the start, by antithesis) and its standard error
over the pairs ``eval_margin_se``, ``eval_accuracy``,
``eval_loss``, rewards and ELBOs of chosen and rejected.
"""

import hashlib
import math
from collections import defaultdict

import torch
from accelerate.utils import gather_object
from transformers import Trainer

from ..data.preference import PreferenceCollator
from .checkpoints import CompleteCheckpoints
from .distributed import ShardedTraining
from .logs import TrainerLogs
from .reference import frozen_copy, reference
from .rl import RepeatSampler


class PreferenceTrainer(TrainerLogs, CompleteCheckpoints, ShardedTraining, Trainer):
    """``per_device_train_batch_size`` = pairs per micro-batch (2 rows each: chosen and rejected)."""

    def __init__(self, model, args, *, algorithm, family, processing_class, train_pairs: list[dict], data,
                 eval_pairs: list[dict] | None = None, console: str = "compact", sequence_parallel: int = 1,
                 pack: int = 0):
        self.sequence_parallel = sequence_parallel  # training's ELBOs (ShardedTraining); evaluation runs whole rows
        super().__init__(model=model, args=args, train_dataset=train_pairs, eval_dataset=eval_pairs or None,
                         data_collator=PreferenceCollator(processing_class, family, data),
                         processing_class=processing_class, console=console)
        self.algorithm, self.family = algorithm, family  # checked by train_rl.py before the weights load
        self.scoring_family = self.scoring(family, pack)
        self.loss_is_scaled_for_ga = False  # a micro-batch mean: Trainer divides by the accumulation steps
        self.ref_model = None if hasattr(model, "disable_adapter") else frozen_copy(self)
        self._meters = defaultdict(lambda: [0.0, 0.0])

    def step_plan(self) -> str:
        """One step's work, for the line a run starts with (``run_plan``)."""
        return f"{self.algorithm.name}, {self._get_train_sampler().prompts_per_step} preference pairs"

    def _get_train_sampler(self, train_dataset=None):
        pairs_per_step = self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps
        return RepeatSampler(len(self.train_dataset), pairs_per_step * self.data_parallel[1], 1, self.args.seed)

    def floating_point_ops(self, inputs):
        return 0

    def _seed(self, *parts) -> int:
        key = repr((self.args.seed,) + parts).encode()
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1

    def pair_losses(self, model, inputs: dict, *key) -> tuple[torch.Tensor, dict]:
        """Per-pair losses and metrics of a collated micro-batch; its noise is seeded by ``key`` and the pair index."""
        generators = [torch.Generator().manual_seed(self._seed(*key, int(i))) for i in inputs["index"]]
        noise = self.algorithm.corrupt(self.family, inputs, generators + generators)  # chosen, then rejected draws
        family = self.scoring_family if model.training else self.family  # evaluation: whole rows, as they are
        with torch.no_grad(), reference(self.ref_model, self.accelerator.unwrap_model(model)) as ref:
            baseline = self.algorithm.elbo(ref, family, inputs, noise)  # first: no graph alive meanwhile
        policy = self.algorithm.elbo(model, family, inputs, noise)
        losses, stats = self.algorithm.loss(policy, baseline)
        return losses, {**stats, "truncated": inputs["truncated"]}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        losses, stats = self.pair_losses(model, inputs, "train", self.state.global_step)
        for name, values in stats.items():
            self._meters[name][0] += float(values.float().sum())
            self._meters[name][1] += values.numel()
        loss = losses.mean()
        return (loss, None) if return_outputs else loss

    def log(self, logs: dict, start_time=None):
        if "loss" in logs and self._meters:
            merged = defaultdict(lambda: [0.0, 0.0])
            for meters in gather_object([dict(self._meters)]):
                for name, (total, count) in meters.items():
                    merged[name][0] += total
                    merged[name][1] += count
            self._meters.clear()
            logs.update({name: round(total / count, 6) for name, (total, count) in sorted(merged.items()) if count})
        super().log(logs, start_time)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        """Mean loss, margin, accuracy, rewards and ELBOs over the held-out pairs (fixed noise per pair)."""
        model, totals, count, margin_sq = self.model, defaultdict(float), 0, 0.0
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad(), self.compute_loss_context_manager():
                for inputs in self.get_eval_dataloader(eval_dataset):
                    inputs = self._prepare_inputs(inputs)
                    losses, stats = self.pair_losses(model, inputs, "eval")
                    stats = self.accelerator.gather_for_metrics({**stats, "loss": losses})
                    count += len(stats["loss"])
                    for name, values in stats.items():
                        totals[name] += float(values.float().sum())
                    margin_sq += float(stats["margin"].double().square().sum())
        finally:
            model.train(was_training)
        metrics = {f"{metric_key_prefix}_{name}": total / max(count, 1) for name, total in sorted(totals.items())}
        if count > 1:  # the margin's standard error over the pairs: is a change in it more than noise?
            mean = totals["margin"] / count
            metrics[f"{metric_key_prefix}_margin_se"] = math.sqrt(max(margin_sq / count - mean ** 2, 0.0) / (count - 1))
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics
