"""Launched by tests/test_scale_out.py on 2 CPU processes under DDP, FSDP2, ZeRO-2 or ZeRO-3 (whatever the launch
configures): sharded training equals 1-process training on the same global batch, for every family, in fp32.

For each family: 3 SGD steps of the SFT loss, then 3 of d1's and of ESPO's RL loss (fixed rollout rows and advantages;
ESPO streams its 2 MC draws). The noise (t, masks) is drawn once for the global batch and sliced, as the 1-process run
draws it; rank 0 first trains a private copy on the whole batch (the 1-process run), then both ranks train their halves
through ``accelerator.prepare``. SGD, so a wrong gradient scale cannot hide behind Adam's sign-like first step. Prints
the shard evidence (a parameter's type and local shape) and ``shard_check OK`` per case."""

import copy
import os

import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState

from dare.algos import get_algorithm
from dare.config import leave_together
from dare.diffusion import corrupt, recipe_for, sample_t
from dare.models import Family, tiny
from dare.objectives import sft_loss, sft_units
from dare.sampling import SamplingConfig
from dare.trainers.distributed import env_flag, process_group_args, restore_fsdp

STEPS, ROWS, LR, TOLERANCE = 3, 4, 0.5, 1e-5
FAMILIES = ("llada", "dream", "sdar", "llada2")

SAMPLING = SamplingConfig(gen_length=8)  # the rollout decoding the algorithms plan for (8-token completions)

def rows_of(value, part: slice):
    """This rank's rows of a batch (every tensor is row-first, as the RL trainer splits them; scalars stay)."""
    if isinstance(value, dict):
        return {k: rows_of(v, part) for k, v in value.items()}
    if isinstance(value, list):
        return [rows_of(v, part) for v in value]
    return value[part] if value.dim() else value


def sft_batches(family, vocab):
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(10, min(vocab, 200), (ROWS, 24), generator=g)
        loss_mask = torch.zeros_like(ids)
        loss_mask[:, 8:] = 1
        t = sample_t(ROWS, recipe_for(family), g)
        _, masked = corrupt(ids, loss_mask.bool(), t, family.mask_id, g, recipe_for(family).min_one)
        out.append({"input_ids": ids, "loss_mask": loss_mask, "t": t, "masked": masked,
                    "units": sft_units(family, loss_mask, masked)})
    return out


def sft_step(model, family, batch, world):
    # as the SFT trainer does: the whole batch's count of rows / masked tokens, divided by the processes
    return sft_loss(model, family, batch["input_ids"], batch["loss_mask"], t=batch["t"], masked=batch["masked"],
                    normaliser=batch["units"] / world)


def rl_batches(algorithm, family, vocab):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        completion = torch.randint(10, min(vocab, 200), (ROWS, 8), generator=g)
        batch = {"prompt_ids": torch.randint(10, min(vocab, 200), (ROWS, 6), generator=g),
                 "prompt_mask": torch.ones(ROWS, 6, dtype=torch.long), "completion_ids": completion,
                 "completion_mask": torch.ones_like(completion), "loss_mask": torch.ones_like(completion),
                 "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])}
        batch["noise"] = [algorithm.corrupt(family, batch, g, SAMPLING)]
        batch["normaliser"] = algorithm.normaliser(family, batch, SAMPLING).float()
        out.append(batch)
    return out


def rl_step(algorithm):
    def step(model, family, batch, world):
        # as the RL trainer does: the whole batch's normaliser, divided by the processes (DDP averages gradients)
        return sum(algorithm.step_loss(model, family, batch, 0, stream, batch["normaliser"] / world, SAMPLING)[0]
                   for stream in range(algorithm.streams(family, SAMPLING)))
    return step


def check(accelerator, name, family_name, batches, step):
    rank, world = accelerator.process_index, accelerator.num_processes
    model, tokenizer = tiny(family_name)  # the same weights on every rank
    model.train()
    family = Family.from_pretrained(model.config, tokenizer)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    data = batches(family, model.config.vocab_size)
    reference, expected = None, []
    if rank == 0:  # the 1-process run on the whole global batch
        reference = copy.deepcopy(model)
        optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
        for batch in data:
            loss = step(reference, family, batch, 1)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            expected.append(loss.item())
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=LR))
    share = slice(rank * ROWS // world, (rank + 1) * ROWS // world)
    losses = []
    for batch in data:
        loss = step(model, family, rows_of(batch, share), world)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / world)  # each rank's loss is `world` times its share of the whole batch's
    parameter = next(iter(model.parameters()))
    local = parameter.to_local() if hasattr(parameter, "to_local") else getattr(parameter, "ds_tensor", parameter)
    full = accelerator.get_state_dict(model)  # gathers FSDP2 / ZeRO-3 shards onto rank 0
    if rank == 0:
        ref = reference.state_dict()
        loss_gap = max(abs(a - b) for a, b in zip(losses, expected, strict=True))
        param_gap = max((full[k].float() - ref[k].float()).abs().max().item() for k in ref)
        moved = max((ref[k].float() - start[k].float()).abs().max().item() for k in ref)
        ok = loss_gap < TOLERANCE and param_gap < TOLERANCE and moved > 1e-3 and set(full) == set(ref)
        print(f"shard_check {name} {family_name}: {type(parameter).__name__} local {tuple(local.shape)} of "
              f"{tuple(ref[next(iter(ref))].shape)}; max |loss - 1 process| {loss_gap:.1e}, max |param - 1 "
              f"process| {param_gap:.1e}, moved {moved:.2f} -> {'OK' if ok else 'FAIL'}", flush=True)
    accelerator.wait_for_everyone()


def launched() -> Accelerator:
    """A fresh Accelerator for each model (accelerate keeps one DeepSpeed engine / FSDP wrap policy per instance)."""
    accelerator = Accelerator()
    restore_fsdp(accelerator)
    # resolve the layers to wrap from each model (each family's own)
    if getattr(accelerator.state, "fsdp_plugin", None) is not None:
        accelerator.state.fsdp_plugin.transformer_cls_names_to_wrap = None
    if accelerator.state.deepspeed_plugin is not None:  # no Trainer here to fill DeepSpeed's "auto" batch values
        accelerator.state.deepspeed_plugin.deepspeed_config.update(
            train_micro_batch_size_per_gpu=ROWS // accelerator.num_processes, train_batch_size=ROWS,
            gradient_clipping=0.0, gradient_accumulation_steps=1)
    assert accelerator.num_processes == 2, accelerator.num_processes
    return accelerator


def main():
    torch.set_num_threads(1)
    backend = process_group_args().get("ddp_backend")  # as train_sft.py / train_rl.py pass it to TrainingArguments
    PartialState(cpu=env_flag("ACCELERATE_USE_CPU"), backend=backend)
    print(f"shard_check launch: {launched().distributed_type}", flush=True)
    for family_name in os.environ.get("FAMILIES", ",".join(FAMILIES)).split(","):
        check(launched(), "sft", family_name, sft_batches, sft_step)
        for algo in ("d1", "espo"):
            algorithm = get_algorithm(algo)(beta=0.0, num_iterations=1)  # on-policy: no reference, ratio 1
            check(launched(), algo, family_name, lambda family, vocab, a=algorithm: rl_batches(a, family, vocab),
                  rl_step(algorithm))


if __name__ == "__main__":
    main()
    leave_together()
