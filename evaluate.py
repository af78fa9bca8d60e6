"""Evaluate a diffusion LM on built-in benchmarks, talk to it, or generate for one prompt (with its speed).

    python evaluate.py --model GSAI-ML/LLaDA-8B-Instruct --bench gsm8k,math500 --gen-length 256 --block-length 8
    accelerate launch evaluate.py --model JetLM/SDAR-8B-Chat --bench humaneval,mbpp --data-dir ../shared/data/rl/test
    python evaluate.py --model tiny:llada --bench task:addition --limit 20 --gen-length 16 \\
        --output-dir outputs/eval-tiny
    python evaluate.py --compare outputs/eval-base/report.json outputs/eval-rl/report.json --plot compare.png
    python evaluate.py --model GSAI-ML/LLaDA-8B-Instruct --prompt "What is 15 * 4?" --gen-length 128 --steps 128
    python evaluate.py --model JetLM/SDAR-8B-Chat --threshold 0.9   # interactive chat (empty line or Ctrl-D quits)
    python evaluate.py --model tiny:llada --prompt "Hi" --cache dual --threshold 0.9   # offline, random tiny model
    python evaluate.py --model tiny:sdar --prompt "Hi" --trajectory trajectory.html     # replay the unmasking order
    python evaluate.py --model Gen-Verse/MMaDA-8B-MixCoT --prompt "A red apple on a table" --draw apple.png
    python evaluate.py --model JetLM/SDAR-8B-Chat --engine sglang --bench gsm8k --threshold 0.9   # SGLang's environment
    python evaluate.py --model GSAI-ML/LLaDA-8B-Instruct --protocol d1 --bench gsm8k,math500,countdown,sudoku \
        --data-dir ../shared/data/rl/test --gen-length 256   # d1's protocol (docs/evaluation.md "Reproducing")

Every sampling knob of dare.sampling.SamplingConfig is a flag (see --help); ``--model`` takes a hub name, a local
folder or ``tiny:<family>``; ``--config`` YAML files set the defaults. Benchmarks are scored by the RL rewards
(math-verify, sandboxed code execution). Samples are appended to ``<output-dir>/samples.<rank>.jsonl`` as they
finish, with a fingerprint of what made them (model, weights, sampling knobs, seed, batching, prompt; in full in
``fingerprint.json``): a rerun skips the matching ones and refuses a folder made by another model or other settings
(``--overwrite`` recomputes). ``report.json`` / ``report.md`` hold accuracy, pass@k, tokens/s and forward passes per
token (of the samples decoded in this run) for every benchmark. Under ``accelerate launch`` the prompts are sharded
over the processes.
"""

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import tyro

from dare.config import parse, run
from dare.engines import check_decoding, engine_options, get_engine, make_engine, with_engine_options
from dare.eval.protocols import get_protocol
from dare.sampling import SamplingConfig

# Only what the flags need is imported here, so that --help answers at once; the rest inside the functions below.


@dataclass
class Args:
    """Evaluate, chat with, or generate from a diffusion LM."""

    model: str = ""  # hub name, local folder, or tiny:<family>
    # what decodes: hf (DARE's samplers in-process, every family) | sglang (block families, SGLang's environment;
    # docs/sglang.md)
    engine: str = "hf"
    prompt: str | None = None  # generate for this prompt and exit; omit for an interactive chat
    system: str | None = None  # optional system message
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2 | flex_attention
    seed: int = 0
    show_order: bool = False  # also print the step at which each generated token was fixed
    trajectory: str | None = None  # write an HTML page replaying the decoding order of the (last) answer here
    # with --prompt and a model that draws (MMaDA): draw the prompt as a picture into this PNG file instead of answering
    draw: str | None = None
    draw_steps: int = 15  # --draw's MaskGIT steps (MMaDA's README: 15)
    draw_guidance: float = 3.5  # --draw's classifier-free guidance g: (1 + g) cond - g uncond; 0 reads the prompt once
    draw_temperature: float = 1.0  # --draw's confidence noise at the first step (annealed at each)
    # comma-separated benchmarks: gsm8k, math500, aime24, aime25, humaneval, mbpp, countdown, sudoku, task:<generated
    # task>; with pictures (a model that reads them): mathvista, chartqa, task:shapes; drawings (MMaDA): task:colours
    bench: str | None = None
    # how prompts are written, answers read, decoding set and results counted: dare | d1 (d1's zero-shot scripts;
    # `python -m dare.eval.protocols` lists every value and its source). A protocol's decoding settings fill the
    # knobs left at their defaults
    protocol: str = "dare"
    # read the benchmarks from the reference's parquet files here (e.g. ../shared/data/rl/test), not the hub (mathvista,
    # chartqa: a copy of the hub's own files, e.g. a snapshot folder holding data/testmini-*.parquet)
    data_dir: str | None = None
    limit: int | None = None  # first N prompts of each benchmark
    samples: int | None = None  # completions per prompt (default: the benchmark's; AIME 8)
    pass_k: list[int] = field(default_factory=lambda: [1])  # report pass@k for these k (needs samples >= k)
    batch_size: int = 16  # prompts decoded together
    output_dir: str = "outputs/eval"
    overwrite: bool = False  # recompute: first delete the samples/report/fingerprint evaluate.py wrote in output_dir
    compare: list[str] | None = None  # report.json files to put side by side (no model needed)
    plot: str | None = None  # with --compare: write a bar chart PNG here


