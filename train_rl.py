"""Online RL of a diffusion LM with any algorithm of the zoo (``--algo``), on any family, under Accelerate.

    accelerate launch train_rl.py --algo d1 --config recipes/llada/d1_math.yaml
    accelerate launch --config_file accelerate_configs/zero2.yaml train_rl.py --config recipes/dream/d1_math.yaml
    python train_rl.py --algo d1 --model tiny:sdar --max-steps 4 --prompts-per-step 2 --num-generations 4 \\
        --rollout.gen-length 16 --output-dir outputs/rl-tiny
    python train_rl.py --config recipes/llada/d1_math.yaml --resume   # continue from the newest complete checkpoint
    python train_rl.py --algo d1 --help                                  # every knob, the algorithm's included
    python train_rl.py --algo vrpo --model tiny:llada --preference.path task:addition --max-steps 4 \\
        --prompts-per-step 8 --micro-batch-size 4 --output-dir outputs/vrpo-tiny   # offline: preference pairs

Every field below is a flag; ``--config`` YAML files set the defaults. The algorithm's own knobs (clip range, inner
iterations, KL weight, its estimator's settings) are the ``--algo-config.*`` flags / the ``algo_config:`` section.
Metrics (rewards per data source, accuracy, clip fraction, KL, entropy, time split, rollout tokens/s) go to the
console and to ``report_to``; sample completions to ``<output_dir>/completions.jsonl``. The algorithm names its
trainer: ``rl`` rolls out and rewards; ``preference`` (VRPO) trains on fixed pairs instead (the ``preference:``
section; no rollout, no reward): ``prompts_per_step`` pairs per optimiser step, ``micro_batch_size`` rows (two per
pair) per forward/backward.
"""

import dataclasses
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

# Only what the flags need is imported here, so that --help answers at once; what runs (transformers, peft,
# datasets, the trainers) is imported inside the functions below.
from dare.algos import get_algorithm, known
from dare.config import parse, peek, run
from dare.data import RLDataConfig
from dare.data.preference import PreferenceDataConfig
from dare.engines import check_decoding, engine_options, get_engine, with_engine_options
from dare.lora import LoraArgs
from dare.sampling import SamplingConfig, SamplingOverrides


