"""Supervised fine-tuning (full or LoRA) of any diffusion LM family with the family's own objective
(LLaDA / Dream masked diffusion, SDAR / LLaDA2 block diffusion on [x_t ‖ x_0]; recipes in dare/diffusion.py).

    accelerate launch train_sft.py --config recipes/llada/sft.yaml
    accelerate launch --config_file accelerate_configs/ddp.yaml train_sft.py --config recipes/sdar/sft_lora.yaml
    python train_sft.py --model tiny:sdar --max-steps 20 --data.max-length 256 --output-dir outputs/sft-tiny
    python train_sft.py --config recipes/llada/sft.yaml --resume     # continue from the newest complete checkpoint

Every field below is a flag (``--help``); ``--config`` YAML files set the defaults.
"""

from dataclasses import dataclass, field
from typing import Literal

from dare.config import parse, run
from dare.data import SFTDataConfig
from dare.lora import LoraArgs
from dare.sampling import SamplingConfig


@dataclass
class Args:
    """SFT of a diffusion LM."""

    model: str = "tiny:llada"  # hub name, local folder or tiny:<family>
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    lora: LoraArgs = field(default_factory=LoraArgs)
    output_dir: str = "outputs/sft"  # checkpoints, logs and the final model go here
    learning_rate: float = 1e-4  # peak learning rate of AdamW
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    adam_beta1: float = 0.9  # AdamW beta1
    adam_beta2: float = 0.95  # AdamW beta2
    adam_epsilon: float = 1e-8  # AdamW epsilon
    warmup_steps: float = 0.1  # < 1: fraction of the training steps
    lr_scheduler_type: str = "cosine"  # transformers schedule: constant | linear | cosine | ...
    max_grad_norm: float = 1.0  # clip the global gradient norm to this (0 = off)
    num_train_epochs: float = 1.0  # passes over the data (when max_steps <= 0)
    max_steps: int = -1  # > 0 overrides num_train_epochs
    # stop at the first logged training loss (mean over logging_steps) below this, max_steps at the latest (0: off)
    stop_at_loss: float = 0.0
    per_device_train_batch_size: int = 2  # examples per forward/backward on one device
    # micro-batches per optimiser step (global batch = this x batch size x devices)
    gradient_accumulation_steps: int = 1
    group_by_length: bool = False  # batch examples of similar length together (less padding with pad_to=longest)
    bf16: bool = False  # bf16 autocast around fp32 master weights (a GPU that has it; elsewhere fp32, with a note)
    # weight dtype at load: float32 (fp32; master weights) or bfloat16 (bf16; pure bf16, half the memory)
    dtype: str = "float32"
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30% slower
    # processes sharing each sequence (Ulysses; heads and data.max_length divisible by it); data-parallel size =
    # processes / this
    sequence_parallel: int = 1
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2 | flex_attention
    logging_steps: int = 10  # log metrics every N optimiser steps
    save_steps: int = 500  # write a checkpoint every N optimiser steps
    eval_steps: int = 0  # with data.eval_path: held-out loss (fixed masks) every N optimiser steps (0: never)
    # also decode the first N held-out prompts at each evaluation and log their reward and accuracy (16 at a time)
    eval_generate: int = 0
    # decoding of --eval-generate (greedy, 256 tokens; DARE's samplers on the training weights)
    eval_sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig(gen_length=256, temperature=0.0))
    # reward of those answers: auto | NAME[:W] | SOURCE=NAME[:W] (e.g. gsm8k for '#### N' answers)
    eval_rewards: list[str] = field(default_factory=lambda: ["auto"])
    save_total_limit: int = 3  # keep the last K checkpoints
    report_to: str = "none"  # none | tensorboard | wandb
    # compact: one line per logged step (loss, grad norm, lr, s/step) | full: every metric
    console: Literal["compact", "full"] = "compact"
    seed: int = 42  # seeds data order, masks and sampling
    # continue from the newest complete checkpoint in output_dir, refused if it was made with other settings
    # (docs/training.md "Recipes, flags, errors, logs": what may change)
    resume: bool = False
    resume_must: bool = False  # with --resume: fail when output_dir has no complete checkpoint (default: start anew)
    # a fresh run into an output_dir holding another run: delete its checkpoints, model and logs (default: refuse)
    overwrite_output_dir: bool = False
    export_merged: bool = True  # LoRA: also write output_dir/merged, a plain HF folder with the official key names


# --help: the flags by theme (--help-full: tyro's whole help)
HELP_GROUPS = {
    "model": "model dtype attn_implementation lora export_merged",
    "data": "data",
    "optimisation": "learning_rate weight_decay adam_beta1 adam_beta2 adam_epsilon warmup_steps lr_scheduler_type "
                    "max_grad_norm num_train_epochs max_steps stop_at_loss per_device_train_batch_size "
                    "gradient_accumulation_steps group_by_length bf16 gradient_checkpointing sequence_parallel seed",
    "held-out evaluation": "eval_steps eval_generate eval_sampling eval_rewards",
    "output, logs, resume (docs/outputs.md)": "output_dir logging_steps save_steps save_total_limit report_to console "
                                              "resume resume_must overwrite_output_dir"}