Args = with_engine_options(Args)  # + the options of each engine that has them (sglang: --mem-fraction, --tp, ...)


HELP_GROUPS = {
    "what to run": "model engine bench protocol prompt system compare plot",
    "drawing (MMaDA)": "draw draw_steps draw_guidance draw_temperature",
    "benchmarks": "data_dir limit samples pass_k batch_size output_dir overwrite",
    "the model": "dtype device attn_implementation seed",
    "decoding (every SamplingConfig knob; docs/decoding.md)": "sampling",
    "watching it decode": "show_order trajectory",
    "engine options (--engine hf: compiled decoding; sglang: docs/sglang.md)": "hf sglang"}


def answer(engine, messages: list[dict], args: Args) -> str:
    from dare.eval.trajectory import committed_confidences, write_trajectory_html

    config = replace(args.sampling, record_states=True) if args.trajectory else args.sampling  # + confidences
    rollout = engine.generate([messages], config=config, seed=args.seed)
    text = rollout.texts[0]
    print(text)
    print(f"[{rollout.num_tokens} tokens in {rollout.seconds:.2f}s = {rollout.tokens_per_second:.1f} tokens/s, "
          f"{rollout.nfe} forward passes]", file=sys.stderr)
    if args.show_order:
        print(f"[decoding step per token: {rollout.step_map[0].tolist()}]", file=sys.stderr)
    if args.trajectory:
        block = engine.family.block_size or args.sampling.block_length
        write_trajectory_html(args.trajectory, engine.tokenizer, rollout.completion_ids[0], rollout.step_map[0],
                              block, title=f"{args.model}: decoding order", prompt=messages[-1]["content"],
                              confidences=committed_confidences(rollout.states, rollout.confidences,
                                                                engine.family.mask_id))
        print(f"[trajectory written to {args.trajectory}]", file=sys.stderr)
    return text


def process_state():
    """This process's place under ``accelerate launch`` (``cpu=True`` is what makes CPU launches multi-process)."""
    from accelerate import PartialState
    return PartialState(cpu=not torch.cuda.is_available())


def benches(args: Args) -> list[str]:
    return [b.strip() for b in args.bench.split(",") if b.strip()]


def run_benchmarks(args: Args, engine, max_positions: int | None = None) -> dict:
    from dare.eval import harness

    return harness.evaluate_benchmarks(  # samples of another run: StaleSamples, a user error (exit 2, one line)
        engine, benches(args), args.sampling, Path(args.output_dir), data_dir=args.data_dir, limit=args.limit,
        samples=args.samples, pass_k=args.pass_k, batch_size=args.batch_size, seed=args.seed,
        model_name=args.model, state=process_state(), overwrite=args.overwrite,
        protocol=get_protocol(args.protocol), max_positions=max_positions)


