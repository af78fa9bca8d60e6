"""A value model beside the policy: its own network, AdamW, checkpoint and export, for any algorithm that declares
one (``Algorithm.needs_value``: a ``value: ValueSettings`` field with ``model`` set; TraceRL's).

The network is a model of the policy's family whose LM head is replaced by a zeroed one-output linear head (the
TraceRL code's ``value_head``), so ``Family.logits`` reads it in every layout the policy is scored in. Each rollout
batch: the algorithm reads its values without gradients and sets the policy's advantages from them
(``value_targets``), then the value model takes one optimiser step on its loss (``value_loss``) over the batch's
micro-batches. It is saved in ``value/`` of every checkpoint (weights and optimiser state) and of the output folder,
and a resumed run continues it exactly; ``--algo-config.value.model <output_dir>/value`` starts another run from it.
It runs whole on every process (gradients averaged across processes by hand): one process or DDP, not FSDP or
DeepSpeed.
"""

import copy
import json
import os
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_model, save_model

FOLDER = "value"  # inside a checkpoint and the output folder
MARK = "dare_value_model.json"  # written beside a saved value model's weights


def value_network(policy, source: str, family_name: str):
    """The value model: ``source`` "policy" copies the policy's start (a LoRA policy's base); a saved value model
    (``<output_dir>/value`` of an earlier run on a policy of this architecture) is loaded as it is; anything else is a
    model of the same family whose LM head becomes a zeroed ``Linear(hidden, 1)``, as the copy's does."""
    saved = Path(source, MARK).exists()
    if source == "policy" or saved:
        network = copy.deepcopy(policy)
        if hasattr(network, "merge_and_unload"):  # LoRA: the base with the adapter (still zero) merged in
            network = network.merge_and_unload()
    else:
        from ..models.loading import load_config, load_weights

        config, _, family = load_config(source)
        if family.name != family_name:
            raise ValueError(f"value.model {source} is a {family.name} model; the policy is {family_name}")
        network = load_weights(source, config, next(policy.parameters()).dtype)
    hidden = network.get_output_embeddings().weight.shape[1]
    head = torch.nn.Linear(hidden, 1, bias=False, device=next(network.parameters()).device,
                           dtype=next(network.parameters()).dtype)
    torch.nn.init.zeros_(head.weight)
    network.config.tie_word_embeddings = False
    network.set_output_embeddings(head)
    if saved:
        try:
            load_model(network, str(Path(source, "model.safetensors")))
        except RuntimeError as e:
            raise ValueError(f"value.model {source} was saved for another architecture than this policy's: "
                             f"{str(e).splitlines()[0]}") from None
    return network.requires_grad_(True).train()


@contextmanager
def evaluating(network):
    """``network`` in eval mode for a no-grad pass, its mode restored after."""
    was_training = network.training
    network.eval()
    try:
        yield network
    finally:
        network.train(was_training)


class ValueModel:
    """The network, its AdamW and how it is stepped, saved and restored."""

    def __init__(self, network, settings):
        self.network, self.settings = network, settings
        self.optimizer = torch.optim.AdamW(network.parameters(), lr=settings.learning_rate, weight_decay=0.0)

    def step(self, loss_of, pieces: list, tokens: torch.Tensor) -> dict:
        """One optimiser step on ``sum loss_of(piece, tokens)`` (each a ``(loss, stats)``); the stats summed."""
        self.network.train()
        self.optimizer.zero_grad(set_to_none=True)
        totals = {}
        for piece in pieces:
            loss, stats = loss_of(piece, tokens)
            loss.backward()
            for name, (total, count) in stats.items():
                old = totals.get(name, (0.0, 0.0))
                totals[name] = (old[0] + float(total), old[1] + float(count))
        params = [p for p in self.network.parameters() if p.grad is not None]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for p in params:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()
        if self.settings.max_grad_norm:
            norm = torch.nn.utils.clip_grad_norm_(params, self.settings.max_grad_norm)
            totals["value/grad_norm"] = (float(norm), 1.0)
        self.optimizer.step()
        return totals

    def save(self, folder: str, optimizer: bool) -> None:
        os.makedirs(folder, exist_ok=True)
        if optimizer:
            torch.save(self.optimizer.state_dict(), Path(folder, "optimizer.pt"))
        else:
            save_model(self.network, str(Path(folder, "model.safetensors")))
            self.network.config.to_json_file(str(Path(folder, "config.json")))
            Path(folder, MARK).write_text(json.dumps({"head": "the LM head replaced by Linear(hidden, 1, bias=False)",
                                                      "load": "train_rl.py --algo-config.value.model <this folder>"}))

    def load(self, folder: str, optimizer: bool) -> None:
        if optimizer:
            self.optimizer.load_state_dict(torch.load(Path(folder, "optimizer.pt"), weights_only=True))
        else:
            load_model(self.network, str(Path(folder, "model.safetensors")))


class ValueModelTraining:
    """Trainer mixin: hold ``self.value_model`` (None unless the algorithm declares one), step it on each rollout
    batch (``fit_value``), save it with every checkpoint and the final model, restore it on resume."""

    value_model: ValueModel | None = None

    def make_value_model(self, algorithm, family):
        if not algorithm.needs_value:
            return
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise ValueError(f"{algorithm.name}'s value model runs whole on each process: use one process or DDP "
                             "(not FSDP or DeepSpeed), or unset value.model")
        policy = self.accelerator.unwrap_model(self.model)
        self.value_model = ValueModel(value_network(policy, algorithm.value.model, family.name), algorithm.value)

    def fit_value(self, parts: list[dict]) -> None:
        """The algorithm's advantages from the value model's predictions, then one value step on the batch."""
        algo, family, value = self.algorithm, self.family, self.value_model
        with torch.no_grad(), evaluating(value.network), self.compute_loss_context_manager():
            algo.value_targets(value.network, family, parts, self.num_generations, self.sampling)
        tokens = self.accelerator.reduce(sum(p["loss_mask"].sum() for p in parts).float(), "sum")
        tokens = tokens / self.accelerator.num_processes  # the step averages gradients over processes
        pieces = [(part, stream) for part in parts for stream in range(self.streams)]

        def loss_of(piece, normaliser):
            with self.compute_loss_context_manager():
                return algo.value_loss(value.network, family, piece[0], piece[1], normaliser, self.sampling)
        for name, (total, count) in value.step(loss_of, pieces, tokens).items():
            self._add(name, total, count)

    def save_model(self, output_dir=None, _internal_call=False):
        super().save_model(output_dir, _internal_call)
        if self.value_model is not None and self.args.should_save:
            self.value_model.save(os.path.join(output_dir or self.args.output_dir, FOLDER), optimizer=False)

    def _save_optimizer_and_scheduler(self, output_dir):
        super()._save_optimizer_and_scheduler(output_dir)
        if self.value_model is not None and self.args.should_save:
            self.value_model.save(os.path.join(output_dir, FOLDER), optimizer=True)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        if self.value_model is not None:
            self.value_model.load(os.path.join(resume_from_checkpoint, FOLDER), optimizer=False)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and self.value_model is not None:
            self.value_model.load(os.path.join(checkpoint, FOLDER), optimizer=True)
