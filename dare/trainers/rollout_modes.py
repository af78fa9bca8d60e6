"""When a trainer's rollouts decode, against its optimiser steps: a mode chosen by ``train_rl.py --rollout-mode``.

- ``sync`` (default): each rollout batch decodes with the policy it trains, then trains: on-policy.
- ``ahead``: while the cycle of rollout k trains, a copy of the policy as it was when that cycle began decodes
  rollout k + 1 in a background thread (and its rewards are scored there): one cycle off-policy. The copy is kept
  until rollout k + 1 has been scored, so its "old" log-likelihoods, the ratio's denominator, come from the policy that
  produced the samples, and the clipped ratio corrects the lag (the trainer scores them for every algorithm with a
  ratio, also with one inner iteration, where ``sync`` takes the ratio as exactly 1). Ratio-free algorithms (wd1,
  spg, dmpo) train on one-cycle-old samples as they are. Rollout 0 decodes on-policy. The copy's weights go into
  every checkpoint (``rollout_policy.safetensors``): a resumed run decodes its first rollout with them, the tokens
  the uninterrupted run decoded. It costs a second copy of the weights; a process's copy decodes beside training, so
  it pays where decoding and training do not share one compute unit (an engine server on its own GPU, free cores).
  Logged: ``time/rollout_wait`` (the trainer waiting for the rollout), ``rollout/policy_lag`` (optimiser steps
  between the decoding policy and the trained one).

A mode is ``take(rows, index) -> Decoded`` (rollout batch ``index`` of the training ``rows``),
``rollout_policy(policy)`` (the model that decoded it, for the old log-likelihoods; ``policy``: the trained one),
``next(index)`` (called once batch ``index`` is scored), ``settle`` (finish background work), ``save``/``load`` (its
part of a checkpoint) and ``close``.
"""

import copy
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch
from safetensors.torch import load_model, save_model

from .distributed import env_flag
from .validation import eval_policy

WEIGHTS, VERSION = "rollout_policy.safetensors", "rollout_policy.json"


class OnPolicy:
    """``sync``: decode with the policy being trained, when its batch is due."""

    lag = 0  # cycles between the decoding policy and the trained one

    def __init__(self, trainer):
        self.trainer = trainer

    @staticmethod
    def check(args, engine_server) -> None:
        """Refuse, before the weights load, a run this mode cannot serve."""

    def take(self, rows: list[dict], index: int):
        with eval_policy(self.trainer) as policy:
            return self.trainer.decode(policy, rows, index, self.trainer.state.global_step)

    def rollout_policy(self, policy):
        return policy

    def next(self, index: int) -> None:
        pass

    def settle(self) -> None:
        """Let background decoding finish (before the trainer's engine serves something else: validation)."""

    def save(self, folder: str) -> None:
        pass

    def load(self, folder: str) -> None:
        pass

    def close(self) -> None:
        pass


class OneStepAhead(OnPolicy):
    """``ahead``: decode the next batch on a copy of the policy while this one trains (see the module docstring)."""

    lag = 1

    def __init__(self, trainer):
        super().__init__(trainer)
        policy = trainer.accelerator.unwrap_model(trainer.model)
        self.copy = copy.deepcopy(policy).eval().requires_grad_(False)
        self.version = None  # the optimiser step whose weights the copy holds (None: not yet set)
        self.pending = None  # (index, rows, future) of the batch decoding in the background
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="dare-rollout")

    @staticmethod
    def check(args, engine_server) -> None:
        if env_flag("ACCELERATE_USE_FSDP") or env_flag("ACCELERATE_USE_DEEPSPEED"):
            raise ValueError("--rollout-mode ahead keeps a whole copy of the policy on each process: use one process "
                             "or DDP (not FSDP or DeepSpeed)")
        if args.sequence_parallel > 1:
            raise ValueError("--rollout-mode ahead needs --sequence-parallel 1 (each process decodes its own rows)")
        if getattr(engine_server, "colocated", False):
            raise ValueError("--rollout-mode ahead decodes while the policy trains: an engine colocated with training "
                             "(one that releases its memory between rollouts) cannot; give the engine its own GPU")

    def take(self, rows, index):
        trainer = self.trainer
        if self.pending is None:  # rollout 0, or the first after a resume: decoded now
            if self.version is None:
                self.refresh()
            return trainer.decode(self.copy, rows, index, self.version)
        ahead, expected, future = self.pending
        self.pending = None
        start = time.perf_counter()
        decoded = future.result()
        trainer._add("time/rollout_wait", time.perf_counter() - start)
        if ahead != index or [r["prompt"] for r in expected] != [r["prompt"] for r in rows]:
            raise RuntimeError(f"--rollout-mode ahead decoded other prompts for rollout {index} than the data loader "
                               "gives: the prefetch does not follow this launch's sharding (use --rollout-mode sync)")
        return decoded

    def rollout_policy(self, policy):
        return self.copy

    def next(self, index):
        trainer = self.trainer
        self.refresh()
        if (index + 1) * trainer.algorithm.cycle >= trainer.state.max_steps:
            return  # the run ends before that rollout would train
        rows = trainer.rows_of(index + 1)
        self.pending = (index + 1, rows, self.pool.submit(self.decode_in_background, rows, index + 1, self.version))

    def settle(self):
        if self.pending is not None:
            self.pending[2].exception()  # waits; its result (or error) stays for take

    def decode_in_background(self, rows, index, version):
        with torch.no_grad():  # grad mode is per thread
            return self.trainer.decode(self.copy, rows, index, version)

    def refresh(self) -> None:
        """The copy takes the policy's current weights."""
        trainer = self.trainer
        policy = trainer.accelerator.unwrap_model(trainer.model)
        self.copy.load_state_dict(policy.state_dict())
        self.version = trainer.state.global_step

    def save(self, folder):
        if self.version is not None and self.trainer.args.should_save:
            save_model(self.copy, os.path.join(folder, WEIGHTS))
            with open(os.path.join(folder, VERSION), "w") as f:
                json.dump({"version": self.version}, f)

    def load(self, folder):
        path = os.path.join(folder, WEIGHTS)
        if os.path.exists(path):  # else a sync run's checkpoint: the first rollout decodes with the resumed weights
            load_model(self.copy, path)
            with open(os.path.join(folder, VERSION)) as f:
                self.version = json.load(f)["version"]

    def close(self):
        self.pending = None
        self.pool.shutdown(wait=True, cancel_futures=True)


ROLLOUT_MODES = {"sync": OnPolicy, "ahead": OneStepAhead}


def get_rollout_mode(name: str) -> type[OnPolicy]:
    if name not in ROLLOUT_MODES:
        raise ValueError(f"Unknown rollout mode {name!r}; known: {', '.join(ROLLOUT_MODES)}")
    return ROLLOUT_MODES[name]


__all__ = ["ROLLOUT_MODES", "OnPolicy", "OneStepAhead", "get_rollout_mode"]
