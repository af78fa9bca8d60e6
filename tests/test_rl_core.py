"""Shared RL math (advantages, clipped surrogate, KL, aggregation) against the spec's hand-checked vectors, and the
d1 one-step mean-field estimator's properties on every tiny family."""

import pytest
import torch

from dare.algos.core import clipped_token_loss, group_advantages, kl_estimate, token_mean
from dare.likelihood import corrupt_mean_field, estimator, mean_field_logp, rollout_attention
from dare.models import Family, tiny

FAMILIES = ("llada", "dream", "sdar", "sdar_moe", "llada2")


@pytest.mark.parametrize("kind,expected", [("grpo", [0.866024, -0.866024, -0.866024, 0.866024]),
                                           ("drgrpo", [0.5, -0.5, -0.5, 0.5]),
                                           ("rloo", [0.666667, -0.666667, -0.666667, 0.666667])])
def test_group_advantages_match_spec_vectors(kind, expected):
    adv = group_advantages(torch.tensor([1.0, 0, 0, 1, 0.5, 0.5, 0.5, 0.5], dtype=torch.float64), 4, kind)
    assert torch.allclose(adv[:4], torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(4, dtype=torch.float64))  # all-equal group -> 0


def test_group_advantages_edge_cases():
    assert torch.equal(group_advantages(torch.tensor([0.3, 1.0]), 1), torch.tensor([0.3, 1.0]))
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(torch.ones(5), 4)
    with pytest.raises(ValueError, match="Unknown advantage estimator 'x'"):
        group_advantages(torch.ones(4), 4, "x")


@pytest.mark.parametrize("adv,ratio,expected", [(-1, 5, 3.0), (-1, 2, 2.0), (1, 5, -1.2), (1, 0.5, -0.5),
                                                (-1, 0.5, 0.8)])
def test_dual_clip_loss_matches_spec_vectors(adv, ratio, expected):
    loss, _ = clipped_token_loss(torch.log(torch.tensor([[float(ratio)]], dtype=torch.float64)),
                                 torch.zeros(1, 1, dtype=torch.float64), torch.tensor([float(adv)]))
    assert loss.item() == pytest.approx(expected, abs=1e-9)


def test_clipping_engages_only_outside_the_trust_region_in_the_advantage_direction():
    ratios = torch.tensor([0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 2.0], dtype=torch.float64)
    logp = torch.log(ratios)[None].repeat(2, 1)
    _, engaged = clipped_token_loss(logp, torch.zeros_like(logp), torch.tensor([1.0, -1.0], dtype=torch.float64),
                                    eps_low=0.2, eps_high=0.2, dual_clip=None)
    assert engaged[0].tolist() == [False, False, False, False, False, True, True]  # A>0: only r > 1+eps
    assert engaged[1].tolist() == [True, True, False, False, False, False, False]  # A<0: only r < 1-eps
    _, engaged = clipped_token_loss(logp, torch.zeros_like(logp), torch.tensor([1.0, -1.0], dtype=torch.float64),
                                    eps_low=0.1, eps_high=0.3, dual_clip=None)
    assert engaged[0].tolist() == [False] * 6 + [True] and engaged[1].tolist() == [True] * 3 + [False] * 4


def test_kl_estimators():
    d = torch.tensor([-0.5, 0.0, 0.7], dtype=torch.float64)
    zero = torch.zeros(3, dtype=torch.float64)
    assert torch.equal(kl_estimate(d, zero, "k1"), d) and torch.equal(kl_estimate(d, zero, "abs"), d.abs())
    assert torch.allclose(kl_estimate(d, zero, "k2"), d * d / 2)
    assert torch.allclose(kl_estimate(d, zero, "k3"), torch.exp(-d) + d - 1) and (kl_estimate(d, zero) >= 0).all()
    with pytest.raises(ValueError, match="Unknown KL"):
        kl_estimate(d, zero, "k9")


def test_token_mean_is_invariant_to_micro_batch_partition():
    values, mask = torch.randn(6, 5, dtype=torch.float64), (torch.rand(6, 5) > 0.3).double()
    whole = token_mean(values, mask)
    parts = sum(token_mean(values[i:i + 2], mask[i:i + 2], mask.sum()) for i in range(0, 6, 2))
    assert torch.allclose(whole, parts)


