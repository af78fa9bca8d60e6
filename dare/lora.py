"""LoRA for every family through PEFT (shared by the SFT and RL scripts)."""

import warnings
from dataclasses import dataclass

# PEFT's and TRL's noise, nothing a user can act on: they read transformers' deprecated alias (PEFT when it wraps a
# model, TRL in the RL trainer, which imports this module through the checkpoints), and PEFT on saving looks for the
# base's config.json by name, which a tiny:<family> model (built in memory) has none of
warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.* is deprecated")
warnings.filterwarnings("ignore", message="Could not find a config file in tiny:")


@dataclass
class LoraArgs:
    rank: int = 0  # 0 = full fine-tuning
    alpha: int = 16  # LoRA scaling numerator: updates are scaled by alpha / rank
    dropout: float = 0.0  # dropout on the LoRA input
    target_modules: str = "all-linear"  # or a comma-separated list, e.g. q_proj,v_proj

    def validate(self) -> "LoraArgs":
        if self.rank < 0 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ValueError(f"lora needs rank >= 0 (0: full fine-tuning), alpha > 0 and 0 <= dropout < 1, got rank="
                             f"{self.rank}, alpha={self.alpha}, dropout={self.dropout}")
        return self


def apply_lora(model, lora: LoraArgs, gradient_checkpointing: bool = False, base: str | None = None):
    """``model`` wrapped with trainable adapters (unchanged when ``lora.rank`` is 0). ``base``: the model name the
    adapter folder records as its base (a local path made absolute), so that the folder loads as a model anywhere
    (``dare.models.loading.adapter_base``), ``tiny:`` names included."""
    if lora.rank <= 0:
        return model
    import os

    from peft import LoraConfig, get_peft_model

    from .models.loading import looks_local
    targets = lora.target_modules
    targets = targets if targets == "all-linear" else [t.strip() for t in targets.split(",")]
    if gradient_checkpointing:
        model.enable_input_require_grads()
    # task_type: the adapter folder then records CAUSAL_LM (not our class's module, which PEFT's import allowlist
    # refuses), so peft.AutoPeftModelForCausalLM reloads it through AutoModelForCausalLM. DiffusionGemma is no causal
    # LM (no prepare_inputs_for_generation): a plain PeftModel, reloaded with PeftModel.from_pretrained
    task = "CAUSAL_LM" if hasattr(model, "prepare_inputs_for_generation") else None
    wrapped = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, bias="none", task_type=task,
                                               lora_dropout=lora.dropout, target_modules=targets))
    if base is not None:
        local = looks_local(base) and not base.startswith("tiny:")
        wrapped.peft_config[wrapped.active_adapter].base_model_name_or_path = \
            os.path.abspath(os.path.expanduser(base)) if local else base
    return wrapped


def export_merged(trainer, tokenizer, folder: str) -> None:
    """Write the LoRA-merged model as a plain HF folder with the official key names. Every process must call it:
    the weights are first gathered whole (FSDP2 and ZeRO-3 shard them), then merged on the main process into a
    copy built on the meta device around the gathered tensors, so the trained model itself stays as it is."""
    import dataclasses

    import torch
    from peft import get_peft_model

    state = trainer.accelerator.get_state_dict(trainer.model_wrapped)  # collective: full weights on the main process
    if not trainer.is_world_process_zero():
        return
    trained = trainer.accelerator.unwrap_model(trainer.model)
    base = trained.get_base_model()
    # a copy of the adapter config: get_peft_model renames its base (the recorded one stays the trained model's)
    config = dataclasses.replace(trained.peft_config[trained.active_adapter], base_model_name_or_path=None)
    with torch.device("meta"):
        copy = get_peft_model(type(base)(base.config), config)
    copy.load_state_dict(state, strict=True, assign=True)
    merged = copy.merge_and_unload()
    merged.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def merged_weights(model):
    """``(name, tensor)`` of every weight of ``model`` under the official key names, LoRA adapters merged in (for a
    PEFT model; the model itself is not modified), for pushing into an inference engine. Sharded FSDP2 tensors are
    gathered whole (collective: every process must iterate)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    deltas = {}
    if base is not model:
        from peft.tuners.lora import LoraLayer
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and not module.merged:
                active = [a for a in module.active_adapters if a in module.lora_A]
                if active:
                    deltas[f"{name}.weight"] = sum(module.get_delta_weight(a) for a in active)
    for name, tensor in base.state_dict().items():
        if ".lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
        yield name, (tensor + deltas[name].to(tensor.dtype) if name in deltas else tensor).detach()