@dataclass
class Args:
    """Online RL of a diffusion LM."""

    algo: str = "d1"  # the algorithm (dare/algos/<name>.py)
    model: str = "tiny:llada"  # hub name, local folder or tiny:<family>
    data: RLDataConfig = field(default_factory=RLDataConfig)
    # auto | NAME[:W] | SOURCE=NAME[:W] (dare/rewards/routing.py)
    rewards: list[str] = field(default_factory=lambda: ["auto"])
    num_generations: int = 8  # completions per prompt (the group of the group advantage)
    prompts_per_step: int = 16  # prompts per rollout batch, all processes (offline: pairs per optimiser step)
    micro_batch_size: int = 8  # completions per forward/backward on one device
    rollout: SamplingConfig = field(default_factory=lambda: SamplingConfig(gen_length=256, temperature=0.6))
    # what decodes rollouts and validation: hf (DARE's samplers, every family) | sglang (block families; docs/sglang.md;
    # its --sglang.* section)
    rollout_engine: str = "hf"
    validation: SamplingOverrides = field(default_factory=SamplingOverrides)  # the rollout's decoding, these replaced
    rollout_batch_size: int = 64  # completions the engine decodes together
    # sync: decode each batch with the policy it trains | ahead: decode the next batch on a copy of the policy while
    # this one trains (one cycle off-policy; the ratio's old log-probs from the copy: dare/trainers/rollout_modes.py)
    rollout_mode: Literal["sync", "ahead"] = "sync"
    # a completion that ends without a stop token (cut off by gen_length) scores 0 and counts as wrong (TraceRL's and
    # DiRL's rule); which groups train is the algorithm's --algo-config.dynamic-sampling.* section
    truncated_is_wrong: bool = False
    reward_workers: int = 8  # threads scoring completions (the code reward waits on sandboxed subprocesses)
    lora: LoraArgs = field(default_factory=LoraArgs)
    output_dir: str = "outputs/rl"  # checkpoints, logs and the final model go here
    learning_rate: float = 5e-7  # peak learning rate of AdamW
    optim: str = "adamw_torch"  # any transformers optimiser name (adamw_torch, adamw_8bit, sgd, ...)
    weight_decay: float = 0.01  # AdamW decoupled weight decay
    adam_beta1: float = 0.9  # AdamW beta1
    adam_beta2: float = 0.999  # AdamW beta2
    max_grad_norm: float = 1.0  # clip the global gradient norm to this (0 = off)
    lr_scheduler_type: str = "constant"  # transformers schedule: constant | linear | cosine | ...
    warmup_steps: float = 0.0  # < 1: fraction of the training steps
    max_steps: int = -1  # optimiser steps (a rollout every num_iterations x mini_batches of them); > 0 overrides epochs
    num_train_epochs: float = 1.0  # passes over the data (when max_steps <= 0)
    bf16: bool = False  # bf16 autocast around fp32 master weights (a GPU that has it; elsewhere fp32, with a note)
    dtype: str = "float32"  # weight dtype at load: float32 (fp32; master weights) or bfloat16 (bf16)
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30% slower
    # processes sharing each row in the scoring passes (Ulysses; heads divisible by it); rollouts run whole; data-
    # parallel size = processes / this
    sequence_parallel: int = 1
    # score packed rows of this many tokens (at least the batch's width; 1: that width; 0: off): the rows' attended
    # tokens first-fit, no padding, same losses (dare/packing.py)
    pack: int = 0
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2 | flex_attention
    logging_steps: int = 1  # log metrics every N optimiser steps
    save_steps: int = 20  # a multiple of the algorithm's num_iterations x mini_batches
    save_total_limit: int = 3
    eval_steps: int = 20  # validate on data.eval_path every N steps (0: never)
    eval_on_start: bool = False  # validate once before training
    report_to: str = "none"  # none | tensorboard | wandb
    # compact: one line per step (loss, reward, acc, kl, lr, s/step) | full: every metric
    console: Literal["compact", "full"] = "compact"
    seed: int = 42  # seeds data order, masks and sampling
    # continue from the newest complete checkpoint in output_dir, refused if it was made with other settings
    # (docs/training.md "Recipes, flags, errors, logs": what may change)
    resume: bool = False
    resume_must: bool = False  # with --resume: fail when output_dir has no complete checkpoint (default: start anew)
    # a fresh run into an output_dir holding another run: delete its checkpoints, model and logs (default: refuse)
    overwrite_output_dir: bool = False
    export_merged: bool = True  # LoRA: also write output_dir/merged, a plain HF folder with the official key names
    log_completions: int = 2  # completions per rollout written to output_dir/completions.jsonl (0: none)


# --help: the algorithm's own knobs first, then the run's flags by theme (--help-full: tyro's whole help)
HELP_GROUPS = {
    "the algorithm (--algo-config.*; python -m dare.algos NAME)": "algo algo_config preference",
    "model": "model dtype attn_implementation lora export_merged",
    "data and rewards": "data rewards truncated_is_wrong reward_workers",
    "rollouts (docs/decoding.md)": "num_generations prompts_per_step rollout rollout_engine rollout_batch_size "
                                   "rollout_mode validation hf sglang",
    "optimisation": "learning_rate optim weight_decay adam_beta1 adam_beta2 max_grad_norm lr_scheduler_type "
                    "warmup_steps max_steps num_train_epochs micro_batch_size bf16 gradient_checkpointing "
                    "sequence_parallel pack seed",
    "output, logs, resume (docs/outputs.md)": "output_dir logging_steps save_steps save_total_limit eval_steps "
                                              "eval_on_start report_to console log_completions resume resume_must "
                                              "overwrite_output_dir"}


