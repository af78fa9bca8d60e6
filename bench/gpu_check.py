r"""The GPU check, one command: for a random ~1B-parameter model of every family, built here (no download), one table
of bf16 numerics, decoding speed, and SFT / RL step time and peak memory (257 s on one H200 with `--lengths 256 512`;
docs/benchmarks.md "On a GPU" has that table).

    # here, once (a GPU machine with torch but no network: the wheels it lacks):
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 -d .whl -r bench/gpu_wheels.txt
    # there (carry .whl):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    python3 bench/gpu_check.py --lengths 256 512  # the table, on cuda (bench/results/h200-*/run.sh: both benches)
    python bench/gpu_check.py --dry-run          # tiny models on CPU in seconds: what the test suite runs

What each row measures: bench/README.md.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dare.algos import get_algorithm  # noqa: E402
from dare.engines import HFEngine  # noqa: E402
from dare.models import Family, tiny  # noqa: E402
from dare.objectives import sft_loss  # noqa: E402
from dare.sampling import SamplingConfig, generate  # noqa: E402

DENSE = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=16,
             num_key_value_heads=4)
ONE_B = {
    "llada": dict(d_model=2048, n_heads=16, n_kv_heads=16, n_layers=16, mlp_hidden_size=5632),
    "dream": DENSE,
    "sdar": {**DENSE, "head_dim": 128},
    "llada2": dict(hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1024, num_hidden_layers=16,
                   num_attention_heads=16, num_key_value_heads=4, head_dim=128, num_experts=8, num_experts_per_tok=2,
                   n_group=4, topk_group=2),
    "sdar_moe": dict(hidden_size=2048, moe_intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16,
                     num_key_value_heads=4, head_dim=128, num_experts=8, num_experts_per_tok=2),
    "diffusion_gemma": dict(hidden_size=1536, intermediate_size=4096, moe_intermediate_size=1024, num_hidden_layers=12,
                            num_attention_heads=16, num_key_value_heads=4, head_dim=128, global_head_dim=128,
                            sliding_window=512, layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2,
                            num_experts=8, top_k_experts=2, canvas_length=256),
}
DRY = {"diffusion_gemma": dict(canvas_length=16)}  # the dry run's lengths are whole canvases


class Bench:
    def __init__(self, dry: bool, lengths=None):
        self.dry = dry
        self.device = "cpu" if dry else "cuda"
        self.lengths = (16, 32) if dry else tuple(lengths or (256, 1024))
        self.rows = []

    def build(self, family: str, dtype=torch.bfloat16):
        with torch.device(self.device):  # random init on the GPU: seconds less per ~1B model than on its CPU
            model, tok = tiny(family, **(DRY.get(family, {}) if self.dry else ONE_B[family]))
        model = model.to(self.device, dtype)
        return model, tok, Family.from_pretrained(model.config, tok)

    def sync(self):
        if not self.dry:
            torch.cuda.synchronize()

    def reset_peak(self):
        if not self.dry:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self):
        return None if self.dry else torch.cuda.max_memory_allocated() / 2 ** 30

    def add(self, family, row, value, unit, peak=None, estimate=None):
        self.rows.append((family, row, value, unit, peak, estimate))
        fmt = lambda v: "—" if v is None else f"{v:.2f}"
        print(f"| {family} | {row} | {value:.4g} {unit} | {fmt(peak)} | {fmt(estimate)} |", flush=True)


def numerics(b: Bench, family: str):
    model, tok, fam = b.build(family, torch.float32)
    ids = torch.randint(20, len(tok), (2, 32 if b.dry else 256), generator=torch.Generator().manual_seed(0))
    ids = ids.to(b.device)
    score = lambda m: fam.logits(m, ids).float()
    if fam.noise == "uniform":  # DiffusionGemma: the second half as canvases of random tokens after the first
        half = ids.shape[1] // 2
        noisy = ids.clone()
        noisy[:, half:] = torch.randint_like(noisy[:, half:], 20, len(tok))
        start = torch.full((len(ids),), half, device=ids.device)
        score = lambda m: fam.logits(m, noisy, clean_ids=ids, start=start)[:, half:].float()
    with torch.no_grad():
        exact = score(model)
        low = score(model.to(torch.bfloat16))
    b.add(family, "numerics: max |bf16 - fp32| / std", float((low - exact).abs().max() / exact.std()), "")
    b.add(family, "numerics: argmax agreement", float((low.argmax(-1) == exact.argmax(-1)).double().mean()), "")
    params = sum(p.numel() for p in model.parameters())
    b.add(family, "parameters", params / 1e9, "B", estimate=params * 2 / 2 ** 30)
    return params


def decoding(b: Bench, family: str):
    model, tok, fam = b.build(family)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    prompts = torch.randint(20, len(tok), (8, 64), generator=torch.Generator().manual_seed(1)).to(b.device)
    variants = {"mask": (("plain", {}), ("dual cache + threshold", dict(cache="dual", threshold=0.9))),
                "block": (("no cache", dict(cache="none")), ("block cache + threshold", dict(cache="block",
                                                                                          threshold=0.9))),
                "uniform": (("entropy bound", {}), ("entropy bound, argmax proposals", dict(temperature=0.0)))}
    kind = "uniform" if fam.noise == "uniform" else "block" if fam.is_block_diffusion else "mask"
    for length in b.lengths:
        for name, knobs in variants[kind]:
            extra = dict(block_length=min(32, length)) if kind == "mask" else {}
            config = SamplingConfig(gen_length=length, stop_at_eos=kind == "uniform", **extra, **knobs)
            b.sync()
            start = time.perf_counter()
            with torch.no_grad():
                out = generate(model, fam, prompts, None, config)
            b.sync()
            seconds = time.perf_counter() - start
            b.add(family, f"decode {name} @ {length}", out.sequences.numel() / seconds, "tok/s")
            b.add(family, f"decode {name} @ {length}: forwards per token", out.nfe / length, "")


def sft_steps(b: Bench, family: str, params: int):
    from dare.lora import LoraArgs, apply_lora
    for lora in (False, True):
        for ckpt in (False, True):
            model, tok, fam = b.build(family)
            if ckpt:
                model.gradient_checkpointing_enable()
            model = apply_lora(model, LoraArgs(rank=64 if lora else 0, alpha=128), gradient_checkpointing=ckpt)
            model.train()
            trained = [p for p in model.parameters() if p.requires_grad]
            optimiser = torch.optim.AdamW(trained, lr=1e-5)
            width = 64 if b.dry else 1024
            ids = torch.randint(20, len(tok), (4, width), generator=torch.Generator().manual_seed(2)).to(b.device)
            loss_mask = torch.zeros_like(ids)
            loss_mask[:, width // 4:] = 1
            b.reset_peak()
            times = []
            for _ in range(1 if b.dry else 3):
                b.sync()
                start = time.perf_counter()
                loss = sft_loss(model, fam, ids, loss_mask, torch.ones_like(ids))
                loss.backward()
                optimiser.step()
                optimiser.zero_grad(set_to_none=True)
                b.sync()
                times.append(time.perf_counter() - start)
            n = sum(p.numel() for p in trained)
            estimate = (params * 2 + n * (2 + 4 + 2)) / 2 ** 30  # bf16 weights; grads, 2 AdamW states, bf16
            b.add(family, f"sft{' lora' if lora else ''}{' ckpt' if ckpt else ''}: s / step", min(times), "s",
                  b.peak_gib(), estimate)
            del model, optimiser


def rl_step(b: Bench, family: str):
    model, tok, fam = b.build(family)
    algo = get_algorithm("d1")().validate(fam)
    engine = HFEngine(model, tok, fam)
    fast = {} if fam.noise == "uniform" else dict(cache="block", threshold=0.9) if fam.is_block_diffusion else \
        dict(cache="dual", threshold=0.9, block_length=32)
    config = algo.rollout_sampling(fam, SamplingConfig(gen_length=16 if b.dry else 256, temperature=1.0,
                                                       stop_at_eos=fam.noise == "uniform",
                                                       **({} if b.dry and not fam.is_block_diffusion else fast)))
    prompts = ["What is 12 + 30? Answer with the number."] * 8
    b.reset_peak()
    b.sync()
    start = time.perf_counter()
    rollout = algo.rollout(engine, prompts, 4, config, 0)
    b.sync()
    b.add(family, "rl d1: rollout s (8 x 4 completions)", time.perf_counter() - start, "s")
    rewards = torch.rand(len(rollout.texts), generator=torch.Generator().manual_seed(3)).to(b.device)
    batch = algo.make_batch(fam, rollout, rewards, 4, None, 0, config)
    batch["noise"] = [algo.corrupt(fam, batch, torch.Generator(b.device).manual_seed(4), config)]
    model.train()
    start = time.perf_counter()
    loss, _ = algo.step_loss(model, fam, batch, 0, 0, algo.normaliser(fam, batch, config), config)
    loss.backward()
    b.sync()
    b.add(family, "rl d1: loss + backward s", time.perf_counter() - start, "s", b.peak_gib())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="tiny models on CPU, short lengths: checks the script runs")
    p.add_argument("--families", nargs="+", default=list(ONE_B), choices=list(ONE_B))
    p.add_argument("--lengths", nargs="+", type=int, default=[256, 1024], help="decoding lengths (GPU run)")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device; use --dry-run on CPU")
    b = Bench(args.dry_run, args.lengths)
    started = time.perf_counter()
    device = "CPU (dry run)" if b.dry else torch.cuda.get_device_name()
    print(f"DARE GPU check on {device}; torch {torch.__version__}\n")
    print("| family | measure | value | peak GiB | estimate GiB |\n|---|---|---|---|---|")
    for family in args.families:
        params = numerics(b, family)
        decoding(b, family)
        sft_steps(b, family, params)
        rl_step(b, family)
    print(f"\nwall time {time.perf_counter() - started:.0f} s")
    return b.rows


if __name__ == "__main__":
    main()
