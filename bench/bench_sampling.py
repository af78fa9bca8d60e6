"""Decoding speed of every sampler path on random models: Fast-dLLM prefix / dual cache (and dInfer's vicinity
refresh of the dual cache) and confidence-threshold parallel decoding for masked diffusion (LLaDA, Dream); block KV
cache and static vs dynamic unmasking for block diffusion (SDAR, LLaDA2); autoregressive decoding, blocks against a
causal context and self-speculation for Nemotron-Labs-Diffusion. One run prints the three tables.

    python bench/bench_sampling.py            # tiny + 1-layer LLaDA/Dream, 57M LLaDA; tiny SDAR/LLaDA2, 51M SDAR
    python bench/bench_sampling.py --quick    # smoke run: tiny models only, gen length 64 (< 30 s)
    python bench/bench_sampling.py --sharpen 1 --tiny-sharpen 1      # raw random models: threshold never reached
    python bench/bench_sampling.py --large-masked --large-block      # tiny models only, gen length 256
    python bench/bench_sampling.py --jobs 1 --large-batch 4 --large-masked llada dream   # sequential, bigger
    python bench/bench_sampling.py --large-masked --large-block --model outputs/standin-llada   # + a trained stand-in
    python bench/bench_sampling.py --masked --block --no-one-layer --large-masked --large-block \
        --model outputs/standin-nemotron_diffusion    # Nemotron's three modes on its trained stand-in

How each row is made and read: bench/README.md; the models and timed jobs: bench/_sampling_jobs.py.
"""

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time

import torch
from _sampling_jobs import BLOCK_METHODS, CAUSAL_METHODS, COST, MASKED_METHODS, Spec, large_overrides, run_job

from dare.models.loading import load_config
from dare.sampling.primitives import CONFIDENCE


