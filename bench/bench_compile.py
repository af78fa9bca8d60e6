"""Compiled decoding against eager on the same model and prompts: PyTorch operator calls of one decoding step (the
profiler's events, nested calls included: what a GPU pays a launch for), decoding speed after the compilation, and
whether the greedy tokens are the same. The tiny models' output layer is scaled up 40x, as in
``tests/test_compiled_decoding.py``: a random model's confidences are near ties, which the 1e-7 rounding differences
of compiled kernels flip; scaled, they are far apart, as a trained model's are.

    python bench/bench_compile.py                          # every family the compile option serves, tiny models (CPU)
    python bench/bench_compile.py --families llada --batch 8 --gen-length 64
    python bench/bench_compile.py --layers 22   # the tiny models 22 layers deep: a real model's operators a step
    python bench/bench_compile.py --device cuda --dtype bfloat16 --mode reduce-overhead --gen-length 256  # a GPU
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dare.engines.hf import HFEngine, HFOptions  # noqa: E402
from dare.models import load_pretrained, save_tiny  # noqa: E402
from dare.sampling import SamplingConfig  # noqa: E402


def operator_calls(model, ids: torch.Tensor) -> int:
    """Profiler events of one forward over ``ids`` (a decoding step without cache), after a warm-up call: the host's
    operator calls, what a GPU pays a launch for."""
    mask = torch.ones_like(ids)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(input_ids=ids, attention_mask=mask)
    return len(prof.events())


def tiny_folder(name: str, layers: int | None) -> str:
    """``tiny:NAME``, or with ``layers``, a folder holding that tiny model built ``layers`` deep."""
    if layers is None:
        return f"tiny:{name}"
    folder = Path(tempfile.mkdtemp()) / name
    return save_tiny(name, folder, **{"n_layers" if name == "llada" else "num_hidden_layers": layers})


def decode(engine, prompts, config) -> tuple[torch.Tensor, float]:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    sync()
    start = time.perf_counter()
    out = engine.generate(prompts, 1, config, seed=0)
    sync()
    return out.completion_ids, time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["llada", "dream", "sdar", "sdar_moe", "llada2"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gen-length", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--mode", default="default", choices=["default", "reduce-overhead", "max-autotune"])
    parser.add_argument("--layers", type=int, help="layers of each tiny model (default: the tiny model's 2)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {args.threads} thread(s)"
    print(f"{where}, {args.dtype}, torch.compile mode {args.mode}, batch {args.batch}, {args.gen_length} tokens\n")
    print("| family | layers | operator calls a step, eager | compiled | fewer | graphs traced | first decoding "
          "(compiling) s | eager tok/s | compiled tok/s | speed-up | same greedy tokens |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.families:
        torch._dynamo.reset()
        model, tokenizer, family = load_pretrained(tiny_folder(name, args.layers), dtype=getattr(torch, args.dtype))
        with torch.no_grad():
            model.to(args.device).eval().get_output_embeddings().weight.mul_(40.0)
        prompts = [[{"role": "user", "content": f"What is {i} + {2 * i}?"}] for i in range(args.batch)]
        config = SamplingConfig(gen_length=args.gen_length, temperature=0.0)
        eager, compiled = HFEngine(model, tokenizer, family, args.batch), \
            HFEngine(model, tokenizer, family, args.batch, HFOptions(compile=True, compile_mode=args.mode))
        ids = torch.randint(10, 500, (args.batch, 24 + args.gen_length), device=args.device)
        calls = operator_calls(model, ids), operator_calls(compiled.decoder, ids)
        graphs = counters["stats"]["unique_graphs"]
        first = decode(compiled, prompts, config)[1]
        graphs = counters["stats"]["unique_graphs"] - graphs
        (a, t_eager), (b, t_compiled) = decode(eager, prompts, config), decode(compiled, prompts, config)
        tokens = args.batch * args.gen_length
        layers = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layers", "?")
        print(f"| {name} | {layers} | {calls[0]} | {calls[1]} | {calls[0] / calls[1]:.1f}x | {graphs} | {first:.1f} | "
              f"{tokens / t_eager:.0f} | {tokens / t_compiled:.0f} | {t_eager / t_compiled:.1f}x | "
              f"{torch.equal(a, b)} |", flush=True)


if __name__ == "__main__":
    main()