def main(args: Args):
    # imported here, not at the top, so that --help answers at once (transformers and peft take seconds)
    import torch
    from transformers import TrainingArguments, set_seed

    from dare.data import SFTCollator, load_rows
    from dare.data.images import image_base
    from dare.data.sft import tokenize_dataset
    from dare.diffusion import recipe_for
    from dare.lora import apply_lora
    from dare.models import pictures
    from dare.models.loading import check_attention, load_config, load_weights, max_positions
    from dare.trainers import DiffusionSFTTrainer, StopAtLoss, fit, start_or_resume
    from dare.trainers.distributed import checkpointing_args, mixed_precision, process_group_args
    from dare.trainers.flags import check_training_flags

    set_seed(args.seed)
    check_training_flags(args)
    args.lora.validate()
    check_attention(args.attn_implementation, training=True)
    checkpoint = start_or_resume(args)
    config, tokenizer, family = load_config(args.model)  # the data is read and checked before the weights load
    sp = args.sequence_parallel
    if family.noise == "uniform" and (args.data.pack or sp > 1):
        raise ValueError(f"{family.name} reads each whole row with its causal encoder: data.pack and "
                         "sequence_parallel > 1 are not supported for it")
    if sp > 1 and recipe_for(family).causal_loss:
        raise ValueError(f"{family.name} trains with a causal + diffusion loss, which sequence_parallel > 1 does not "
                         "support")
    if sp > 1 and (args.data.pad_to != "max_length" or args.data.max_length % sp):
        raise ValueError(f"sequence_parallel={args.sequence_parallel} splits every row: use data.pad_to=max_length "
                         f"with a data.max_length divisible by it (got {args.data.pad_to}, {args.data.max_length})")
    positions = max_positions(config)
    if positions and args.data.max_length > positions:
        raise ValueError(f"data.max_length {args.data.max_length} is more than the model's {positions} positions "
                         "(max_position_embeddings)")
    reader = pictures(config) if family.pictures else None  # LLaDA-V reads the rows' pictures
    if reader is not None and (args.data.pack or sp > 1 or args.eval_generate):
        raise ValueError(f"{family.name} reads pictures: data.pack, sequence_parallel > 1 and eval_generate do not "
                         "take them yet")
    rows = load_rows(args.data.path, args.data.split, args.data.local_dir, images=reader is not None)
    if args.data.limit:
        rows = rows.select(range(min(args.data.limit, len(rows))))
    train = tokenize_dataset(rows, tokenizer, family, args.data, reader, image_base(args.data.path))
    evaluation = None
    if args.data.eval_path:
        held_out = load_rows(args.data.eval_path, args.data.eval_split, args.data.local_dir, images=reader is not None)
        if args.data.eval_limit:
            held_out = held_out.select(range(min(args.data.eval_limit, len(held_out))))
        evaluation = tokenize_dataset(held_out, tokenizer, family, args.data, reader, image_base(args.data.eval_path))
    generation = held_out_generation(args, tokenizer, family, positions) if args.eval_generate else None
    training_args = TrainingArguments(  # first: under ZeRO-3 (zero3_init_flag) the weights load partitioned
        output_dir=args.output_dir, learning_rate=args.learning_rate, weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_epsilon=args.adam_epsilon,
        warmup_steps=args.warmup_steps, lr_scheduler_type=args.lr_scheduler_type,
        max_grad_norm=args.max_grad_norm, num_train_epochs=args.num_train_epochs, max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps, bf16=mixed_precision(args.bf16),
        train_sampling_strategy="group_by_length" if args.group_by_length else "random",
        **checkpointing_args(args.gradient_checkpointing), logging_steps=args.logging_steps,
        dataloader_pin_memory=torch.cuda.is_available(),
        save_steps=args.save_steps, save_total_limit=args.save_total_limit, report_to=args.report_to,
        seed=args.seed, remove_unused_columns=False,
        eval_strategy="steps" if evaluation is not None and args.eval_steps else "no",
        eval_steps=args.eval_steps or None, per_device_eval_batch_size=args.per_device_train_batch_size,
        **process_group_args())
    model = load_weights(args.model, config, getattr(torch, args.dtype), args.attn_implementation)
    model = apply_lora(model, args.lora, args.gradient_checkpointing, args.model)
    trainer = DiffusionSFTTrainer(model=model, args=training_args, train_dataset=train, eval_dataset=evaluation,
                                  family=family, generation=generation, sequence_parallel=args.sequence_parallel,
                                  data_collator=SFTCollator(family, args.data, reader), processing_class=tokenizer,
                                  console=args.console, pictures=reader)
    if args.stop_at_loss:
        trainer.add_callback(StopAtLoss(args.stop_at_loss))
    merged = f"{args.output_dir}/merged" if args.lora.rank > 0 and args.export_merged else None
    return fit(trainer, checkpoint, merged, settings=args)


def held_out_generation(args: Args, tokenizer, family, positions: int | None) -> tuple:
    """(rows, sampling, rewards) of ``--eval-generate``: the first N held-out prompts as the model was trained on
    them (no answer instruction added), checked before the weights load."""
    from dare.data import RLDataConfig, load_rows, prompt_rows
    from dare.data.chat import encode
    from dare.data.sft import sft_format
    from dare.rewards.routing import RewardRouter

    d = args.data
    if not d.eval_path or args.eval_steps <= 0:
        raise ValueError("eval_generate needs held-out prompts: set data.eval_path and eval_steps > 0")
    prompt_key = d.prompt_key or sft_format(load_rows(d.eval_path, d.eval_split, d.local_dir)[0])[1]
    rows = prompt_rows(d.eval_path, d.eval_split, RLDataConfig(
        prompt_key=prompt_key, answer_key=d.answer_key, system_prompt=d.system_prompt, answer_instruction="none",
        local_dir=d.local_dir), args.eval_generate)
    longest = max(len(ids) for ids in encode(tokenizer, [r["prompt"] for r in rows]))
    return rows, args.eval_sampling.check(family, "eval_sampling", longest, positions), RewardRouter(args.eval_rewards)


if __name__ == "__main__":
    run(main, lambda: parse(Args, groups=HELP_GROUPS))