def revision() -> str:
    """The checked-out commit (``+dirty`` when tracked files differ), so a table can be tied to the code it timed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty=+dirty"], cwd=root, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def print_header():
    print("| model | params | method | nfe | tokens/s | fwd/token | model tok/token | speed-up | CPU speed-up | "
          "agreement | = no-cache twin | quality | wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def table_rows(spec, results):
    """Rows of one model, in method order, with the ratios against its reference and no-cache twins."""
    ref = results[spec.ref]
    rows = []
    for method, (_, twin) in spec.methods.items():
        r = results[method]
        agree = (r["seq"] == ref["seq"]).float().mean().item()
        twin_agree = (r["seq"] == results[twin]["seq"]).float().mean().item()
        n = r["length"]
        score = "-" if r["quality"] is None else f"{r['quality']:.1%}"
        rows.append(f"| {spec.label} | {ref['info']['params'] / 1e6:.1f}M | {method} | {r['nfe']} | "
                    f"{spec.batch * n / r['wall']:,.1f} | {r['nfe'] / n:.3f} | {r['positions'] / n:.1f} | "
                    f"{ref['wall'] / r['wall']:.2f}x | {ref['cpu'] / r['cpu']:.2f}x | {agree:.1%} | "
                    f"{twin_agree:.1%} | {score} | {r['wall']:.2f} |")
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="smoke run: tiny models only, gen length 64, one repeat (< 30 s)")
    p.add_argument("--masked", nargs="*", default=["llada", "dream"], choices=["llada", "dream"],
                   help="masked-diffusion families benchmarked as tiny models (default: llada dream)")
    p.add_argument("--block", nargs="*", default=["sdar", "llada2"], choices=["sdar", "sdar_moe", "llada2"],
                   help="block-diffusion families benchmarked as tiny models (default: sdar llada2)")
    p.add_argument("--causal", nargs="*", default=["nemotron_diffusion"], choices=["nemotron_diffusion"],
                   help="families decoding against a causal context, tiny random (default nemotron_diffusion)")
    p.add_argument("--large-masked", nargs="*", default=["llada"], choices=["llada", "dream"],
                   help="masked-diffusion families also benchmarked at the large size (default: llada; none: "
                        "pass the flag with no value)")
    p.add_argument("--large-block", nargs="*", default=["sdar"], choices=["sdar"],
                   help="block-diffusion families also benchmarked at the large size (default: sdar)")
    p.add_argument("--no-one-layer", dest="one_layer", action="store_false",
                   help="skip the 1-layer tiny masked models (on which the Fast-dLLM caches are exact)")
    p.add_argument("--large-hidden", type=int, default=768, help="large model hidden size (default 768)")
    p.add_argument("--large-layers", type=int, default=8, help="large model layers (default 8)")
    p.add_argument("--large-heads", type=int, default=12, help="large model query heads (default 12)")
    p.add_argument("--large-kv-heads", type=int, default=4,
                   help="large model KV heads for Dream/SDAR (default 4; LLaDA is multi-head like LLaDA-8B)")
    p.add_argument("--large-mlp", type=int, default=2048, help="large model MLP inner size (default 2048)")
    p.add_argument("--gen-length", type=int, default=256, help="tokens generated per prompt (default 256)")
    p.add_argument("--block-length", type=int, default=32,
                   help="masked diffusion: semi-AR block length (default 32); block families use their own size")
    p.add_argument("--steps", type=int, default=0,
                   help="masked diffusion: total steps (default 0 = gen length, one token per step)")
    p.add_argument("--remasking", default="low_confidence", choices=sorted(CONFIDENCE),
                   help="confidence that ranks positions and meets the threshold (default low_confidence)")
    p.add_argument("--schedule", default="linear", choices=["linear", "dream", "family"],
                   help="masked diffusion: tokens per step without a threshold (default linear: the same even "
                        "split, here one token per step, for LLaDA and Dream; family: Dream's linspace schedule)")
    p.add_argument("--threshold", type=float, default=0.9,
                   help="confidence threshold of parallel / dynamic decoding (default 0.9)")
    p.add_argument("--sharpen", type=float, default=30.0,
                   help="large models: multiply the LM-head weights by this so random predictions are peaked "
                        "(default 30; 1 = off)")
    p.add_argument("--tiny-sharpen", type=float, default=100.0,
                   help="the same for tiny models (default 100: logits scale with sqrt(hidden), and "
                        "30 * sqrt(768 / 64) ~ 100 gives the tiny models the large models' logit scale)")
    p.add_argument("--batch", type=int, default=4, help="prompts per batch for tiny models (default 4)")
    p.add_argument("--large-batch", type=int, default=1, help="prompts per batch for large models (default 1)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per tiny-model row, min reported (default 2)")
    p.add_argument("--large-repeats", type=int, default=1, help="timed runs per large-model row (default 1)")
    p.add_argument("--jobs", type=int, default=2,
                   help="worker processes timing (model, method) jobs side by side, longest first (default 2; "
                        "1 = everything in this process, one after the other)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads per worker (default 1; 0 = torch's default)")
    p.add_argument("--seed", type=int, default=0, help="model initialisation seed (default 0)")
    p.add_argument("--model", nargs="*", default=[], metavar="FOLDER",
                   help="trained model folders also benchmarked, as saved (no sharpening), on held-out questions of "
                        "--model-task, e.g. the stand-ins of recipes/standin; fills the quality column")
    p.add_argument("--model-task", default="cycle",
                   help="generated task (dare.data.tasks) whose held-out questions prompt the --model folders "
                        "(default cycle, what recipes/standin trains)")
    p.add_argument("--model-batch", type=int, default=8, help="prompts per batch for --model folders (default 8)")
    p.add_argument("--model-repeats", type=int, default=1, help="timed runs per --model row (default 1)")
    a = p.parse_args()
    if a.quick:
        a.gen_length, a.repeats, a.large_masked, a.large_block = 64, 1, [], []

    masked_cfg = dict(gen_length=a.gen_length, block_length=a.block_length, steps=a.steps or a.gen_length,
                      temperature=0.0, remasking=a.remasking, schedule=None if a.schedule == "family" else a.schedule)
    block_cfg = dict(gen_length=a.gen_length, temperature=0.0, remasking=a.remasking, stop_at_eos=False)
    causal_cfg = dict(gen_length=a.gen_length, temperature=0.0, stop_at_eos=False)
    specs = []
    for fam in a.masked:
        specs.append(Spec("masked", f"{fam}-tiny", fam, {}, a.batch, a.repeats, a.tiny_sharpen, masked_cfg,
                          MASKED_METHODS, "plain", 0.05))
    for fam in a.masked if a.one_layer else []:
        one = dict(n_layers=1) if fam == "llada" else dict(num_hidden_layers=1)
        specs.append(Spec("masked", f"{fam}-1layer", fam, one, a.batch, 1, a.tiny_sharpen, masked_cfg,
                          MASKED_METHODS, "plain", 0.02))
    for fam in a.large_masked:
        specs.append(Spec("masked", f"{fam}-large", fam, large_overrides(fam, a), a.large_batch, a.large_repeats,
                          a.sharpen, masked_cfg, MASKED_METHODS, "plain", 10.0))
    for fam in a.block:
        specs.append(Spec("block", f"{fam}-tiny", fam, {}, a.batch, a.repeats, a.tiny_sharpen, block_cfg,
                          BLOCK_METHODS, "no cache, static", 0.05))
    for fam in a.causal:
        specs.append(Spec("causal", f"{fam}-tiny", fam, {}, a.batch, a.repeats, a.tiny_sharpen, causal_cfg,
                          CAUSAL_METHODS, "autoregressive", 0.05))
    for fam in a.large_block:
        specs.append(Spec("block", f"{fam}-large", fam, large_overrides(fam, a), a.large_batch, a.large_repeats,
                          a.sharpen, block_cfg, BLOCK_METHODS, "no cache, static", 10.0))
    for folder in a.model:
        fam = load_config(folder)[2]
        section, cfg, methods, ref = (("block", block_cfg, BLOCK_METHODS, "no cache, static") if fam.is_block_diffusion
                                      else ("causal", causal_cfg, CAUSAL_METHODS, "autoregressive")
                                      if fam.causal_block else ("masked", masked_cfg, MASKED_METHODS, "plain"))
        specs.append(Spec(section, os.path.basename(os.path.normpath(folder)), fam.name, {}, a.model_batch,
                          a.model_repeats, 1.0, cfg, methods, ref, 1.0, path=folder, task=a.model_task))
    jobs = [(s, m, a.threshold, a.seed, a.threads) for s in specs for m in s.methods]
    jobs.sort(key=lambda j: -j[0].weight * j[0].repeats * COST[j[1]])

    start = time.perf_counter()
    threads = a.threads or torch.get_num_threads()
    if a.jobs * threads > (os.cpu_count() or 1):
        print(f"warning: {a.jobs} jobs x {threads} threads > {os.cpu_count()} CPUs: OpenMP threads will fight over "
              "the cores and the timings will be noise", file=sys.stderr)
    print(f"DARE {revision()}, torch {torch.__version__}, {a.jobs} worker(s) x {threads} thread(s), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; temperature 0, {a.remasking}, "
          f"schedule {a.schedule}, threshold {a.threshold:g}, sharpen {a.sharpen:g} (tiny models {a.tiny_sharpen:g})",
          flush=True)
    results = {s.label: {} for s in specs}
    if a.jobs > 1:
        pool = mp.get_context("fork").Pool(a.jobs, maxtasksperchild=None)
        stream = pool.imap_unordered(run_job, jobs)
    else:
        pool, stream = None, map(run_job, jobs)
    for label, method, r in stream:
        results[label][method] = r
        print(f"[{time.perf_counter() - start:5.0f} s] {label} / {method}: {r['wall']:.2f} s, nfe {r['nfe']}",
              file=sys.stderr, flush=True)
    if pool is not None:
        pool.close()
        pool.join()

    for section, title in [("masked", f"Masked diffusion: gen length {a.gen_length}, block {a.block_length}, "
                                      f"{masked_cfg['steps']} steps; reference = plain"),
                           ("block", f"Block diffusion: gen length {a.gen_length}, steps per block = block size; "
                                     f"dynamic = threshold {a.threshold:g}, at least one token per step; "
                                     "reference = no cache, static"),
                           ("causal", f"Blocks against a causal context: gen length {a.gen_length}, the family's "
                                      f"block size, one step per token; threshold {a.threshold:g} (at least one "
                                      "token a step); reference = autoregressive")]:
        chosen = [s for s in specs if s.section == section]
        if not chosen:
            continue
        print(f"\n## {title}\n")
        for s in chosen:
            info = results[s.label][s.ref]["info"]
            what = f"trained ({s.path}), held-out task:{s.task} questions" if s.path else f"sharpen {s.sharpen:g}"
            print(f"* {s.label}: {s.family}, {info['params'] / 1e6:.2f}M params, batch {s.batch} x prompt "
                  f"{info['prompt']} (left padded), {what}: mean top-1 probability at masked positions of the "
                  f"initial canvas {info['top1']:.3f}")
        print()
        print_header()
        for s in chosen:
            for row in table_rows(s, results[s.label]):
                print(row)
    print(f"\ntotal {time.perf_counter() - start:.0f} s, load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
