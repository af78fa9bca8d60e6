"""Building blocks shared by every sampler: token proposal (temperature, top-k/top-p, Gumbel-max in float64),
confidence scores (the remasking algorithms, registered by name), transfer schedules and parallel-decoding
selection rules."""

from collections.abc import Callable

import torch

NEG_INF = float("-inf")


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """top-k keeps the k largest logits; top-p the smallest prefix of the sorted distribution whose mass exceeds
    p (the most likely token always stays). Removed entries become -inf."""
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        remove = cum - sorted_logits.softmax(-1) >= top_p  # mass strictly before this token already exceeds p
        remove[..., 0] = False
        logits = logits.masked_fill(remove.scatter(-1, order, remove), NEG_INF)
    return logits


def proposal_entropy(logits: torch.Tensor, temperature: float, top_k: int | None = None,
                     top_p: float | None = None) -> torch.Tensor:
    """The entropy of the distribution ``propose`` draws from (filtered, then tempered; 0 at temperature 0)."""
    if temperature <= 0:
        return torch.zeros(logits.shape[:-1], device=logits.device)
    logp = (filter_logits(logits, top_k, top_p).float() / temperature).log_softmax(-1)
    return -torch.where(logp.isfinite(), logp.exp() * logp, 0.0).sum(-1)


def gumbel(shape, device, generator=None, dtype=torch.float32) -> torch.Tensor:
    """Standard Gumbel noise ``-log(-log u)``."""
    u = torch.rand(shape, dtype=dtype, device=device, generator=generator)
    return -torch.log(-torch.log(u.clamp_min(torch.finfo(dtype).tiny)))


def after_first(flags: torch.Tensor) -> torch.Tensor:
    """Positions strictly after the first True of each row (e.g. the padding after a stop token)."""
    flags = flags.long()
    return flags.cumsum(-1) - flags > 0


def propose(logits: torch.Tensor, temperature: float, top_k: int | None = None, top_p: float | None = None,
            generator: torch.Generator | None = None) -> torch.Tensor:
    """A token per position: argmax at temperature 0, else Gumbel-max sampling from softmax(filtered / T),
    computed in float64 (low-precision Gumbel noise measurably hurts generation quality)."""
    logits = filter_logits(logits, top_k, top_p)
    if temperature <= 0:
        return logits.argmax(-1)
    noise = gumbel(logits.shape, logits.device, generator, torch.float64)
    return (logits.double() / temperature + noise).argmax(-1)


# ---------------------------------------------------------------- confidence (remasking algorithms)

Confidence = Callable[..., torch.Tensor]
CONFIDENCE: dict[str, Confidence] = {}


def confidence(name: str):
    def register(fn):
        CONFIDENCE[name] = fn
        return fn
    return register


@confidence("low_confidence")
def _low_confidence(logits, x0, **_):
    """Probability of the proposed token under the untempered softmax."""
    return logits.float().softmax(-1).gather(-1, x0[..., None])[..., 0]


@confidence("random")
def _random(logits, x0, generator=None, **_):
    return torch.rand(x0.shape, device=x0.device, generator=generator)


@confidence("entropy")
def _entropy(logits, x0, **_):
    """Negative entropy (larger = more confident), Dream's ``entropy``."""
    logp = logits.float().log_softmax(-1)
    return (logp.exp() * logp).nan_to_num(0.0).sum(-1)


@confidence("margin")
def _margin(logits, x0, **_):
    """p(top-1) - p(top-2), Dream's ``topk_margin``."""
    top2 = logits.float().softmax(-1).topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


@confidence("maskgit_plus")
def _maskgit_plus(logits, x0, temperature=0.0, top_k=None, top_p=None, **_):
    """Probability of the proposed token under the tempered, filtered distribution (Dream's ``maskgit_plus``)."""
    scaled = filter_logits(logits.float(), top_k, top_p) / (temperature if temperature > 0 else 1.0)
    return scaled.softmax(-1).gather(-1, x0[..., None])[..., 0]


@confidence("left_to_right")
def _left_to_right(logits, x0, **_):
    """The earliest position first: with one token per step the sampler is autoregressive (JustGRPO)."""
    return -torch.arange(x0.shape[-1], device=x0.device, dtype=torch.float32).expand(x0.shape)


def score(name: str, logits, x0, **kw) -> torch.Tensor:
    if name not in CONFIDENCE:
        raise ValueError(f"Unknown remasking algorithm {name!r}; known: {sorted(CONFIDENCE)}")
    return CONFIDENCE[name](logits, x0, **kw)


# ---------------------------------------------------------------- schedules and selection


