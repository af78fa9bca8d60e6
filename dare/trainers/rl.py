"""The GRPO-family trainer: transformers' ``Trainer`` in TRL's style, delegating every per-algorithm choice to a
``dare.algos`` algorithm.

Why not subclass trl's GRPOTrainer: its generation, log-prob and loss paths are autoregressive throughout (causal
shift, vLLM, per-token logps from one causal forward), so a diffusion version would override nearly all of it.
We keep what makes TRL's loop right instead: the dataloader repeats each step's prompts once per micro-batch of
every inner iteration; the first micro-batch of a cycle rolls out, scores and buffers the whole batch (noise, old
and reference log-probs included); the rest train from the buffer. Trainer provides accumulation, clipping,
schedulers, mixed precision, DDP/FSDP/DeepSpeed, logging, ``report_to`` and checkpoints.

One cycle = ``num_iterations`` passes over one rollout batch, each ``mini_batches`` optimiser steps on a slice
of it. The loss of each micro-batch is divided by the normaliser of its whole mini-batch (all ranks), so it does
not depend on how the mini-batch is split. Rollout and noise seeds derive from (seed, rollout index, inner
iteration, rank), so a resumed run replays exactly.
"""

import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from accelerate.utils import gather_object
from torch.utils.data import Sampler
from transformers import Trainer

from ..data.images import is_drawing, number_pictures, pictured_prompt, used_pictures
from ..engines import InProcessEngine
from ..engines.base import Rollout, decode_completions
from ..rewards.base import RewardResult
from .checkpoints import CompleteCheckpoints
from .distributed import ShardedTraining
from .logs import RolloutProgress, TrainerLogs
from .reference import frozen_copy, reference
from .rollout_modes import get_rollout_mode
from .validation import eval_policy, generation_metrics
from .value import ValueModelTraining


def signal_groups(signal: list[bool], keep: int) -> tuple[list[int], int]:
    """The ``keep`` groups to train on, in rollout order: those with a signal (``signal[g]``) first, then groups
    without one to fill the batch; and how many of those it took."""
    chosen = [g for g, v in enumerate(signal) if v][:keep]
    flat = [g for g, v in enumerate(signal) if not v][:keep - len(chosen)]
    return sorted(chosen + flat), len(flat)