def args_class(algo: str):
    """``Args`` with the algorithm's knobs as the ``algo_config`` section (and its trainer's data section)."""
    algorithm = get_algorithm(algo)
    preference = algorithm.trainer == "preference"
    extra = [("preference", PreferenceDataConfig, field(default_factory=PreferenceDataConfig))] if preference else []
    names = Literal[tuple(known())]  # --help lists every registered algorithm
    cls = dataclasses.make_dataclass("Args", [("algo", names, field(default=algorithm.name)),
                                              ("algo_config", algorithm, field(default_factory=algorithm)), *extra],
                                     bases=(with_engine_options(Args),))
    what = "Offline preference optimisation" if preference else "Online RL"
    cls.__doc__ = f"{what} of a diffusion LM with {algo}: {algorithm.__doc__}"
    cls.__module__ = Args.__module__  # so --help finds the fields' comments in this file's source
    return cls


def training_arguments(args: Args, validate: bool) -> "TrainingArguments":  # noqa: F821
    from transformers import TrainingArguments

    from dare.trainers.distributed import checkpointing_args, mixed_precision, process_group_args

    return TrainingArguments(
        output_dir=args.output_dir, learning_rate=args.learning_rate, optim=args.optim, weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, max_grad_norm=args.max_grad_norm,
        lr_scheduler_type=args.lr_scheduler_type, warmup_steps=args.warmup_steps, max_steps=args.max_steps,
        num_train_epochs=args.num_train_epochs, bf16=mixed_precision(args.bf16),
        **checkpointing_args(args.gradient_checkpointing), logging_steps=args.logging_steps,
        save_steps=args.save_steps, save_total_limit=args.save_total_limit, report_to=args.report_to,
        eval_strategy="steps" if validate else "no", eval_steps=args.eval_steps if validate else None,
        eval_on_start=args.eval_on_start and validate, seed=args.seed, remove_unused_columns=False,
        dataloader_pin_memory=False, **process_group_args())


def online(args: Args, config, tokenizer, family) -> partial:
    """The ``rl`` trainer: prompts, rewards, the rollout's decoding and its engine, checked; TrainingArguments."""
    from dare.data.rl import check_drawings, fitting_prompts
    from dare.likelihood import check_scoring
    from dare.models import pictures
    from dare.models.loading import max_positions
    from dare.rewards.routing import RewardRouter
    from dare.trainers.flags import batch_shape
    from dare.trainers.rl import DiffusionRLTrainer
    from dare.trainers.rollout_modes import get_rollout_mode

    algo, engine, positions = args.algo_config, get_engine(args.rollout_engine), max_positions(config)
    rewards = RewardRouter(args.rewards)
    reader = pictures(config) if family.pictures else None  # LLaDA-V: prompts may hold pictures
    if reader is not None and (args.pack or args.sequence_parallel > 1 or engine.name != "hf" or algo.needs_value):
        raise ValueError(f"{family.name} reads pictures: pack, sequence_parallel > 1, a value model and rollout "
                         "engines other than hf do not take them yet: unset them")
    check_decoding(engine, algo.rollout_sampling(family, args.rollout), family, "rollout", 0, positions,
                   engine_options(args, engine.name))  # the decoding's own errors before the data loads
    train, longest = fitting_prompts(tokenizer, args.data.path, args.data.split, args.data, args.data.limit, reader)
    evaluation, longest_eval = (fitting_prompts(tokenizer, args.data.eval_path, args.data.eval_split, args.data,
                                                args.data.eval_limit, reader) if args.data.eval_path else (None, 0))
    rewards.check({r["data_source"] for r in train + (evaluation or [])})
    rewards.check_rows(train + (evaluation or []))
    check_drawings(train + (evaluation or []), algo)
    sampling = check_decoding(engine, algo.rollout_sampling(family, args.rollout), family, "rollout", longest,
                              positions, engine_options(args, engine.name))
    check_scoring(family, sampling)
    algo.check_engine(engine)
    algo.check_dynamic_sampling(sampling)
    validation = args.validation.over(args.rollout)
    if evaluation is not None:
        validation = check_decoding(engine, validation, family, "validation", longest_eval, positions)
    server = engine.server(args.model, tokenizer, family, options=engine_options(args, engine.name),
                           max_batch_size=args.rollout_batch_size)  # its checks run before the weights load
    get_rollout_mode(args.rollout_mode).check(args, server)
    training_args = training_arguments(args, evaluation is not None and args.eval_steps > 0)
    training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps = batch_shape(
        args, training_args.world_size, algo.streams(family, sampling))
    return partial(DiffusionRLTrainer, args=training_args, algorithm=algo, family=family, processing_class=tokenizer,
                   train_rows=train, eval_rows=evaluation, rewards=rewards, sampling=sampling,
                   eval_sampling=validation, num_generations=args.num_generations,
                   rollout_batch_size=args.rollout_batch_size, reward_workers=args.reward_workers,
                   log_completions=args.log_completions, console=args.console,
                   sequence_parallel=args.sequence_parallel, pack=args.pack, engine=server,
                   truncated_is_wrong=args.truncated_is_wrong, rollout_mode=args.rollout_mode, pictures=reader)