def linear_schedule(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA: ``[N] masked counts -> [N, steps]`` tokens per step, an even split with the remainder front-loaded."""
    base, rem = masked // steps, masked % steps
    return base[:, None] + (torch.arange(steps, device=masked.device)[None] < rem[:, None]).long()


def ascending_schedule(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """CJ-GRPO's ascending step size (ASS): step j commits ``2^j`` tokens; the last step commits what is left.
    ``[N] masked counts -> [N, steps]``."""
    want = 2 ** torch.arange(steps, device=masked.device)
    done = torch.cat([want.new_zeros(1), want.cumsum(0)[:-1]])
    n = (masked[:, None] - done[None]).clamp(min=0).minimum(want[None])
    n[:, -1] = (masked - n[:, :-1].sum(-1)).clamp(min=0)
    return n


def ascending_steps(length: int) -> int:
    """Steps ASS needs for ``length`` tokens: 1 + 2 + ... + 2^(S-1) = 2^S - 1 >= length."""
    return max(1, (length).bit_length())


def dream_count(masked: torch.Tensor, t: float, s: float, last: bool) -> torch.Tensor:
    """Dream: ``floor(masked * (1 - s/t))`` tokens this step; everything left at the last step."""
    return masked if last else (masked.double() * (1 - s / t)).floor().long()


def top_n(conf: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """Boolean mask of the ``n[b]`` highest finite confidences of each row (``conf`` is -inf where not allowed)."""
    order = conf.argsort(dim=-1, descending=True, stable=True)
    positions = torch.arange(conf.shape[-1], device=conf.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(-1, order, positions)
    return (rank < n[:, None]) & torch.isfinite(conf)


def sample_n(conf: torch.Tensor, n: torch.Tensor, alg_temp: float, generator=None) -> torch.Tensor:
    """Dream's ``alg_temp``: draw ``n[b]`` positions without replacement from softmax(conf / alg_temp)."""
    keys = conf / alg_temp + gumbel(conf.shape, conf.device, generator)
    return top_n(keys.masked_fill(~torch.isfinite(conf), NEG_INF), n)


def factor_rule(conf: torch.Tensor, factor: float) -> torch.Tensor:
    """Fast-dLLM dynamic variant: sort confidences c1 >= c2 >= ...; commit the longest prefix with
    ``c_n >= 1 - factor / (n + 1)`` (n counted from 1; the first always commits)."""
    sorted_conf, order = conf.sort(dim=-1, descending=True)
    n = torch.arange(1, conf.shape[-1] + 1, device=conf.device, dtype=conf.dtype)
    ok = (sorted_conf >= 1 - factor / (n + 1)) & torch.isfinite(sorted_conf)
    ok[:, 0] = torch.isfinite(sorted_conf[:, 0])
    count = ok.long().cumprod(-1).sum(-1)
    return top_n(conf, count)


THRESHOLD_RULES = {
    "one": "every position with confidence >= threshold, at least the most confident (Fast-dLLM LLaDA, SGLang)",
    "schedule": "every position with confidence > threshold if at least the step's scheduled count pass, else the "
                "top scheduled count (SDAR low_confidence_dynamic, LLaDA2 generate)",
    "quota": "the top (scheduled + carried) candidates: the first always, the rest if >= threshold; the shortfall "
             "carries to the next step (Dream/Fast-dLLM confidence_threshold)",
}


def select(conf: torch.Tensor, n: torch.Tensor, config, generator=None) -> torch.Tensor:
    """Positions to commit this step. ``conf`` is -inf where nothing may be committed; ``n`` is the scheduled count
    (for the "quota" rule: the step's quota plus the carried shortfall). threshold: ``config.threshold_rule`` (see
    ``THRESHOLD_RULES``); factor: Fast-dLLM's dynamic rule; else the top-``n`` (or ``n`` positions drawn from
    softmax(conf / alg_temp))."""
    if config.factor is not None:
        return factor_rule(conf, config.factor)
    if config.threshold is not None:
        finite = torch.isfinite(conf)
        if config.threshold_rule == "schedule":
            above = (conf > config.threshold) & finite
            return torch.where((above.sum(-1) >= n)[:, None], above, top_n(conf, n))
        first = top_n(conf, torch.ones_like(n))
        if config.threshold_rule == "quota":
            return first | (top_n(conf, n) & (conf >= config.threshold))
        return first | ((conf >= config.threshold) & finite)
    if config.alg_temp:
        return sample_n(conf, n, config.alg_temp, generator)
    return top_n(conf, n)


def eos_factor(gamma_min: float | None, step: int, steps: int) -> float:
    """CJ-GRPO's EOS early rejection (EOSER): the factor on EOS confidences rises linearly from ``gamma_min`` at the
    first step to 1 at the last, so EOS is committed late (None: off)."""
    if gamma_min is None:
        return 1.0
    return gamma_min + (1.0 - gamma_min) * min(step / max(steps - 1, 1), 1.0)


def ban(logits: torch.Tensor, config, eos_id: int, mask_id: int | None = None) -> torch.Tensor:
    """Logits with the tokens the sampler never proposes at -inf: the mask token, and EOS with ``suppress_eos``."""
    banned = ([] if mask_id is None else [mask_id]) + ([eos_id] if config.suppress_eos else [])
    if banned:
        logits = logits.clone()
        logits[..., banned] = NEG_INF
    return logits


def decode_step(logits: torch.Tensor, masked: torch.Tensor, n: torch.Tensor, config, eos_id: int,
                generator=None, mask_id: int | None = None, eos_scale: float = 1.0
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One denoising step over a block: ``(proposed tokens, positions to commit, confidence of every proposal)``,
    all ``[N, B]``. The mask token is never proposed (its logit is -inf, MDLM's SUBS rule): a committed mask would
    survive decoding. ``eos_scale`` multiplies the confidence of EOS proposals (EOSER) for the selection only."""
    logits = ban(logits, config, eos_id, mask_id)
    x0 = propose(logits, config.temperature, config.top_k, config.top_p, generator)
    name = "random" if config.remasking == "origin" else config.remasking
    conf = score(name, logits, x0, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
                 generator=generator)
    ranked = conf if eos_scale == 1.0 else torch.where(x0 == eos_id, conf * eos_scale, conf)
    return x0, select(ranked.masked_fill(~masked, NEG_INF), n, config, generator), conf
