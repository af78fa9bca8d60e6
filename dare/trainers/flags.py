"""The flags every training script shares (``train_sft.py``, ``train_rl.py``) and ``train_rl.py``'s batch arithmetic,
checked before anything loads: a value
that would be misread in silence (``--max-steps 0`` trains one step, ``-5`` a whole epoch) or end in a traceback
minutes later (an accumulation of 0, a backend that is not installed) is one ``error:`` line."""

import importlib.util

# --dtype: the usual spellings of the two weight dtypes training takes
DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
REFUSED_DTYPES = {"float16": "fp16 weights overflow in training: use bfloat16, or float32 with --bf16",
                  "fp16": "fp16 weights overflow in training: use bfloat16, or float32 with --bf16",
                  "float64": "DARE trains in float32 (master weights) or bfloat16"}
# --report-to: the backend and the package it needs
REPORTERS = {"none": None, "tensorboard": "tensorboard", "wandb": "wandb"}


def check_training_flags(args) -> None:
    """One-line errors for the shared training flags of ``args`` (its ``dtype`` set to the canonical name)."""
    if args.max_steps != -1 and args.max_steps < 1:
        raise ValueError(f"--max-steps must be at least 1 (or -1: train --num-train-epochs), got {args.max_steps}")
    if args.max_steps == -1 and not args.num_train_epochs > 0:
        raise ValueError(f"--num-train-epochs must be > 0 when --max-steps is -1, got {args.num_train_epochs}")
    for knob in ("gradient_accumulation_steps", "per_device_train_batch_size", "logging_steps", "save_steps",
                 "save_total_limit"):
        if getattr(args, knob, 1) < 1:
            raise ValueError(f"--{knob.replace('_', '-')} must be at least 1, got {getattr(args, knob)}")
    for knob in ("learning_rate", "warmup_steps", "weight_decay", "max_grad_norm", "eval_steps"):
        if getattr(args, knob, 0) < 0:
            raise ValueError(f"--{knob.replace('_', '-')} must be >= 0, got {getattr(args, knob)}")
    dtype = args.dtype.lower()
    if dtype in REFUSED_DTYPES:
        raise ValueError(f"--dtype {args.dtype}: {REFUSED_DTYPES[dtype]}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {args.dtype!r} is not one of {sorted(DTYPES)}")
    args.dtype = DTYPES[dtype]
    if args.resume_must and not args.resume:
        raise ValueError("--resume-must says what --resume does when there is nothing to resume: add --resume")
    if args.report_to not in REPORTERS:
        raise ValueError(f"--report-to {args.report_to!r} is not one of {list(REPORTERS)}")
    package = REPORTERS[args.report_to]
    if package and importlib.util.find_spec(package) is None:
        raise ValueError(f"--report-to {args.report_to}: the {package} package is not installed (pip install "
                         f"{package}), or use --report-to none")


def check_rl_counts(args) -> None:
    """``train_rl.py``'s batch counts of at least one (two completions per prompt for a group advantage), before
    anything loads; run after ``check_training_flags``."""
    least = {"prompts_per_step": 1, "micro_batch_size": 1, "rollout_batch_size": 1,
             "num_generations": 2 if args.algo_config.trainer == "rl" else 1}  # logging / save steps: above
    for knob, low in least.items():
        if getattr(args, knob) < low:
            why = " (a group advantage compares completions of one prompt)" if knob == "num_generations" else ""
            raise ValueError(f"--{knob.replace('_', '-')} must be at least {low}{why}, got {getattr(args, knob)}")


def data_parallel_size(args, world: int) -> int:
    """Processes / sequence_parallel: a sequence-parallel group shares its prompts (or pairs)."""
    if world % args.sequence_parallel:
        raise ValueError(f"sequence_parallel={args.sequence_parallel} must divide the {world} processes")
    return world // args.sequence_parallel


def batch_shape(args, world: int, streams: int) -> tuple[int, int]:
    """(prompts per process, micro-steps per optimiser step = micro-batches of a mini-batch x the algorithm's
    ``streams``), and a checkpoint cadence that falls between cycles."""
    world, algo = data_parallel_size(args, world), args.algo_config
    if args.prompts_per_step % world:
        raise ValueError(f"prompts_per_step={args.prompts_per_step} must be a multiple of the {world} data-parallel "
                         "process groups")
    completions = args.prompts_per_step // world * args.num_generations
    if completions % (args.micro_batch_size * algo.mini_batches):
        raise ValueError(f"{completions} completions per device are not a multiple of micro_batch_size="
                         f"{args.micro_batch_size} x mini_batches={algo.mini_batches}")
    if args.save_steps % algo.cycle:
        raise ValueError(f"save_steps ({args.save_steps}) must be a multiple of num_iterations x mini_batches "
                         f"({algo.cycle}): a checkpoint inside a cycle could not resume exactly")
    return args.prompts_per_step // world, completions // args.micro_batch_size // algo.mini_batches * streams
