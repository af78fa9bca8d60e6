"""Held-out measurements with their noise, for learning experiments on the generated tasks (the quickstart, the
comparison lab ``recipes/lab/compare.py`` and the learning tests).

``held_out`` scores a model on test-split questions (never trained on: ``dare.data.tasks.split_of``) and returns
per-question values, so that a before/after change is measured *paired* over the same questions: its standard error
is that of the per-question differences (``paired``). ``mistake_pairs`` builds offline preference pairs from a
model's own wrong answers.
"""

import math
import statistics

import torch

from ..data.images import pictured_prompt
from ..data.tasks import make_task
from ..engines import HFEngine
from ..models import load_pretrained
from ..rewards.routing import RewardRouter
from ..sampling import SamplingConfig
from .benchmarks import prompt_rows_from


def _engine(model_dir: str) -> HFEngine:
    model, tokenizer, family = load_pretrained(model_dir, dtype=torch.float32)
    return HFEngine(model.eval(), tokenizer, family, max_batch_size=1024)


def held_out(model_dir: str, task: str, questions: int = 800, samples: int = 8, gen_length: int = 12,
             seed: int = 12345, decoding: dict | None = None) -> dict:
    """``reward_q``: each question's mean reward over ``samples`` completions at T = 1; ``spread_q``: 1 where those
    rewards are not all equal (a group of ``samples`` that carries a group advantage), else 0; ``right_wrong_q``: 1
    where some are right and some wrong (a format score alone can spread a group that is all wrong); ``greedy_q``:
    its greedy reward. Question-major lists over the first ``questions`` test questions of ``task``. ``decoding``: other
    ``SamplingConfig`` knobs (e.g. ``dare.sampling.FAST_DECODING["masked"]``; default the family's plain decoding)."""
    engine = _engine(model_dir)
    rows = prompt_rows_from(make_task(task, questions, seed=0, split="test"), images=engine.family.pictures)
    router, prompts, out = RewardRouter(["auto"]), [pictured_prompt(r) for r in rows], {}
    for name, n, temperature in (("reward_q", samples, 1.0), ("greedy_q", 1, 0.0)):
        sampling = SamplingConfig(**{**(decoding or {}), "gen_length": gen_length, "temperature": temperature})
        rollout = engine.generate(prompts, n, sampling, seed=seed)
        results = router.score(rollout.texts, [r for r in rows for _ in range(n)])
        groups = [results[i * n:(i + 1) * n] for i in range(len(rows))]
        out[name] = [sum(r.score for r in group) / n for group in groups]
        if name == "reward_q":
            out["spread_q"] = [float(max(r.score for r in g) > min(r.score for r in g)) for g in groups]
            out["right_wrong_q"] = [float(len({r.acc > 0 for r in g}) == 2) for g in groups]
    return out


def mistake_pairs(model_dir: str, task: str, n: int, gen_length: int = 12, seed: int = 12345) -> list[dict]:
    """``n`` preference pairs on train-split questions: chosen = the reference solution, rejected = the model's own
    wrong answer (one completion at T = 1 per question; questions it answers right are skipped). The pairs a
    preference method meets when it learns from the policy's mistakes, unlike generated near misses."""
    rows = prompt_rows_from(make_task(task, 3 * n, seed=0, split="train"))
    sampling = SamplingConfig(gen_length=gen_length, temperature=1.0)
    rollout = _engine(model_dir).generate([r["prompt"] for r in rows], 1, sampling, seed=seed)
    scores = [r.score for r in RewardRouter(["auto"]).score(rollout.texts, rows)]
    pairs = [{"prompt": row["prompt"], "chosen": row["extra_info"]["solution"], "rejected": text}
             for row, text, score in zip(rows, rollout.texts, scores, strict=True) if score <= 0 and text.strip()]
    if len(pairs) < n:
        raise ValueError(f"{model_dir} answered too many of {len(rows)} {task} questions right for {n} pairs")
    return pairs[:n]


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and its standard error."""
    return statistics.fmean(values), (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def paired(before: list[float], after: list[float]) -> dict:
    """The mean change over the same questions, its standard error, and the change in standard errors (``z``)."""
    gain, se = mean_se([a - b for a, b in zip(after, before, strict=True)])
    return {"gain": gain, "se": se, "z": gain / se if se else 0.0}