class RepeatSampler(Sampler):
    """Prompt indices shuffled per epoch, cut into steps of ``prompts_per_step`` (all ranks together), each step's
    block yielded ``repeat`` times in a row (one per micro-batch of each inner iteration). Not TRL's RepeatSampler:
    its order comes from one generator advanced epoch after epoch, so a run resumed in a later epoch would see
    another order; here each epoch's order is a function of (seed, epoch) alone."""

    def __init__(self, size: int, prompts_per_step: int, repeat: int, seed: int):
        if size < prompts_per_step:
            raise ValueError(f"{size} training prompts cannot fill one step of {prompts_per_step} prompts")
        self.size, self.prompts_per_step, self.repeat, self.seed, self.epoch = size, prompts_per_step, repeat, seed, 0

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def order(self, epoch: int) -> list[int]:
        return torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()

    def __iter__(self):
        order = self.order(self.epoch)
        for start in range(0, self.size - self.prompts_per_step + 1, self.prompts_per_step):
            for _ in range(self.repeat):
                yield from order[start:start + self.prompts_per_step]

    def prompts_of(self, step: int) -> list[int]:
        """The prompts (all ranks) of the run's ``step``-th block, counted over epochs."""
        epoch, start = divmod(step, self.size // self.prompts_per_step)
        return self.order(epoch)[start * self.prompts_per_step:(start + 1) * self.prompts_per_step]

    def __len__(self):
        return self.size // self.prompts_per_step * self.prompts_per_step * self.repeat


@dataclass
class Decoded:
    """One rollout batch as decoded and rewarded (``rows``: its data rows, one per completion, prompt-major)."""

    rollout: Rollout
    rows: list[dict]
    results: list
    version: int  # the optimiser step whose weights decoded it
    seconds: tuple[float, float]  # decoding, reward
    dropped: tuple[int, int, int] | None = None  # dynamic sampling: groups dropped, kept without a signal, rounds
    signal: list[bool] | None = None  # dynamic sampling: whether each group of the batch has a signal


class DiffusionRLTrainer(TrainerLogs, ValueModelTraining, CompleteCheckpoints, ShardedTraining, Trainer):
    """``per_device_train_batch_size`` = prompts per rank per step; ``gradient_accumulation_steps`` = micro-batches
    the ``prompts x num_generations`` completions are split into, times the algorithm's streams. ``completions.jsonl``
    numbers each rollout by the optimiser step it is made for (the first, with inner iterations): the step whose log
    holds its rewards. The algorithm, its rollout decoding (``sampling``, as ``rollout_sampling`` returned it), the
    engine server and the batch shape come checked (``train_rl.py``, before any weights load). ``rollout_mode``:
    when rollouts decode (``dare/trainers/rollout_modes.py``: ``sync``, or ``ahead`` of training on a copy)."""

    jsonl_logs = ("completions.jsonl",)  # trimmed to the resumed step (dare/trainers/logs.py)

    def __init__(self, model, args, *, algorithm, family, processing_class, train_rows: list[dict], rewards,
                 sampling, num_generations: int, eval_rows: list[dict] | None = None, eval_sampling=None,
                 rollout_batch_size: int = 64, reward_workers: int = 8, log_completions: int = 0,
                 console: str = "compact", sequence_parallel: int = 1, engine=None, pack: int = 0,
                 truncated_is_wrong: bool = False, rollout_mode: str = "sync", pictures=None):
        self.sequence_parallel = sequence_parallel  # the scoring passes' (ShardedTraining); rollouts run whole
        super().__init__(model=model, args=args, train_dataset=train_rows, eval_dataset=eval_rows or None,
                         data_collator=lambda rows: rows, processing_class=processing_class, console=console)
        self.algorithm, self.family, self.rewards, self.pictures = algorithm, family, rewards, pictures
        self.scoring_family = self.scoring(family, pack)
        self.sampling, self.eval_sampling = sampling, eval_sampling
        self.streams = algorithm.streams(family, sampling)
        self.num_generations, self.rollout_batch_size = num_generations, rollout_batch_size
        # what decodes the rollouts and validation: DARE's samplers on the policy, or an engine server (SGLang)
        self.engine = engine or InProcessEngine(processing_class, family, rollout_batch_size)
        self.reward_workers, self.log_completions = reward_workers, log_completions
        self.truncated_is_wrong = truncated_is_wrong  # a completion without a stop token scores 0
        self.loss_is_scaled_for_ga = True  # every micro-batch loss is already divided by the whole batch's normaliser
        lora = hasattr(model, "disable_adapter")
        self.ref_model = frozen_copy(self) if algorithm.needs_reference and not lora else None
        self.make_value_model(algorithm, family)  # when the algorithm declares one (dare/trainers/value.py)
        self._buffer, self._micro, self._meters = [], 0, defaultdict(lambda: [0.0, 0.0, 0.0])
        self._cycle_start = None
        self.rollouts = get_rollout_mode(rollout_mode)(self)

    # -- data ---------------------------------------------------------------------------------------------------
    def step_plan(self) -> str:
        """One step's work, for the line a run starts with (``run_plan``)."""
        prompts = self._get_train_sampler().prompts_per_step
        drawings = all(map(is_drawing, self.train_dataset))  # MaskGIT draws the picture's codes, not gen_length
        what = "drawings" if drawings else f"completions of up to {self.sampling.gen_length} tokens"
        return f"{self.algorithm.name}, {prompts} prompts x {self.num_generations} {what}"

    def _get_train_sampler(self, train_dataset=None):
        repeat = self.args.gradient_accumulation_steps * self.algorithm.cycle
        return RepeatSampler(len(self.train_dataset), self.args.per_device_train_batch_size * self.data_parallel[1],
                             repeat, self.args.seed)

    def rows_of(self, index: int) -> list[dict]:
        """This process's training rows of rollout ``index``: what the data loader will give (accelerate deals each
        process its consecutive slice of the step's prompts)."""
        share, rank = self.args.per_device_train_batch_size, self.data_parallel[0]
        prompts = self._get_train_sampler().prompts_of(index)[rank * share:(rank + 1) * share]
        return [self.train_dataset[i] for i in prompts]

    def _micro_batch(self, rows):
        """The buffered micro-batch and stream for this call; the first call of a cycle rolls out the whole batch."""
        algo, micro = self.algorithm, self._micro % self.args.gradient_accumulation_steps
        self._micro += 1
        position = self.state.global_step % algo.cycle
        if micro == 0 and position == 0:
            self._buffer = self._rollout_batch(rows)
        iteration, mini = divmod(position, algo.mini_batches)
        part, stream = divmod(micro, self.streams)
        return {"batch": self._buffer[mini * self.args.gradient_accumulation_steps // self.streams + part],
                "iteration": iteration, "mini": mini, "stream": stream}

    def _prepare_inputs(self, inputs):
        return inputs  # already on the device (built by _rollout_batch)

    def floating_point_ops(self, inputs):
        return 0

    # -- one rollout batch --------------------------------------------------------------------------------------
    def decode(self, policy, rows: list[dict], index: int, version: int) -> Decoded:
        """Rollout batch ``index`` of ``rows`` decoded by ``policy`` (the weights of optimiser step ``version``) and
        rewarded (with dynamic sampling, the groups that train: ``Algorithm.dynamic_sampling``). Thread-safe: it
        records no metric."""
        algo, G, dynamic = self.algorithm, self.num_generations, self.algorithm.dynamic_sampling
        start, reward_s = time.perf_counter(), 0.0
        pad = math.ceil(dynamic.extra * len(rows)) if dynamic.mode == "pad" else 0
        batch_rows = rows + (self._refill_rows(pad, index, 0) if pad else [])
        parts, signal, rounds = [], [], 0
        with self.compute_loss_context_manager(), self.engine.serving(policy, version) as engine:
            while True:
                expanded = [r for r in batch_rows for _ in range(G)]
                score = self._scorer(expanded, G)
                label = f"rollout {index + 1}" + (f" round {rounds + 1}" if rounds else "") + \
                    f" ({len(expanded)} completions)"
                with RolloutProgress(label, policy, self.is_world_process_zero()):
                    rollout = algo.rollout(engine, [pictured_prompt(r) for r in batch_rows], G, self.sampling,
                                           self._seed("rollout", index, *([rounds] if rounds else [])),
                                           rows=batch_rows, score=score)
                scored = time.perf_counter()
                results = self._truncated_wrong(rollout, score(rollout.texts, range(len(expanded))))
                reward_s += time.perf_counter() - scored
                parts.append((rollout, expanded, results))
                if dynamic.mode == "off":
                    break
                signal += dynamic.signal(torch.tensor([r.score for r in results]),
                                         torch.tensor([r.acc for r in results]), G).tolist()
                if dynamic.mode != "resample" or not self._still_short(sum(signal) < len(rows)) \
                        or rounds == dynamic.rounds:
                    break
                rounds += 1
                batch_rows = self._refill_rows(math.ceil(dynamic.extra * len(rows)), index, rounds)
        rollout = Rollout.join([p[0] for p in parts], self.family.pad_id)
        expanded, results = [r for p in parts for r in p[1]], [r for p in parts for r in p[2]]
        dropped = None
        if dynamic.mode == "drop":
            dropped = (sum(not s for s in signal), 0, 0)
        elif dynamic.mode != "off":  # the groups with a signal first, as many as the batch holds
            groups, flat = signal_groups(signal, len(rows))
            dropped = (len(signal) - len(groups), flat, rounds)
            picks = [g * G + k for g in groups for k in range(G)]
            rollout = rollout.select(picks) if len(picks) < len(expanded) else rollout
            expanded, results = [expanded[i] for i in picks], [results[i] for i in picks]
            signal = [signal[g] for g in groups]
        decoded_s = time.perf_counter() - start - reward_s
        return Decoded(rollout, expanded, results, version, (decoded_s, reward_s), dropped, signal or None)

    def _truncated_wrong(self, rollout, results: list) -> list:
        """With ``truncated_is_wrong``, a completion without a stop token scores 0 and is not correct (TraceRL's and
        DiRL's rule: a response cut off by the length limit is wrong, whatever it holds)."""
        if not self.truncated_is_wrong:
            return results
        stopped = rollout.stopped(self.family.stop_ids).tolist()
        return [r if done else RewardResult(0.0, 0.0, r.pred) for r, done in zip(results, stopped, strict=True)]

    def _still_short(self, short: bool) -> bool:
        """Whether any process still lacks groups with a signal: every process decodes the same number of rounds
        (a sharded policy's forward is collective). A rollout decoded ahead runs on its own copy: no collective."""
        if self.rollouts.lag or not torch.distributed.is_initialized():
            return short
        flag = torch.tensor(float(short), device=self.accelerator.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _rollout_batch(self, rows: list[dict]) -> list[dict]:
        algo, family, G = self.algorithm, self.family, self.num_generations
        index, now = self.state.global_step // algo.cycle, time.perf_counter()
        if self._cycle_start is not None:  # the previous cycle's wall time, everything included
            self._add("time/cycle", now - self._cycle_start)
        self._cycle_start = now
        decoded = self.rollouts.take(rows, index)
        rollout, expanded, results = decoded.rollout, decoded.rows, decoded.results
        scored = time.perf_counter()
        device = rollout.completion_ids.device
        lists = None
        if rollout.pictures is not None:  # placeholders numbered over the batch's pictures: rows follow make_batch
            ids, lists = number_pictures(rollout.prompt_ids, rollout.pictures)
            rollout = dataclasses.replace(rollout, prompt_ids=ids)
        scores = torch.tensor([r.score for r in results], dtype=torch.float32, device=device)
        if decoded.dropped is not None:
            self._add("rollout/groups_dropped", decoded.dropped[0])
            self._add("rollout/groups_without_signal", decoded.dropped[1])
            self._add("rollout/dynamic_rounds", decoded.dropped[2])

        def reward_of(ids: torch.Tensor, picks: list[int]) -> torch.Tensor:
            texts = decode_completions(self.processing_class, family, ids)[1]
            found = self.rewards.score(texts, [expanded[i] for i in picks], self.reward_workers)
            return torch.tensor([r.score for r in found], dtype=torch.float32, device=device)

        batch = algo.make_batch(family, rollout, scores, G, reward_of, self.state.global_step, self.sampling)
        if algo.dynamic_sampling.mode == "drop":  # the groups without a signal leave the loss
            out = ~torch.tensor(decoded.signal, device=device).repeat_interleave(G)
            batch["advantages"] = batch["advantages"].masked_fill(out.view(-1, *[1] * (batch["advantages"].dim() - 1)),
                                                                  0.0)
            batch["loss_mask"] = batch["loss_mask"].masked_fill(out[:, None], 0)
        parts = self._split(batch)
        for part in parts if lists or rollout.reading else ():  # each micro-batch's pictures, read once per rollout
            inputs = used_pictures(self.pictures, part["prompt_ids"], lists) if lists else rollout.reading
            part["pictures"] = {name: value.to(device) for name, value in inputs.items()}
        for slot in range(algo.num_iterations if algo.resample_noise else 1):
            generator = torch.Generator(device).manual_seed(self._seed("noise", index, slot))
            # drawn on the whole batch, then split: the noise does not depend on the micro-batch size
            noise = algo.corrupt(family, batch, generator, self.sampling, iteration=slot)
            for part, piece in zip(parts, self._split(noise) if noise else [{}] * len(parts), strict=True):
                part.setdefault("noise", []).append(piece)
            if not noise:  # a noise-free estimate (trajectory, tree): one slot, old/reference scored once
                break
        # after the noise: a loss averaged over the tokens its noise hides counts them (MaskGRPO)
        counts = torch.stack([algo.normaliser(family, part, self.sampling).float().reshape(-1) for part in parts])
        counts = self.accelerator.reduce(counts.view(algo.mini_batches, -1, counts.shape[-1]).sum(1), "sum")
        counts = counts / self.accelerator.num_processes  # DDP averages gradients over ranks
        self._normalisers = [c[0] if c.numel() == 1 else c for c in counts]  # one per mini-batch
        # the ratio's denominator from the policy that decoded: inner steps, or a rollout decoded ahead of training
        old = algo.needs_old or (self.rollouts.lag > 0 and algo.uses_ratio)
        if old or algo.needs_reference:
            self._score_old_and_reference(parts, old)
        algo.after_scoring(parts, G)
        scored_old = time.perf_counter()
        self.rollouts.next(index)  # ahead: the next batch decodes from here on
        if self.value_model is not None:
            self.fit_value(parts)
            self._add("time/value", time.perf_counter() - scored_old)
        self._add("rollout/policy_lag", self.state.global_step - decoded.version)
        self._record_rollout(rollout, expanded, results, scores, *decoded.seconds, scored_old - scored)
        return parts

    def _scorer(self, expanded: list[dict], group_size: int):
        """``score(texts, picks)``: the rewards of ``texts`` as completions of rows ``expanded[picks]``, each (prompt,
        text) scored once per rollout (an algorithm that scores mid-rollout, and the trainer after it, share them)."""
        done = {}

        def score(texts, picks):
            keys = [(i // group_size, text) for text, i in zip(texts, picks, strict=True)]
            todo = {key: i for key, i in zip(keys, picks, strict=True) if key not in done}
            found = self.rewards.score([text for _, text in todo], [expanded[i] for i in todo.values()],
                                       self.reward_workers)
            done.update(zip(todo, found, strict=True))
            return [done[key] for key in keys]
        return score

    def _refill_rows(self, prompts: int, index: int, round_: int) -> list[dict]:
        """Dynamic sampling's ``prompts`` extra prompts for round ``round_`` of rollout ``index``: a fixed draw of the
        training rows (a resumed run draws the same)."""
        order = torch.randperm(len(self.train_dataset), generator=torch.Generator().manual_seed(
            self._seed("refill", index, *([round_] if round_ else []))))
        return [self.train_dataset[i] for i in order[:prompts].tolist()]

    @torch.no_grad()
    def _score_old_and_reference(self, parts: list[dict], old: bool):
        """Log-likelihoods under the rollout policy (the "old" policy of every inner iteration, ``old``) and the
        reference, on the same noise and micro-batches the gradient passes will use."""
        algo, family = self.algorithm, self.scoring_family
        with eval_policy(self) as policy, self.compute_loss_context_manager():
            rolled = self.rollouts.rollout_policy(policy)
            for part in parts:  # each model handed the part's pictures once (their features computed once)
                if old:
                    reading = self._reading(rolled, part)
                    part["old"] = [algo.score(reading, family, part, noise, self.sampling).logp
                                   for noise in part["noise"]]
                if algo.needs_reference:
                    with reference(self.ref_model, policy) as ref:
                        reading = self._reading(ref, part)
                        part["ref"] = [algo.score(reading, family, part, noise, self.sampling).logp
                                       for noise in part["noise"]]

    def _reading(self, model, batch: dict, fixed: bool = True):
        """``model`` handed the micro-batch's pictures (``fixed``: their features computed once, without gradients),
        or ``model`` itself for a batch without any."""
        inputs = batch.get("pictures")
        return self.pictures.wrap(model, **inputs, fixed=fixed) if inputs else model

    def _split(self, value):
        """One piece per micro-batch of every mini-batch, along the row dimension (tensors, or dicts of them)."""
        pieces = self.args.gradient_accumulation_steps // self.streams * self.algorithm.mini_batches
        if isinstance(value, dict):
            chunks = zip(*(self._split(v) for v in value.values()), strict=True)
            return [dict(zip(value, chunk, strict=True)) for chunk in chunks]
        return value.tensor_split(pieces)

    def _seed(self, *parts) -> int:
        key = repr((self.args.seed, self.data_parallel[0]) + parts).encode()  # a sequence-parallel group: one seed
        return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1

    # -- loss ---------------------------------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch=None):
        inputs = self._micro_batch(inputs)
        start = time.perf_counter()
        loss = super().training_step(model, inputs, num_items_in_batch)
        self._add("time/train", time.perf_counter() - start, 1 / self.args.gradient_accumulation_steps)
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        algo = self.algorithm
        slot = min(inputs["iteration"], len(inputs["batch"]["noise"]) - 1)  # one slot unless noise is redrawn
        model = self._reading(model, inputs["batch"], fixed=False)  # the tower and projector get their gradients
        loss, stats = algo.step_loss(model, self.scoring_family, inputs["batch"], slot, inputs["stream"],
                                     self._normalisers[inputs["mini"]], self.sampling)
        for name, (total, count) in stats.items():
            self._add(name, float(total), float(count))
        return (loss, None) if return_outputs else loss

    # -- metrics ------------------------------------------------------------------------------------------------
    def _add(self, name: str, total: float, count: float = 1.0, square: float = 0.0):
        meter = self._meters[name]
        meter[0] += total
        meter[1] += square
        meter[2] += count

    def _add_samples(self, name: str, values: torch.Tensor):
        values = values.double()
        self._add(name, float(values.sum()), values.numel(), float((values * values).sum()))

    def _record_rollout(self, rollout, rows, results, scores, rollout_s, reward_s, score_s):
        lengths = rollout.completion_mask.sum(-1).float()
        self._add_samples("reward", scores)
        self._add_samples("acc", torch.tensor([r.acc for r in results]))
        for source in sorted({r["data_source"] for r in rows}):
            pick = [i for i, r in enumerate(rows) if r["data_source"] == source]
            self._add_samples(f"reward/{source}", scores[pick])
            self._add_samples(f"acc/{source}", torch.tensor([results[i].acc for i in pick]))
        self._add_samples("completion_length", lengths)
        if len(scores) % self.num_generations == 0:  # groups whose rewards all tie: no group advantage
            spread = scores.view(-1, self.num_generations)
            flat = (spread.max(-1).values == spread.min(-1).values).double()
            self._add("rollout/flat_groups", float(flat.sum()), flat.numel())
        self._add_samples("completion_unfinished", (~rollout.stopped(self.family.stop_ids)).float())
        for name, seconds in (("time/rollout", rollout_s), ("time/reward", reward_s), ("time/old_ref_logp", score_s)):
            self._add(name, seconds)
        self._add("rollout/tokens_per_s", rollout.tokens_per_second)
        if self.engine.sync_seconds:  # an engine server's copy of the policy's weights
            self._add("time/weight_sync", self.engine.sync_seconds)
        self._add("rollout/nfe", rollout.nfe)
        for name, (total, count) in rollout.stats.items():
            self._add(f"rollout/{name}", float(total), float(count))
        if self.log_completions and self.is_world_process_zero():
            with open(os.path.join(self.args.output_dir, "completions.jsonl"), "a") as f:
                for i in range(min(self.log_completions, len(rows))):
                    f.write(json.dumps({"step": self.state.global_step + 1, "source": rows[i]["data_source"],
                                        "prompt": rows[i]["prompt"][-1]["content"], "completion": rollout.texts[i],
                                        "ground_truth": rows[i]["ground_truth"], "reward": results[i].score}) + "\n")

    def log(self, logs: dict, start_time=None):
        if "loss" in logs and self.model.training:
            merged = defaultdict(lambda: [0.0, 0.0, 0.0])
            for meters in gather_object([dict(self._meters)]):
                for name, values in meters.items():
                    merged[name] = [a + b for a, b in zip(merged[name], values, strict=True)]
            self._meters.clear()
            for name, (total, square, count) in sorted(merged.items()):
                if count:
                    mean = total / count
                    logs[name] = round(mean, 6)
                    if square:
                        logs[f"{name}_std"] = round(max(square / count - mean * mean, 0.0) ** 0.5, 6)
            self._warn_flat(logs.get("rollout/flat_groups"))
        super().log(logs, start_time)

    FLAT_WARNING = 0.5  # the share of tied groups that earns a warning (once per run)
    _warned_flat = False

    def _warn_flat(self, share: float | None) -> None:
        """Say once when most groups tie: their advantages are 0, so most of the batch teaches nothing."""
        if share is None or share < self.FLAT_WARNING or self._warned_flat or not self.is_world_process_zero():
            return
        from tqdm.auto import tqdm

        self._warned_flat = True
        tqdm.write(f"warning: step {self.state.global_step}: {share:.0%} of the rollout's groups have every "
                   "completion scored alike (no group advantage: they teach nothing; logged as rollout/flat_groups). "
                   "A start that solves or fails every prompt: more SFT, a denser reward, a higher temperature or "
                   "more --num-generations", file=sys.stderr)

    def train(self, *args, **kwargs):
        try:
            return super().train(*args, **kwargs)
        finally:
            self.rollouts.close()
            self.engine.close()  # an engine server's processes and GPU memory

    def _save_optimizer_and_scheduler(self, output_dir):
        super()._save_optimizer_and_scheduler(output_dir)
        self.rollouts.save(output_dir)  # before the checkpoint is marked complete

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.rollouts.load(resume_from_checkpoint)

    # -- validation ---------------------------------------------------------------------------------------------
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        self.rollouts.settle()  # the engine serves one policy at a time
        metrics = generation_metrics(self, eval_dataset or self.eval_dataset, self.eval_sampling, self.rewards,
                                     self.reward_workers, self.rollout_batch_size, metric_key_prefix, self.engine)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics
