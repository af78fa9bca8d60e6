"""The models and timed jobs of bench/bench_sampling.py: what each row builds, how it decodes, what it measures."""

import itertools
import time

import torch
from _common import FedCounter

from dare.data.tasks import WORDS, make_task
from dare.engines.base import decode_completions
from dare.models import Family, load_pretrained, tiny
from dare.rewards import get_reward, score_for_source
from dare.sampling import SamplingConfig, generate

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
