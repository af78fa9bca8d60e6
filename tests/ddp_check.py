"""Launched by tests/test_distributed.py under 2-process CPU DDP: 3 optimizer steps of sft_loss on a different random
batch per rank, then checks that the parameters moved from init and are identical on every rank.

    python tests/ddp_check.py [MODEL]     # under the 2-process launch; MODEL: tiny:sdar (default) or another
"""

import sys

import torch
from accelerate import Accelerator, DistributedDataParallelKwargs

from dare.config import leave_together
from dare.models import load_pretrained
from dare.objectives import sft_loss


def main():
    torch.set_num_threads(1)
    # unused parameters allowed, as transformers' Trainer does for a model without gradient checkpointing:
    # DiffusionGemma's vision tower never sees a text batch
    accelerator = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    rank, world = accelerator.process_index, accelerator.num_processes
    print(f"ddp_check rank={rank} world_size={world} distributed_type={accelerator.distributed_type}", flush=True)
    model, _, family = load_pretrained(sys.argv[1] if len(sys.argv) > 1 else "tiny:sdar")  # same seed on every rank
    model.train()
    init = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel), type(model)
    generator = torch.Generator().manual_seed(1000 + rank)  # different data and noise per rank
    vocab = family.vocab_size
    low, high = 10, min(vocab, 200)  # ordinary tokens, away from the special ids at the end of the vocabulary
    losses = []
    for _ in range(3):
        ids = torch.randint(low, high, (2, 16), generator=generator)
        loss_mask = torch.zeros_like(ids)
        loss_mask[:, 6:] = 1
        loss = sft_loss(model, family, ids, loss_mask, generator=generator)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in accelerator.unwrap_model(model).parameters()])
    every = accelerator.gather(flat[None]).view(world, -1)
    local_losses = accelerator.gather(torch.tensor([losses]))
    assert world == 2, f"expected 2 processes, got {world}"
    assert not torch.equal(local_losses[0], local_losses[1]), "ranks saw the same batches"
    assert (flat - init).abs().max() > 1e-4, "parameters did not move"
    assert torch.equal(every[0], every[1]), f"ranks diverged: max diff {(every[0] - every[1]).abs().max()}"
    accelerator.wait_for_everyone()
    print(f"ddp_check rank={rank} OK", flush=True)
    leave_together()


if __name__ == "__main__":
    main()