def rollout(family_name, seed=0):
    model, tok = tiny(family_name)
    fam = Family.from_pretrained(model.config, tok)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(20, len(tok), (4, 10), generator=g)
    prompt_mask = torch.ones_like(prompt)
    prompt_mask[1, :3] = 0  # left padding
    prompt[1, :3] = fam.pad_id
    completion = torch.randint(20, len(tok), (4, 12), generator=g)
    completion_mask = torch.ones_like(completion)
    completion_mask[2, 7:] = 0  # stopped early
    return model, fam, prompt, prompt_mask, completion, completion_mask


def test_mean_field_mask_statistics():
    model, fam, prompt, prompt_mask, completion, completion_mask = rollout("llada")
    g = torch.Generator().manual_seed(1)
    draws = torch.stack([corrupt_mean_field(fam, prompt, prompt_mask, completion, 0.15, g) for _ in range(3000)])
    masked = draws == fam.mask_id
    assert masked[:, :, 10:].all()  # every completion position
    assert not masked[:, 1, :3].any()  # prompt padding never
    rate = masked[:, :, :10][:, prompt_mask.bool()].double().mean()
    assert abs(rate - 0.15) < 0.005


@pytest.mark.parametrize("family_name", FAMILIES)
def test_d1_first_pass_ratio_is_one_and_gradient_is_reinforce(family_name):
    """mu = 1, shared mask: r = 1 exactly, loss = -mean(A) over loss tokens, and the gradient equals the REINFORCE
    gradient -(1/sum m) sum m A grad(logp)."""
    model, fam, prompt, prompt_mask, completion, completion_mask = rollout(family_name)
    model = model.double().train()
    corrupt_fn, score = estimator("mean_field")
    noisy = corrupt_fn(fam, prompt, prompt_mask, completion, 0.15, torch.Generator().manual_seed(3))
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75], dtype=torch.float64)
    with torch.no_grad():
        old = score(model, fam, prompt, prompt_mask, completion, completion_mask, noisy)
    logp = score(model, fam, prompt, prompt_mask, completion, completion_mask, noisy)
    assert torch.equal(logp.detach(), old)
    per_token, engaged = clipped_token_loss(logp, old, adv)
    loss = token_mean(per_token, completion_mask)
    assert not engaged.any()
    expected_value = -(adv[:, None] * completion_mask).sum() / completion_mask.sum()
    assert torch.allclose(loss.detach(), expected_value)
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], retain_graph=True)
    reinforce = -(adv[:, None] * logp * completion_mask).sum() / completion_mask.sum()
    ref = torch.autograd.grad(reinforce, [p for p in model.parameters() if p.requires_grad])
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(grads, ref))
    assert any(a.abs().sum() > 0 for a in grads)


def test_identical_rewards_give_zero_loss_and_gradient():
    model, fam, prompt, prompt_mask, completion, completion_mask = rollout("dream")
    model = model.double()
    noisy = corrupt_mean_field(fam, prompt, prompt_mask, completion, 0.15, torch.Generator().manual_seed(0))
    adv = group_advantages(torch.full((4,), 0.7, dtype=torch.float64), 4)
    logp = mean_field_logp(model, fam, prompt, prompt_mask, completion, completion_mask, noisy)
    loss = token_mean(clipped_token_loss(logp, logp.detach(), adv)[0], completion_mask)
    loss.backward()
    assert loss.item() == 0.0 and all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_mean_field_uses_the_family_layout():
    """Block families score a completion block given the CLEAN earlier completion (doubled layout); bidirectional
    families see an all-mask completion, so their scores do not depend on the other completion tokens."""
    for name, depends in (("llada", False), ("sdar", True)):
        model, fam, prompt, prompt_mask, completion, completion_mask = rollout(name)
        completion_mask = torch.ones_like(completion_mask)
        noisy = corrupt_mean_field(fam, prompt, prompt_mask, completion, 0.0)
        with torch.no_grad():
            a = mean_field_logp(model, fam, prompt, prompt_mask, completion, completion_mask, noisy)
            changed = completion.clone()
            changed[:, 0] = (changed[:, 0] + 1) % 500 + 20
            b = mean_field_logp(model, fam, prompt, prompt_mask, changed, completion_mask, noisy)
        later = (a[:, 8:] - b[:, 8:]).abs().max()
        assert (later > 1e-6) == depends, name
    assert rollout_attention(fam, prompt_mask, completion_mask).shape == (4, 22)
    with pytest.raises(ValueError, match="Unknown likelihood estimator"):
        estimator("nope")
