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

How each row is made and read: bench/README.md.
"""

import argparse
import itertools
import multiprocessing as mp
import os
import subprocess
import sys
import time

import torch
from _common import FedCounter

from dare.data.tasks import WORDS, make_task
from dare.engines.base import decode_completions
from dare.models import Family, load_pretrained, tiny
from dare.models.loading import load_config
from dare.rewards import get_reward, score_for_source
from dare.sampling import SamplingConfig, generate
from dare.sampling.primitives import CONFIDENCE

PROMPTS = [
    "What is 2 + 3?",
    "Natalia sold 48 clips in April and half as many in May. How many clips did she sell?",
    "Write a function that adds two numbers.",
    "A rectangle is 8 meters long and 3 meters wide. What is its area?",
]

# name -> (SamplingConfig overrides, the same decoding without a cache). "threshold" is filled from --threshold.
MASKED_METHODS = {
    "plain": ({}, "plain"),
    "prefix cache": (dict(cache="prefix"), "plain"),
    "dual cache": (dict(cache="dual"), "plain"),
    "threshold": (dict(threshold=True), "threshold"),
    "prefix + threshold": (dict(cache="prefix", threshold=True), "threshold"),
    "dual + threshold": (dict(cache="dual", threshold=True), "threshold"),
    "dual + vicinity 16": (dict(cache="dual", vicinity=16), "plain"),  # dInfer's recommended vicinity refresh
    "dual + vicinity 16 + threshold": (dict(cache="dual", vicinity=16, threshold=True), "threshold"),
}
BLOCK_METHODS = {
    "no cache, static": (dict(cache="none"), "no cache, static"),
    "block cache, static": (dict(cache="block"), "no cache, static"),
    "no cache, dynamic": (dict(cache="none", threshold=True), "no cache, dynamic"),
    "block cache, dynamic": (dict(cache="block", threshold=True), "no cache, dynamic"),
}
# blocks of the family's size against a causal context (dare/sampling/causal.py); its reference: autoregressive
CAUSAL_METHODS = {
    "autoregressive": (dict(block_length=1), "autoregressive"),
    "blocks, static": ({}, "blocks, static"),
    "blocks, threshold": (dict(threshold=True), "blocks, static"),
    "speculative": (dict(speculative=True), "autoregressive"),
    "speculative + threshold": (dict(speculative=True, threshold=True), "autoregressive"),
}


def large_overrides(family: str, a) -> dict:
    if family == "llada":  # OLMo names, multi-head attention like LLaDA-8B
        return dict(d_model=a.large_hidden, n_heads=a.large_heads, n_kv_heads=a.large_heads,
                    n_layers=a.large_layers, mlp_hidden_size=a.large_mlp)
    return dict(hidden_size=a.large_hidden, intermediate_size=a.large_mlp, num_hidden_layers=a.large_layers,
                num_attention_heads=a.large_heads, num_key_value_heads=a.large_kv_heads,
                head_dim=a.large_hidden // a.large_heads)


def build(spec, seed: int):
    """A trained folder as saved (``spec.path``), or a random model with its LM head scaled by ``spec.sharpen``."""
    if spec.path:
        return load_pretrained(spec.path, dtype=torch.float32)
    model, tok = tiny(spec.family, seed=seed, **spec.overrides)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(spec.sharpen)
    return model, tok, Family.from_pretrained(model.config, tok)


def prompt_batch(tok, batch: int, questions=None):
    """``batch`` chat prompts (``questions``, else cycling over PROMPTS), left padded."""
    tok.padding_side = "left"
    questions = questions or [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    msgs = [[{"role": "user", "content": q}] for q in questions]
    enc = tok.apply_chat_template(msgs, add_generation_prompt=True, padding=True, return_dict=True,
                                  return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


def top1_prob(model, family, ids, mask, gen_length: int) -> float:
    """Mean top-1 probability at the masked positions of the initial canvas (what the threshold compares)."""
    x = torch.cat([ids, ids.new_full((ids.shape[0], gen_length), family.mask_id)], 1)
    attn = torch.cat([mask, mask.new_ones(ids.shape[0], gen_length)], 1)
    with torch.no_grad():
        if family.is_block_diffusion:  # first generated block only (block-causal: later masks see nothing new)
            x, attn = x[:, : ids.shape[1] + family.block_size], attn[:, : ids.shape[1] + family.block_size]
        lg = family.logits(model, x, attn)[:, ids.shape[1]:]
    return lg.float().softmax(-1).amax(-1).mean().item()


class Spec:
    """One model of the benchmark: what to build and how to decode with it."""

    def __init__(self, section, label, family, overrides, batch, repeats, sharpen, base_cfg, methods, ref, weight,
                 path=None, task=None):
        self.section, self.label, self.family, self.overrides = section, label, family, overrides
        self.batch, self.repeats, self.sharpen, self.base_cfg = batch, repeats, sharpen, base_cfg
        self.methods, self.ref, self.weight = methods, ref, weight
        self.path, self.task = path, task  # a trained folder, prompted with held-out questions of its task


# Rough relative cost of each method (plain masked decoding = 1), only to schedule the longest jobs first.
COST = {"plain": 1, "prefix cache": .5, "dual cache": .17, "threshold": .2, "prefix + threshold": .11,
        "dual + threshold": .07, "dual + vicinity 16": .3, "dual + vicinity 16 + threshold": .12,
        "no cache, static": .35, "block cache, static": .06, "no cache, dynamic": .28,
        "block cache, dynamic": .05, "autoregressive": .3, "blocks, static": .3, "blocks, threshold": .1,
        "speculative": .5, "speculative + threshold": .6}

_MODELS = {}  # per worker process: label -> (model, family, ids, mask), built and warmed up once


def run_job(job):
    """Time one (model, method) in this process: ``repeats`` generations, the fastest kept."""
    spec, method, threshold, seed, threads = job
    if threads:
        torch.set_num_threads(threads)
    if spec.label not in _MODELS:
        model, tok, family = build(spec, seed)
        rows = make_task(spec.task, spec.batch, 0, "test") if spec.task else []
        ids, mask = prompt_batch(tok, spec.batch, [r["prompt"][-1]["content"] for r in rows])
        warm_length = spec.base_cfg.get("block_length") or family.block_size or family.causal_block
        warm = dict(spec.base_cfg, gen_length=warm_length, block_length=None, steps=min(4, warm_length))
        generate(model, family, ids, mask, SamplingConfig(**warm))  # warm-up, once per model and process
        _MODELS[spec.label] = (model, tok, family, ids, mask, rows)
    model, tok, family, ids, mask, rows = _MODELS[spec.label]
    over, _ = spec.methods[method]
    cfg = SamplingConfig(**{**spec.base_cfg, **{k: (threshold if k == "threshold" else v) for k, v in over.items()}})
    counter = FedCounter(model)
    best = cpu = float("inf")
    for _ in range(spec.repeats):
        counter.positions = 0
        t, c = time.perf_counter(), time.process_time()
        out = generate(model, family, ids, mask, cfg)
        best, cpu = min(best, time.perf_counter() - t), min(cpu, time.process_time() - c)
    counter.handle.remove()
    info = None
    if method == spec.ref:
        info = dict(params=sum(p.numel() for p in model.parameters()), prompt=ids.shape[1],
                    top1=top1_prob(model, family, ids, mask, cfg.gen_length))
    texts = decode_completions(tok, family, out.sequences)[1] if rows else []
    return spec.label, method, dict(nfe=out.nfe, wall=best, cpu=cpu, positions=counter.positions, seq=out.sequences,
                                    length=cfg.gen_length, info=info, quality=quality(texts, rows) if rows else None)


def quality(texts: list[str], rows: list[dict]) -> float:
    """How well a trained model's answers do their task, averaged over the prompts: for ``cycle``, the share of
    adjacent words in the answer's list that follow the cycle (what parallel decoding can break: a word committed
    beside a neighbour it does not fit); for other tasks, the reward's accuracy."""
    scores = []
    for text, row in zip(texts, rows, strict=True):
        if row["data_source"] == "cycle":
            words = text.split(". The answer")[0].split()
            pairs = list(itertools.pairwise(words))
            scores.append(sum(a in WORDS and b == WORDS[(WORDS.index(a) + 1) % len(WORDS)] for a, b in pairs)
                          / max(len(pairs), 1))
        else:
            fn = get_reward(score_for_source(row["data_source"], row["extra_info"].get("task")))
            scores.append(fn(text, row["reward_model"]["ground_truth"], row["extra_info"]).acc)
    return sum(scores) / len(scores)


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
