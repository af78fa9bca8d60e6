"""What every GRPO-family algorithm shares: group advantages, the token-level clipped surrogate (with verl's dual
clip), KL estimators and loss aggregation with a normaliser fixed before the micro-batch loop (so the loss does not
depend on how a mini-batch is split). An algorithm file only picks among these and adds what differs.
"""

import math

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, kind: str = "grpo", eps: float = 1e-6) -> torch.Tensor:
    """Per-completion advantages ``[N]`` for prompt-major rewards (G consecutive rows share a prompt).

    grpo    (r - mean) / (std + eps), unbiased std; a group of one has mean 0, std 1 (DARE default)
    drgrpo  r - mean (d1, SPG, CJ-GRPO papers)
    rloo    r - mean of the others = G/(G-1) (r - mean) (ESPO, Coupled-GRPO)
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be [N] with N a multiple of group_size={group_size}, got "
                         f"{tuple(rewards.shape)}")
    r = rewards.double().view(-1, group_size)
    mean = r.mean(-1, keepdim=True)
    if kind == "grpo":  # verl: a group of one has mean 0 and std 1, i.e. A = r
        adv = r if group_size == 1 else (r - mean) / (r.std(-1, keepdim=True) + eps)
    elif kind == "drgrpo":
        adv = r - mean
    elif kind == "rloo":
        if group_size < 2:
            raise ValueError("rloo needs at least two completions per prompt")
        adv = (r - mean) * group_size / (group_size - 1)
    else:
        raise ValueError(f"Unknown advantage estimator {kind!r}; known: ['drgrpo', 'grpo', 'rloo']")
    return adv.view(-1).to(rewards.dtype)


def clipped_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, eps_low: float = 0.2,
                       eps_high: float = 0.2, dual_clip: float | None = 3.0):
    """PPO surrogate per token ``[N, R]`` and where clipping engaged: ``max(-A r, -A clip(r))``, and for A < 0 at most
    ``-A c`` (verl's dual clip; None disables it). ``advantages`` is ``[N]`` (broadcast) or ``[N, R]``."""
    adv = advantages[:, None] if advantages.dim() == 1 and logp.dim() == 2 else advantages
    return clipped_ratio_loss(torch.exp(logp - old_logp), adv, eps_low, eps_high, dual_clip)


def clipped_ratio_loss(ratio: torch.Tensor, adv: torch.Tensor, eps_low: float = 0.2, eps_high: float = 0.2,
                       dual_clip: float | None = 3.0):
    """``max(-A r, -A clip(r, 1-eps_low, 1+eps_high))`` (dual-clipped at ``-A c`` for A < 0) for any ratio ``r``
    (BGPO's linearised one included), and where clipping engaged."""
    unclipped, clipped = -adv * ratio, -adv * ratio.clamp(1 - eps_low, 1 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    engaged = clipped > unclipped
    if dual_clip is not None:
        capped = torch.minimum(loss, -adv * dual_clip)
        engaged = engaged | ((adv < 0) & (capped < loss))
        loss = torch.where(adv < 0, capped, loss)
    return loss, engaged


def log_clipped_loss(log_ratio: torch.Tensor, adv: torch.Tensor, eps_low: float = 0.2, eps_high: float = 0.2):
    """``max(-A r, -A clip(r))`` evaluated in the log domain (EBPO): no overflow for huge sequence-level ratios."""
    effective = torch.where(adv >= 0, log_ratio.clamp(max=math.log1p(eps_high)),
                            log_ratio.clamp(min=math.log(max(1 - eps_low, 1e-30))))
    return -adv * torch.exp(effective), effective != log_ratio


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """KL(pi || ref) estimators on ``d = logp - ref_logp``: k1 = d, abs = |d|, k2 = d^2 / 2, k3 = e^-d + d - 1.
    No dependence on the advantage (unlike the reference's shared helper)."""
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return torch.exp(-d) + d - 1
    raise ValueError(f"Unknown KL estimator {kind!r}; known: ['abs', 'k1', 'k2', 'k3']")


def token_mean(values: torch.Tensor, mask: torch.Tensor, total_tokens: torch.Tensor | float | None = None):
    """``Σ mask·values / total_tokens``; pass the mini-batch token count (all-reduced across ranks) as
    ``total_tokens`` so micro-batch losses add up to the mini-batch token mean exactly."""
    mask = mask.to(values.dtype)
    total = mask.sum() if total_tokens is None else total_tokens
    return (values * mask).sum() / (total if torch.is_tensor(total) else torch.tensor(float(total))).clamp(min=1.0)


def masked_stats(stats: dict, mask: torch.Tensor) -> dict:
    """Per-token statistics ``[.., R]`` as ``{name: (sum over mask, tokens in mask)}``, the trainer's meters."""
    tokens = mask.sum()
    return {name: ((value.float() * mask).sum(), tokens) for name, value in stats.items()}
