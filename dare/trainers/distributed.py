"""Data-parallel launches that do what their accelerate config says, on GPUs and on CPU processes alike.

    training_args = TrainingArguments(..., **process_group_args())   # before the first use of the args' device
    class MyTrainer(ShardedTraining, Trainer): ...

Three gaps of accelerate / transformers closed here:
- Without CUDA, accelerate finds no backend for a multi-process launch: each process thinks it is alone (N
  independent runs into one folder) or, given gloo, runs unsynchronised. ``process_group_args`` selects gloo and,
  for non-DeepSpeed launches, accelerate's CPU mode, which makes the processes data-parallel.
- In CPU mode accelerate silently drops the FSDP plugin and wraps the model in DDP. ``ShardedTraining`` restores
  it (FSDP2 ``fully_shard`` runs over gloo), so a config that asks for sharding shards, on CPU too; a multi-process
  run left with no wrapper at all is refused.
- With ``SHARDED_STATE_DICT`` (the FSDP config's choice for checkpoints) ``Trainer.save_model`` writes no model at
  all; the final save gathers a full state dict instead, so ``output_dir`` is a plain model folder.
"""

import os
import sys

import torch

from ..packing import PackedFamily
from ..parallel import ATTENTION, SequenceParallel, SequenceParallelFamily


def env_flag(name: str) -> bool:
    """An accelerate-style boolean environment variable (1 / true / yes)."""
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def process_group_args() -> dict:
    """``TrainingArguments`` keywords for this launch: gloo between CPU processes (and accelerate's CPU mode for
    every launch but DeepSpeed's, whose CPU path needs it off); nothing on CUDA machines or single processes."""
    if torch.cuda.is_available() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return {}
    if not env_flag("ACCELERATE_USE_DEEPSPEED"):
        os.environ["ACCELERATE_USE_CPU"] = "true"  # accelerate launch wrote "False" there: no GPU means CPU mode
    return {"ddp_backend": "gloo"}


def mixed_precision(bf16: bool) -> bool:
    """``bf16`` where this device can run it; on a CPU-only machine (or a GPU without bf16) a note and fp32, so a
    recipe written for GPUs runs here instead of failing in transformers after the weights load."""
    if bf16 and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        print("note: bf16 mixed precision needs a GPU that supports it; training in fp32 on this device",
              file=sys.stderr)
        return False
    return bf16


def checkpointing_args(enabled: bool) -> dict:
    """The ``TrainingArguments`` keyword for activation checkpointing: ``activation_checkpointing`` from transformers
    5.24, ``gradient_checkpointing`` before (5.19 is SGLang 0.5.23's pin)."""
    from transformers import TrainingArguments
    fields = TrainingArguments.__dataclass_fields__
    return {"activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing": enabled}


def restore_fsdp(accelerator, plugin_args: dict | None = None) -> bool:
    """Give ``accelerator`` back the FSDP plugin that accelerate dropped for CPU processes (the launch's FSDP_* env,
    or ``plugin_args``); True if it did. Call it before ``accelerator.prepare``."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    wanted = env_flag("ACCELERATE_USE_FSDP") or plugin_args is not None
    if not wanted or state.distributed_type != DistributedType.MULTI_CPU:
        return False
    plugin = FullyShardedDataParallelPlugin(**(plugin_args or {}))  # reads the FSDP_* env of accelerate launch
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True


class ShardedTraining:
    """Trainer mixin: FSDP on CPU processes as the config asks, no unsynchronised multi-process run, a full final
    save under sharded checkpoints (see the module docstring), and sequence parallelism: with
    ``sequence_parallel = N`` (set before ``Trainer.__init__``) consecutive groups of N processes share each
    micro-batch, each holding 1/N of its sequence (``self.sp``, a ``dare.parallel.SequenceParallel``; None without)."""

    sequence_parallel: int = 1

    def create_accelerator_and_postprocess(self):
        from accelerate.utils import DistributedType

        super().create_accelerator_and_postprocess()
        self.is_fsdp_enabled = self.is_fsdp_enabled or restore_fsdp(self.accelerator, self.args.fsdp_plugin_args)
        if self.accelerator.num_processes > 1 and self.accelerator.state.distributed_type == DistributedType.NO:
            raise RuntimeError(f"{self.accelerator.num_processes} processes but no distributed wrapper: their "
                               "gradients would never be synchronised. On CPU, launch with ACCELERATE_USE_CPU=1 "
                               "(or accelerate launch --cpu).")
        self.sp = self._sequence_groups(self.sequence_parallel)

    def _sequence_groups(self, size: int):
        if size <= 1:
            return None
        import torch.distributed as dist

        world, rank = self.accelerator.num_processes, self.accelerator.process_index
        if world % size:
            raise ValueError(f"sequence_parallel={size} must divide the {world} processes")
        groups = [dist.new_group(list(range(first, first + size))) for first in range(0, world, size)]  # all ranks
        self.model.set_attn_implementation(ATTENTION)  # plain sdpa wherever a call is not sharded (generation)
        return SequenceParallel(groups[rank // size])

    def scoring(self, family, pack: int = 0):
        """``family`` as the training passes score through it: split over the sequence-parallel group, its rows
        packed into rows of ``pack`` tokens (0: not packed)."""
        family = family if self.sp is None else SequenceParallelFamily(family, self.sp)
        return PackedFamily(family, pack) if pack else family

    @property
    def data_parallel(self) -> tuple[int, int]:
        """(this process's data-parallel rank, the data-parallel size): processes / sequence_parallel."""
        size = self.sp.size if self.sp is not None else 1
        return self.accelerator.process_index // size, self.accelerator.num_processes // size

    def get_train_dataloader(self):
        """Each sequence-parallel group reads one data-parallel share: its processes get the same micro-batches."""
        loader = super().get_train_dataloader()
        if self.sp is not None:
            shard = loader.batch_sampler  # accelerate's BatchSamplerShard (map-style datasets)
            shard.process_index, shard.num_processes = self.data_parallel
        return loader

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        if self.is_fsdp_enabled and not _internal_call:  # the final folder: gathered weights, not DCP shards
            self.accelerator.state.fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
        return super().save_model(output_dir, _internal_call)