def preference(args: Args, config, tokenizer, family) -> partial:
    """The ``preference`` trainer: the ``preference`` pairs, checked; TrainingArguments (rollout, reward and RL-data
    knobs unused)."""
    from dare.data.preference import pair_rows
    from dare.trainers.flags import data_parallel_size
    from dare.trainers.preference import PreferenceTrainer

    data = args.preference
    train = pair_rows(data.path, data.split, data, data.limit, swap=data.swap)
    evaluation = pair_rows(data.eval_path, data.eval_split, data, data.eval_limit) if data.eval_path else None
    training_args = training_arguments(args, evaluation is not None and args.eval_steps > 0)
    world = data_parallel_size(args, training_args.world_size)
    if args.micro_batch_size % 2 or args.prompts_per_step % (world * args.micro_batch_size // 2):
        raise ValueError(f"micro_batch_size={args.micro_batch_size} must be even (chosen + rejected rows) and "
                         f"prompts_per_step={args.prompts_per_step} pairs a multiple of micro_batch_size / 2 x "
                         f"{world} processes")
    pairs = args.micro_batch_size // 2
    training_args.per_device_train_batch_size = training_args.per_device_eval_batch_size = pairs
    training_args.gradient_accumulation_steps = args.prompts_per_step // (world * pairs)
    return partial(PreferenceTrainer, args=training_args, algorithm=args.algo_config, family=family,
                   processing_class=tokenizer, train_pairs=train, eval_pairs=evaluation, data=data,
                   console=args.console, sequence_parallel=args.sequence_parallel, pack=args.pack)


TRAINERS = {"rl": online, "preference": preference}  # the trainer an algorithm names (Algorithm.trainer)


def main(args: Args) -> "DiffusionRLTrainer | PreferenceTrainer":  # noqa: F821
    import torch
    from transformers import set_seed

    from dare.lora import apply_lora
    from dare.models.loading import check_attention, load_config, load_weights
    from dare.trainers import fit, start_or_resume
    from dare.trainers.flags import check_rl_counts, check_training_flags

    set_seed(args.seed)
    check_training_flags(args)
    args.lora.validate()
    check_rl_counts(args)
    check_attention(args.attn_implementation, training=True)
    checkpoint = start_or_resume(args)
    config, tokenizer, family = load_config(args.model)  # every check below runs before the weights load
    args.algo_config.validate(family)
    build = TRAINERS[args.algo_config.trainer](args, config, tokenizer, family)  # its data, checks and engine
    model = load_weights(args.model, config, getattr(torch, args.dtype), args.attn_implementation)
    trainer = build(apply_lora(model, args.lora, args.gradient_checkpointing, args.model))
    merged = f"{args.output_dir}/merged" if args.lora.rank > 0 and args.export_merged else None
    return fit(trainer, checkpoint, merged, settings=args)


if __name__ == "__main__":
    run(main, lambda: parse(args_class(peek("algo", default="d1")), groups=HELP_GROUPS))
