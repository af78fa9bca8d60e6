"""Talk to a diffusion LM, or generate for one prompt, and see the answer with its speed.

    python evaluate.py --model GSAI-ML/LLaDA-8B-Instruct --prompt "What is 15 * 4?" --gen-length 128 --steps 128
    python evaluate.py --model JetLM/SDAR-8B-Chat --threshold 0.9          # interactive chat (empty line or Ctrl-D quits)
    python evaluate.py --model tiny:llada --prompt "Hi" --cache dual --threshold 0.9   # offline, random tiny model
    python evaluate.py --model tiny:sdar --prompt "Hi" --trajectory trajectory.html     # replay the unmasking order

Every sampling knob of dare.sampling.SamplingConfig is a flag (see --help); ``--model`` takes a hub name, a local
folder or ``tiny:<family>``.
"""

import sys
from dataclasses import dataclass, field

import torch
import tyro

from dare.engines import HFEngine
from dare.eval.trajectory import write_trajectory_html
from dare.models import load_pretrained
from dare.sampling import SamplingConfig


@dataclass
class Args:
    model: str  # hub name, local folder, or tiny:<family>
    prompt: str | None = None  # generate for this prompt and exit; omit for an interactive chat
    system: str | None = None  # optional system message
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2
    seed: int = 0
    show_order: bool = False  # also print the step at which each generated token was fixed
    trajectory: str | None = None  # write an HTML page replaying the decoding order of the (last) answer here


def answer(engine: HFEngine, messages: list[dict], args: Args) -> str:
    rollout = engine.generate([messages], config=args.sampling, seed=args.seed)
    text = rollout.texts[0]
    print(text)
    print(f"[{rollout.num_tokens} tokens in {rollout.seconds:.2f}s = {rollout.tokens_per_second:.1f} tokens/s, "
          f"{rollout.nfe} forward passes]", file=sys.stderr)
    if args.show_order:
        print(f"[decoding step per token: {rollout.step_map[0].tolist()}]", file=sys.stderr)
    if args.trajectory:
        block = engine.family.block_size or args.sampling.block_length
        write_trajectory_html(args.trajectory, engine.tokenizer, rollout.completion_ids[0], rollout.step_map[0],
                              block, title=f"{args.model}: decoding order")
        print(f"[trajectory written to {args.trajectory}]", file=sys.stderr)
    return text


def main(args: Args):
    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
    model, tokenizer, family = load_pretrained(args.model, dtype=dtype, attn_implementation=args.attn_implementation)
    engine = HFEngine(model.to(args.device).eval(), tokenizer, family)
    history = [{"role": "system", "content": args.system}] if args.system else []
    if args.prompt is not None:
        answer(engine, history + [{"role": "user", "content": args.prompt}], args)
        return
    print(f"Chatting with {args.model} ({family.name}). Empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            break
        if not line:
            break
        history.append({"role": "user", "content": line})
        history.append({"role": "assistant", "content": answer(engine, history, args)})


if __name__ == "__main__":
    main(tyro.cli(Args, config=(tyro.conf.OmitArgPrefixes,)))