def check_modes(args: Args) -> None:
    """Flags that contradict each other, or a count out of range, as one line before anything loads."""
    if args.compare and (args.model or args.bench or args.prompt is not None):
        raise ValueError("--compare reads finished reports: drop --model/--bench/--prompt (or run them separately)")
    if args.plot and not args.compare:
        raise ValueError("--plot draws a --compare chart: give --compare A/report.json B/report.json ...")
    if args.prompt is not None and args.bench:
        raise ValueError("--prompt (one answer) and --bench (benchmarks) are two modes: give one of them")
    if args.draw and (args.prompt is None or args.engine != "hf"):
        raise ValueError("--draw draws --prompt as a picture with --engine hf: give --prompt TEXT")
    if args.draw:
        from dare.sampling.maskgit import DrawConfig
        DrawConfig(args.draw_steps, args.draw_guidance, args.draw_temperature)  # a knob out of range: one line
    for name in ("limit", "samples", "batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    if any(k < 1 for k in args.pass_k):
        raise ValueError(f"--pass-k values must be at least 1 (got {args.pass_k})")
    if args.bench:
        from dare.eval.benchmarks import BENCHMARKS
        for bench in benches(args):
            n = args.samples or (BENCHMARKS[bench].samples if bench in BENCHMARKS else 1)
            if max(args.pass_k) > n:
                raise ValueError(f"--pass-k {max(args.pass_k)} needs at least that many samples per prompt; {bench} "
                                 f"has {n}: add --samples {max(args.pass_k)}")


def main(args: Args):
    if not args.model and not args.compare:  # before the imports: torch and transformers take seconds
        raise ValueError("--model is required (a hub name, a local folder or tiny:<family>)")
    from dare.eval import report
    from dare.models import pictures
    from dare.models.loading import check_attention, load_config, load_weights, max_positions

    check_modes(args)
    check_attention(args.attn_implementation, training=False)
    if args.compare:
        print(report.compare(args.compare, args.plot))
        return
    kind = get_engine(args.engine)
    protocol = get_protocol(args.protocol)
    if args.bench:
        for bench in benches(args):
            protocol.task(bench)  # a benchmark the protocol does not cover fails before anything loads
        args = replace(args, sampling=protocol.sampling(args.sampling))
    elif args.protocol != "dare":
        raise ValueError("--protocol applies to --bench runs")
    config, tokenizer, family = load_config(args.model)  # the sampling settings are checked before the weights load
    if args.draw and not hasattr(pictures(config), "drawing_prompts"):
        raise ValueError(f"--draw: a {family.name} model draws no pictures (MMaDA does)")
    check_decoding(kind, args.sampling, family, "sampling", 0, max_positions(config), engine_options(args, kind.name))
    if (args.show_order or args.trajectory) and not kind.own_samplers:
        raise ValueError("--show-order and --trajectory show DARE's recorded decoding steps: use --engine hf")
    model = None
    if kind.needs_weights:
        dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
        device = process_state().device if args.bench and process_state().num_processes > 1 else args.device
        model = load_weights(args.model, config, dtype, args.attn_implementation).to(device).eval()
    engine = make_engine(args.engine, args.model, tokenizer, family, model=model,
                         options=engine_options(args, kind.name), max_batch_size=args.batch_size * (args.samples or 8),
                         gpu=process_state().local_process_index if torch.cuda.is_available() else None)
    try:
        serve(args, engine, family, max_positions(config))
    finally:
        engine.close()


def utf8(text: str, what: str) -> str:
    """``text`` if it is valid UTF-8 (a terminal in another encoding gives Python undecodable bytes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid UTF-8 text (set your terminal or file to UTF-8)") from None
    return text


def serve(args: Args, engine, family, positions: int | None = None):
    if args.bench:
        run_benchmarks(args, engine, positions)
        return
    if args.draw:
        from dare.sampling.maskgit import DrawConfig, draw

        knobs = DrawConfig(args.draw_steps, args.draw_guidance, args.draw_temperature)
        draw(engine.model, engine.tokenizer, [utf8(args.prompt, "--prompt")], knobs, args.seed)[0].save(args.draw)
        print(f"[picture written to {args.draw}]", file=sys.stderr)
        return
    history = [{"role": "system", "content": utf8(args.system, "--system")}] if args.system else []
    if args.prompt is not None:
        answer(engine, history + [{"role": "user", "content": utf8(args.prompt, "--prompt")}], args)
        return
    print(f"Chatting with {args.model} ({family.name}). Empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            break
        if not line:
            break
        try:
            history.append({"role": "user", "content": utf8(line, "the input line")})
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            continue
        history.append({"role": "assistant", "content": answer(engine, history, args)})


if __name__ == "__main__":
    run(main, lambda: parse(Args, config=(tyro.conf.OmitArgPrefixes,), groups=HELP_GROUPS,
                            pages="docs/evaluation.md"))
