"""Shared RL math (advantages, clipped surrogate, KL, aggregation) against the spec's hand-checked vectors, and the
d1 one-step mean-field estimator's properties on every tiny family."""

import pytest
import torch

from dare.algos import get_algorithm
from dare.algos.core import clipped_token_loss, group_advantages, kl_estimate, token_mean
from dare.likelihood import MeanField, estimator, rollout_attention
from dare.models import Family, tiny
from dare.sampling import SamplingConfig

FAMILIES = ("llada", "dream", "sdar", "sdar_moe", "llada2")
SAMPLING = SamplingConfig(gen_length=8)  # the rollout decoding the algorithm plans for


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
    """A batch as the trainer builds it: left-padded prompts, completions (row 2 stopped early)."""
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
    batch = {"prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": completion,
             "completion_mask": completion_mask, "loss_mask": completion_mask}
    return model, fam, batch


def test_mean_field_mask_statistics():
    model, fam, batch = rollout("llada")
    g, est = torch.Generator().manual_seed(1), MeanField(0.15)
    draws = torch.stack([est.corrupt(fam, batch, g)["noisy"] for _ in range(3000)])
    masked = draws == fam.mask_id
    assert masked[:, :, 10:].all()  # every completion position
    assert not masked[:, 1, :3].any()  # prompt padding never
    rate = masked[:, :, :10][:, batch["prompt_mask"].bool()].double().mean()
    assert abs(rate - 0.15) < 0.005


@pytest.mark.parametrize("family_name", FAMILIES)
def test_d1_first_pass_ratio_is_one_and_gradient_is_reinforce(family_name):
    """mu = 1, shared mask: r = 1 exactly, loss = -mean(A) over loss tokens, and the gradient equals the REINFORCE
    gradient -(1/sum m) sum m A grad(logp)."""
    model, fam, batch = rollout(family_name)
    model = model.double().train()
    d1 = get_algorithm("d1")().validate(fam)
    noise = d1.corrupt(fam, batch, torch.Generator().manual_seed(3), SAMPLING)
    batch["advantages"] = torch.tensor([1.0, -0.5, 0.25, -0.75], dtype=torch.float64)
    with torch.no_grad():
        old = d1.score(model, fam, batch, noise, SAMPLING).logp
    estimate = d1.score(model, fam, batch, noise, SAMPLING)
    assert torch.equal(estimate.logp.detach(), old)
    mask = batch["completion_mask"]
    loss, stats = d1.loss(estimate, batch, old, None, mask.sum())
    assert stats["clip_fraction"][0] == 0 and stats["ratio"][0] == mask.sum()  # nothing clipped, r = 1 everywhere
    adv = batch["advantages"]
    assert torch.allclose(loss.detach(), -(adv[:, None] * mask).sum() / mask.sum())
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, retain_graph=True)
    reinforce = -(adv[:, None] * estimate.logp * mask).sum() / mask.sum()
    ref = torch.autograd.grad(reinforce, params)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(grads, ref, strict=True))
    assert any(a.abs().sum() > 0 for a in grads)


def test_identical_rewards_give_zero_loss_and_gradient():
    model, fam, batch = rollout("dream")
    model = model.double()
    d1 = get_algorithm("d1")()
    batch["advantages"] = d1.advantages(torch.full((4,), 0.7, dtype=torch.float64), 4)
    estimate = d1.score(model, fam, batch, d1.corrupt(fam, batch, torch.Generator().manual_seed(0), SAMPLING), SAMPLING)
    loss, _ = d1.loss(estimate, batch, estimate.logp.detach(), None, batch["loss_mask"].sum())
    loss.backward()
    assert loss.item() == 0.0 and all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_kl_term_is_zero_against_itself_and_positive_after_a_change():
    model, fam, batch = rollout("llada")
    d1 = get_algorithm("d1")(beta=0.5)
    batch["advantages"] = torch.zeros(4)
    estimate = d1.score(model, fam, batch, d1.corrupt(fam, batch, torch.Generator().manual_seed(0), SAMPLING), SAMPLING)
    logp = estimate.logp.detach()
    loss, stats = d1.loss(estimate, batch, logp, logp, batch["loss_mask"].sum())
    assert loss.item() == 0.0 and stats["kl"][0] == 0.0
    loss, stats = d1.loss(estimate, batch, logp, logp + 0.3, batch["loss_mask"].sum())
    assert loss.item() > 0 and stats["kl"][0] > 0


def test_mean_field_uses_the_family_layout():
    """Block families score a completion block given the CLEAN earlier completion (doubled layout); bidirectional
    families see an all-mask completion, so their scores do not depend on the other completion tokens."""
    for name, depends in (("llada", False), ("sdar", True)):
        model, fam, batch = rollout(name)
        batch["completion_mask"] = torch.ones_like(batch["completion_mask"])
        est = MeanField(0.0)
        noise = est.corrupt(fam, batch)
        with torch.no_grad():
            a = est.score(model, fam, batch, noise).logp
            changed = batch["completion_ids"].clone()
            changed[:, 0] = (changed[:, 0] + 1) % 500 + 20
            b = est.score(model, fam, {**batch, "completion_ids": changed}, noise).logp
        later = (a[:, 8:] - b[:, 8:]).abs().max()
        assert (later > 1e-6) == depends, name
    assert rollout_attention(fam, batch["prompt_mask"], batch["completion_mask"]).shape == (4, 22)
    with pytest.raises(ValueError, match="Unknown likelihood estimator"):
        estimator("nope")


def test_algorithm_registry_and_knob_checks():
    from dare.algos import known
    assert "d1" in known()
    with pytest.raises(ValueError, match="Unknown algorithm 'nope'; registered: .*d1"):
        get_algorithm("nope")
    fam = rollout("llada")[1]
    for bad in ({"advantage": "mean"}, {"loss_mask": "eos"}, {"kl": "k4"}, {"num_iterations": 0},
                {"p_prompt": 1.0}, {"dual_clip": 0.5}):
        with pytest.raises(ValueError):
            get_algorithm("d1")(**bad).validate(fam)


def test_every_enumerated_knob_lists_its_choices_and_refuses_others():
    """Each text knob of each algorithm is a ``one_of`` (--help shows the choices), and validate refuses a value
    outside them naming the knob (the choices too, unless the algorithm pins the knob to one value)."""
    import dataclasses
    import typing

    from dare.algos import known
    from dare.config import choices_of
    fam = rollout("llada")[1]
    checked = 0
    for name in known():
        cls = get_algorithm(name)
        sections = [(cls, "", lambda cls=cls, **kw: cls(**kw))]
        if hasattr(cls(), "dynamic_sampling"):
            sections.append((type(cls().dynamic_sampling), "dynamic_sampling.", lambda cls=cls, **kw: cls(
                dynamic_sampling=dataclasses.replace(cls().dynamic_sampling, **kw))))
        for owner, prefix, make in sections:
            hints = typing.get_type_hints(owner, include_extras=True)
            for f in dataclasses.fields(owner):
                if hints[f.name] is str and f.name != "model":
                    raise AssertionError(f"{name}: {prefix}{f.name} is free text: declare its choices with one_of")
                if choices_of(hints[f.name]) is None:
                    continue
                named = rf"(?i)^(Unknown {prefix}{f.name} 'nope'; known: \[|.*\b{f.name}\b)"
                with pytest.raises(ValueError, match=named):
                    make(**{f.name: "nope"}).validate(fam)
                checked += 1
    print(f"{checked} enumerated knobs refused a value outside their choices")
    assert checked > 3 * len(known())
