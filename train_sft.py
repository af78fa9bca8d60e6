"""Supervised fine-tuning (full or LoRA) of any diffusion LM family with the family's own objective
(LLaDA / Dream masked diffusion, SDAR / LLaDA2 block diffusion on [x_t ‖ x_0]; recipes in dare/diffusion.py).

    accelerate launch train_sft.py --config recipes/llada/sft.yaml
    accelerate launch --config_file accelerate_configs/ddp.yaml train_sft.py --config recipes/sdar/sft_lora.yaml
    python train_sft.py --model tiny:sdar --max-steps 20 --data.max-length 256 --output-dir outputs/sft-tiny
    python train_sft.py --config recipes/llada/sft.yaml --resume     # continue from the newest complete checkpoint

Every field below is a flag (``--help``); ``--config`` YAML files set the defaults.
"""

from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments, set_seed

from dare.config import parse
from dare.data import SFTCollator, SFTDataConfig, load_rows
from dare.data.sft import tokenize_dataset
from dare.models import load_pretrained
from dare.models.lora import LoraArgs, apply_lora
from dare.trainers import DiffusionSFTTrainer, fit


@dataclass
class Args:
    """SFT of a diffusion LM."""

    model: str = "tiny:llada"  # hub name, local folder or tiny:<family>
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    lora: LoraArgs = field(default_factory=LoraArgs)
    output_dir: str = "outputs/sft"
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    adam_beta2: float = 0.95
    warmup_steps: float = 0.1  # < 1: fraction of the training steps
    lr_scheduler_type: str = "cosine"
    max_grad_norm: float = 1.0
    num_train_epochs: float = 1.0
    max_steps: int = -1  # > 0 overrides num_train_epochs
    per_device_train_batch_size: int = 2
    gradient_accumulation_steps: int = 1
    group_by_length: bool = False  # batch examples of similar length together (less padding with pad_to=longest)
    bf16: bool = False  # bf16 autocast (mixed precision) around fp32 master weights
    dtype: str = "float32"  # weight dtype at load: float32 (master weights) or bfloat16 (pure bf16, half the memory)
    gradient_checkpointing: bool = False
    attn_implementation: str = "sdpa"
    logging_steps: int = 10
    save_steps: int = 500
    save_total_limit: int = 3  # keep the last K checkpoints
    report_to: str = "none"  # none | tensorboard | wandb
    seed: int = 42
    resume: bool = False  # continue from the newest complete checkpoint in output_dir
    export_merged: bool = True  # LoRA: also write output_dir/merged, a plain HF folder with the official key names


def main(args: Args):
    set_seed(args.seed)
    model, tokenizer, family = load_pretrained(args.model, dtype=getattr(torch, args.dtype),
                                               attn_implementation=args.attn_implementation)
    model = apply_lora(model, args.lora, args.gradient_checkpointing)
    rows = load_rows(args.data.path, args.data.split)
    if args.data.limit:
        rows = rows.select(range(min(args.data.limit, len(rows))))
    train = tokenize_dataset(rows, tokenizer, family, args.data)
    training_args = TrainingArguments(
        output_dir=args.output_dir, learning_rate=args.learning_rate, weight_decay=args.weight_decay,
        adam_beta2=args.adam_beta2, warmup_steps=args.warmup_steps, lr_scheduler_type=args.lr_scheduler_type,
        max_grad_norm=args.max_grad_norm, num_train_epochs=args.num_train_epochs, max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps, bf16=args.bf16,
        train_sampling_strategy="group_by_length" if args.group_by_length else "random",
        activation_checkpointing=args.gradient_checkpointing, logging_steps=args.logging_steps,
        dataloader_pin_memory=torch.cuda.is_available(),
        save_steps=args.save_steps, save_total_limit=args.save_total_limit, report_to=args.report_to,
        seed=args.seed, remove_unused_columns=False)
    trainer = DiffusionSFTTrainer(model=model, args=training_args, train_dataset=train, family=family,
                                  data_collator=SFTCollator(family, args.data), processing_class=tokenizer)
    merged = f"{args.output_dir}/merged" if args.lora.rank > 0 and args.export_merged else None
    fit(trainer, args.resume, merged)


if __name__ == "__main__":
    main(parse(Args))
