"""Each algorithm's own properties from the spec (algorithms.md §3.2, 3.6, 3.7, 3.8, 3.10, 3.11, §9 vectors)."""

import math
from types import SimpleNamespace

import pytest
import torch

from dare.algos import get_algorithm
from dare.algos.core import clipped_ratio_loss, log_clipped_loss
from dare.diffusion import batch_stratified_counts, block_random_masks, block_stratified_masks, stratified_counts
from dare.likelihood import Autoregressive, Coupled, SequenceElbo, sandwich_bounds, score_tokens
from dare.models import Family, tiny
from dare.sampling import SamplingConfig, generate


def setup(family_name="llada", rows=4, prompt=6, length=10, seed=0):
    model, tok = tiny(family_name)
    fam = Family.from_pretrained(model.config, tok)
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(20, 200, (rows, prompt), generator=g)
    completion = torch.randint(20, 200, (rows, length), generator=g)
    ones = torch.ones_like(completion)
    batch = {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion,
             "completion_mask": ones, "loss_mask": ones.clone()}
    return model.double(), fam, batch


# ---------------------------------------------------------------------------------------------- coupled-grpo

def test_coupled_masks_cover_every_token_exactly_once_and_t_changes():
    _, fam, batch = setup()
    estimator, ts = Coupled(), set()
    for seed in range(5):
        noise = estimator.corrupt(fam, batch, torch.Generator().manual_seed(seed))
        first = noise["first"]
        second = batch["completion_mask"].bool() & ~first
        assert torch.equal(first ^ second, batch["completion_mask"].bool()) and not (first & second).any()
        assert 0.2 <= float(noise["t"][0]) <= 0.8
        ts.add(float(noise["t"][0]))
    assert len(ts) == 5  # a fresh t per draw: not the reference's fixed 0.5837


def test_coupled_pair_weights_average_to_two():
    """Each half of the pair is an unbiased (1/t, 1/(1-t)) estimate and every token lands in exactly one, so on a
    context-free model the pair term is 2 l per token and the paper's estimate 1/2 (l + pair) is 1.5 l (a fixed
    scale; the spec's "equals l" drops the factor)."""
    _, fam, batch = setup(rows=2, length=6)
    g, weights = torch.Generator().manual_seed(0), []
    for _ in range(20000):
        noise = Coupled().corrupt(fam, batch, g)
        t = noise["t"][:, None]
        weights.append(torch.where(noise["first"], 1 / t, 1 / (1 - t)))
    assert torch.allclose(torch.stack(weights).mean(0), torch.full((2, 6), 2.0), atol=0.05)


# ------------------------------------------------------------------------------------------------------ bgpo

def test_bgpo_on_policy_value_and_gradient_equal_the_sequence_objective():
    """At theta = theta_old the per-sample linearised surrogate has value -A (times the length weights) and the
    gradient of -A exp(mean_j Delta_j)."""
    model, fam, batch = setup()
    batch["advantages"] = torch.tensor([1.0, -0.5, 0.25, -1.0], dtype=torch.float64)
    algo, config = get_algorithm("bgpo")(samples=4, stream=False).validate(fam), SamplingConfig()
    batch["noise"] = [algo.corrupt(fam, batch, torch.Generator().manual_seed(0), config)]
    loss, _ = algo.step_loss(model, fam, batch, 0, 0, algo.normaliser(fam, batch, config), config)
    params = [p for p in model.parameters()]
    grads = torch.autograd.grad(loss, params)
    value = algo.score(model, fam, batch, batch["noise"][0], config).logp
    tokens = batch["loss_mask"].sum(-1).double()
    target = -(batch["advantages"] * torch.exp((value - value.detach()).mean(-1)) * tokens).sum() / tokens.sum()
    assert torch.allclose(loss.detach(), -(batch["advantages"] * tokens).sum() / tokens.sum())
    expected = torch.autograd.grad(target, params)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(grads, expected, strict=True))


def test_bgpo_linearised_ratio_is_a_lower_bound_and_never_nan():
    g = torch.Generator().manual_seed(0)
    delta = torch.rand(1000, 8, generator=g, dtype=torch.float64) - 0.5
    for sign in (1.0, -1.0):
        rho = torch.exp(delta) if sign < 0 else 1 + delta
        assert (sign * rho.mean(-1) <= sign * torch.exp(delta.mean(-1)) + 1e-12).all()
    loss, _ = clipped_ratio_loss(1 + torch.tensor([-1.5, -1.0]), torch.tensor([1.0, 1.0]))
    assert torch.isfinite(loss).all()  # the reference's exp(log(1 + Delta)) is NaN here
    # spec §9: (A=+1, Delta=-0.1) -> rho 0.9, loss -0.9; (A=-1, Delta=+0.1) -> rho e^0.1, loss 1.105171
    assert torch.allclose(clipped_ratio_loss(torch.tensor([0.9]), torch.tensor([1.0]))[0], torch.tensor([-0.9]))
    assert torch.allclose(clipped_ratio_loss(torch.tensor([math.exp(0.1)]), torch.tensor([-1.0]))[0],
                          torch.tensor([1.105171]))


# ------------------------------------------------------------------------------------------------------- spg

def test_spg_sandwich_vector_and_jensen():
    logp = torch.log(torch.tensor([[[0.2], [0.8]]], dtype=torch.float64))  # two fully masked draws, one token
    lower, upper = sandwich_bounds(logp, torch.ones_like(logp, dtype=torch.bool), torch.tensor([1]), 1.5)
    assert torch.allclose(lower, torch.tensor([-0.916291], dtype=torch.float64), atol=1e-6)
    assert torch.allclose(upper, torch.tensor([-0.606720], dtype=torch.float64), atol=1e-6)
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(5, 3, 7, generator=g, dtype=torch.float64) * 4
    lower, upper = sandwich_bounds(logp, torch.ones_like(logp, dtype=torch.bool), torch.full((5,), 7), 1.5)
    assert (upper >= lower).all()


def test_spg_block_random_mask_region():
    """Per draw: a block b, clean before it, 1..l_b masked tokens in it, everything valid after it masked; the
    blocks of different draws are distinct while there are enough valid blocks."""
    maskable = torch.ones(3, 16, dtype=torch.bool)
    maskable[2, 10:] = False  # 3 valid blocks, the last one partial
    masks = block_random_masks(maskable, 4, 3, torch.Generator().manual_seed(0))
    for i in range(3):
        chosen = []
        for m in masks[i]:
            b = int(m.nonzero()[0]) // 4
            chosen.append(b)
            assert not m[:4 * b].any() and torch.equal(m[4 * b + 4:], maskable[i, 4 * b + 4:])
            assert 1 <= int(m[4 * b:4 * b + 4].sum()) <= int(maskable[i, 4 * b:4 * b + 4].sum())
        assert len(set(chosen)) == 3
    # more draws than valid blocks: every block is drawn floor or ceil(draws / V) times; no maskable token: no mask
    maskable = torch.zeros(2, 16, dtype=torch.bool)
    maskable[0, :10] = True
    masks = block_random_masks(maskable, 4, 7, torch.Generator().manual_seed(1))
    firsts = [int(m.nonzero()[0]) // 4 for m in masks[0]]
    assert sorted(firsts.count(b) for b in range(3)) == [2, 2, 3] and not masks[1].any()
    # the count in the chosen block is uniform on 1..l_b
    maskable = torch.ones(4000, 4, dtype=torch.bool)
    counts = block_random_masks(maskable, 4, 1, torch.Generator().manual_seed(2)).sum(-1).flatten()
    freq = torch.bincount(counts, minlength=5)[1:].double() / len(counts)
    assert (freq - 0.25).abs().max() < 4 * (0.25 * 0.75 / len(counts)) ** 0.5, freq


def test_spg_gradient_is_reinforce_on_the_bound():
    model, fam, batch = setup()
    batch["advantages"] = torch.tensor([1.0, -0.5, 0.25, -1.0], dtype=torch.float64)
    algo, config = get_algorithm("spg")().validate(fam), SamplingConfig()
    batch["noise"] = [algo.corrupt(fam, batch, torch.Generator().manual_seed(0), config)]
    loss, _ = algo.step_loss(model, fam, batch, 0, 0, algo.normaliser(fam, batch, config), config)
    params = list(model.parameters())
    bounds = algo.score(model, fam, batch, batch["noise"][0], config).logp
    adv, tokens = batch["advantages"], batch["loss_mask"].sum(-1).double()
    est = torch.where(adv > 0, bounds[:, 0], bounds[:, 1])
    expected = torch.autograd.grad(-(adv * tokens * est).sum() / tokens.sum(), params, retain_graph=True)
    got = torch.autograd.grad(loss, params)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(got, expected, strict=True))


# ------------------------------------------------------------------------------------------------------ ebpo

def test_ebpo_every_block_has_a_target_and_weights_are_unbiased():
    maskable = torch.ones(2, 11, dtype=torch.bool)
    maskable[1, 7:] = False
    offsets = torch.tensor([2, 5])
    g, total = torch.Generator().manual_seed(0), torch.zeros(2, 11, dtype=torch.float64)
    draws = 4000
    for _ in range(draws // 8):
        masks, p = block_stratified_masks(maskable, offsets, 4, 8, g)
        for i in range(2):
            ids = (offsets[i] + torch.arange(11)) // 4
            for b in ids[maskable[i]].unique():
                in_block = maskable[i] & (ids == b)
                counts = masks[i][:, in_block].sum(-1)
                assert (counts >= 1).all() and (counts <= in_block.sum()).all()
                assert torch.allclose(p[i][:, in_block], (counts / in_block.sum())[:, None].float())  # p = q / l_b
        total += (masks / p.clamp(min=1e-12)).sum(1).double()
    assert torch.allclose(total[maskable] / draws, torch.ones(int(maskable.sum()), dtype=torch.float64), atol=0.08)
    assert (total[~maskable] == 0).all()


@pytest.mark.parametrize("family_name", ["llada", "dream"])
def test_ebpo_masked_families_score_each_semi_ar_block_from_its_sampler_state(family_name):
    """On a masked family the composite ELBO follows the rollout's semi-AR blocks: block b's term is read from clean
    earlier blocks, its own noisy tokens and FULLY masked later blocks (so it cannot see later tokens), one forward
    per block; the value is the sum of the blocks' terms."""
    model, fam, batch = setup(family_name, rows=2, length=8)
    algo = get_algorithm("ebpo")(samples=2)
    est = algo.estimator(fam, algo.rollout_sampling(fam, SamplingConfig(gen_length=8, block_length=4)))
    noise = est.corrupt(fam, batch, torch.Generator().manual_seed(0))
    first, second = torch.arange(8) < 4, torch.arange(8) >= 4
    assert ((noise["masks"] & first).sum(-1) >= 1).all() and ((noise["masks"] & second).sum(-1) >= 1).all()
    only_first = {"masks": noise["masks"] & first, "p": noise["p"]}
    value = est.score(model, fam, batch, only_first).logp
    changed = {**batch, "completion_ids": batch["completion_ids"].clone()}
    changed["completion_ids"][:, 4:] = 7
    assert torch.equal(est.score(model, fam, changed, only_first).logp, value)  # later tokens unseen
    for n in range(2):  # by hand: one forward with the second block masked
        hidden = only_first["masks"][:, n] | second
        noisy = torch.cat([batch["prompt_ids"], batch["completion_ids"].masked_fill(hidden, fam.mask_id)], 1)
        logp = fam.logits(model, noisy, torch.ones_like(noisy))[:, 6:].log_softmax(-1)
        logp = logp.gather(-1, batch["completion_ids"][..., None])[..., 0]
        torch.testing.assert_close(value[:, n], (logp * hidden * first / noise["p"][:, n]).sum(-1))
    whole = est.score(model, fam, batch, noise).logp
    only_second = {"masks": noise["masks"] & second, "p": noise["p"]}
    torch.testing.assert_close(whole, value + est.score(model, fam, batch, only_second).logp)


def test_ebpo_log_domain_clip_matches_ratio_clip_without_overflow():
    r = torch.logspace(-3, 3, 200, dtype=torch.float64)
    for a in (-1.0, 0.0, 1.0):
        adv = torch.full_like(r, a)
        assert torch.allclose(log_clipped_loss(r.log(), adv)[0], clipped_ratio_loss(r, adv, dual_clip=None)[0])
    assert torch.isfinite(log_clipped_loss(torch.tensor([80.0]), torch.tensor([1.0]))[0]).all()
    assert log_clipped_loss(torch.tensor([1.0]), torch.tensor([1.0]))[0].item() == pytest.approx(-1.2)  # §9
    assert log_clipped_loss(torch.tensor([-1.0]), torch.tensor([-1.0]))[0].item() == pytest.approx(0.8)


# ------------------------------------------------------------------------------------------------------ espo

def test_mask_counts_are_stratified_and_uniform_per_row():
    """Both stratified schemes span the range within a batch / a sequence and give every row a uniform marginal
    (the reference's rounded integer offsets do not: for L = 5, B = 4 row 1 only ever gets 0, 2 or 4 masks)."""
    counts = batch_stratified_counts(torch.full((11,), 10), torch.Generator().manual_seed(3))
    assert sorted(counts.tolist()) == list(range(11))  # B = L + 1 rows: every count 0..L exactly once
    g = torch.Generator().manual_seed(0)
    espo = torch.stack([batch_stratified_counts(torch.full((4,), 5), g) for _ in range(12000)])
    bgpo = torch.stack([stratified_counts(torch.tensor([10]), 4, g)[0] for _ in range(12000)])
    for draws, values in ((espo, range(6)), (bgpo, range(1, 11))):
        for row in draws.T:
            freq = torch.stack([(row == v).double().mean() for v in values])
            assert torch.allclose(freq, torch.full_like(freq, 1 / len(values)), atol=0.02)
    assert all(len(set(row.tolist())) == 4 for row in bgpo[:100])  # a sequence's draws are distinct levels


def test_espo_halves_are_unbiased():
    _, fam, batch = setup(rows=4, length=5)
    g, est = torch.Generator().manual_seed(0), SequenceElbo(samples=1)
    length = 5
    first, second = torch.zeros(4, 5, dtype=torch.float64), torch.zeros(4, 5, dtype=torch.float64)
    draws = 6000
    for _ in range(draws):
        noise = est.corrupt(fam, batch, g)
        masked, p = noise["masks"][:, 0], noise["p"][:, 0].double()[:, None]
        first += masked / p.clamp(min=1e-12)
        second += ~masked / (length / (length + 1) - p).clamp(min=1e-12)
    assert torch.allclose(first / draws, torch.ones(4, 5, dtype=torch.float64), atol=0.08)
    assert torch.allclose(second / draws, torch.ones(4, 5, dtype=torch.float64), atol=0.08)


def test_espo_eps_zero_gradient_at_the_tie_is_pinned():
    """With eps = 0 and r = 1 exactly (first iteration) both branches tie: torch.maximum splits the gradient and
    clamp passes it at its bound, so the halves add up to the full policy gradient -A (the same ops as the
    reference; pinned so a change of formulation is deliberate)."""
    log_ratio = torch.zeros(3, requires_grad=True, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    loss, _ = clipped_ratio_loss(torch.exp(log_ratio), adv, 0.0, 0.0, None)
    (grad,) = torch.autograd.grad(loss.sum(), log_ratio)
    assert torch.allclose(grad, -adv)


# -------------------------------------------------------------------------------------------------- justgrpo

def by_hand_layout(fam, prompt, noisy_completion, completion):
    """``prompt ‖ completion`` as the sampler saw it: block families continue with masks to the end of the last
    block (the official samplers decode the last block whole), and read it through ``[x_t ‖ x_0]``."""
    noisy = torch.cat([prompt, noisy_completion], 1)
    if not fam.is_block_diffusion:
        return noisy, None
    tail = prompt.new_full((len(prompt), -noisy.shape[1] % fam.block_size), fam.mask_id)
    return torch.cat([noisy, tail], 1), torch.cat([prompt, completion, tail], 1)


@pytest.mark.parametrize("family_name", ["llada", "dream", "sdar"])
def test_justgrpo_likelihood_is_the_sum_of_ar_conditionals(family_name):
    model, fam, batch = setup(family_name, rows=2, length=8)
    chunked = Autoregressive(0.7, 3, (fam.mask_id,)).score(model, fam, batch, {}).logp
    one = Autoregressive(0.7, 1, (fam.mask_id,)).score(model, fam, batch, {}).logp
    assert torch.allclose(chunked, one, atol=1e-10)
    for t in range(8):  # by hand: mask positions t.., read position t, divide by T, ban the mask token
        masked = batch["completion_ids"].clone()
        masked[:, t:] = fam.mask_id
        noisy, clean = by_hand_layout(fam, batch["prompt_ids"], masked, batch["completion_ids"])
        logits = fam.logits(model, noisy, torch.ones_like(noisy), clean_ids=clean)[:, 6 + t] / 0.7
        logits[:, fam.mask_id] = float("-inf")
        expected = logits.log_softmax(-1).gather(-1, batch["completion_ids"][:, t:t + 1])[:, 0]
        assert torch.allclose(one[:, t], expected, atol=1e-10)


@pytest.mark.parametrize("family_name", ["llada", "sdar"])
def test_justgrpo_sampler_is_the_learner(family_name):
    """The rollout JustGRPO asks for decodes left to right one token per step; at T = 0 every sampled token is the
    argmax of the learner's distribution at that position."""
    model, fam, batch = setup(family_name, rows=2, length=8)
    algo = get_algorithm("justgrpo")()
    config = algo.rollout_sampling(fam, SamplingConfig(gen_length=8, temperature=0.0, threshold=0.9, cache="dual"))
    out = generate(model, fam, batch["prompt_ids"], batch["prompt_mask"], config)
    assert (out.step_map.diff(dim=-1) > 0).all()  # one token per step, left to right (block families leave the
    batch["completion_ids"] = out.sequences       # unused step slots of a block the prompt partly fills)
    logits_order = []
    for t in range(8):
        masked = out.sequences.clone()
        masked[:, t:] = fam.mask_id
        noisy = torch.cat([batch["prompt_ids"], masked], 1)
        est = score_tokens(model, fam, batch, noisy, 1.0, (fam.mask_id,), torch.tensor([t]))
        logits_order.append(est.logp[:, 0])
    # the argmax's log-prob is the largest: compare against every alternative token at each position
    for t in range(8):
        masked = out.sequences.clone()
        masked[:, t:] = fam.mask_id
        noisy, clean = by_hand_layout(fam, batch["prompt_ids"], masked, out.sequences)
        logits = fam.logits(model, noisy, torch.ones_like(noisy), clean_ids=clean)[:, 6 + t]
        logits[:, fam.mask_id] = float("-inf")
        assert torch.equal(logits.argmax(-1), out.sequences[:, t])


# ------------------------------------------------------------------------------------------------------- wd1

def test_wd1_weights_are_group_softmaxes_of_the_advantages():
    from dare.algos.wd1 import group_weights
    advantages = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    w = group_weights(advantages, 4, 1.0, True).view(2, 4)
    expected = (math.exp(0.5) - math.exp(-0.5)) / (2 * math.exp(0.5) + 2 * math.exp(-0.5))  # w+ - w- by hand
    assert torch.allclose(w[0], expected * torch.tensor([1.0, -1, -1, 1], dtype=torch.float64), atol=1e-12)
    assert w[1].abs().max() == 0, "an all-equal group has no weight"
    assert torch.allclose(group_weights(torch.tensor([0.5, -0.5]), 2, 1.0, True), torch.tensor([1.0, -1]) *
                          math.tanh(0.5))
    positive = group_weights(advantages, 4, 1.0, False).view(2, 4)
    assert torch.allclose(positive.sum(-1), torch.ones(2, dtype=torch.float64)) and (positive > 0).all()
    other = advantages.clone()
    other[4:] = torch.tensor([3.0, -1, -1, -1])
    assert torch.equal(group_weights(other, 4, 1.0, True)[:4], w[0]), "each group's weights are its own"


def test_wd1_loss_is_the_weighted_likelihood_free_of_the_old_policy():
    from dare.algos.wd1 import group_weights
    model, fam, batch = setup()
    algo, config = get_algorithm("wd1")(num_iterations=2).validate(fam), SamplingConfig()
    batch["advantages"] = torch.tensor([1.0, -1.0, 0.25, -0.25], dtype=torch.float64)
    batch["weight"] = group_weights(batch["advantages"], 2, algo.psi, True) * 2
    batch["noise"] = [algo.corrupt(fam, batch, torch.Generator().manual_seed(0), config)]
    params = list(model.parameters())
    normaliser = algo.normaliser(fam, batch, config)
    loss, _ = algo.step_loss(model, fam, batch, 0, 0, normaliser, config)
    got = torch.autograd.grad(loss, params)
    logp = algo.score(model, fam, batch, batch["noise"][0], config).logp
    sequence = (logp * batch["loss_mask"]).sum(-1)
    weights = [math.tanh(1.0), -math.tanh(1.0), math.tanh(0.25), -math.tanh(0.25)]  # w+ - w- for G = 2
    expected = -sum(w * s for w, s in zip(weights, sequence, strict=True)) / 2  # two prompts
    assert torch.allclose(loss, expected, atol=1e-10)
    batch["old"] = [logp.detach() + torch.randn_like(logp)]  # any old policy: the loss never reads it
    again, _ = algo.step_loss(model, fam, batch, 0, 0, normaliser, config)
    assert torch.equal(again, loss)
    assert all(torch.equal(a, b) for a, b in zip(got, torch.autograd.grad(again, params), strict=True))


def test_wd1_at_small_psi_is_reinforce_on_the_sequence_likelihood():
    from dare.algos.wd1 import group_weights
    model, fam, batch = setup()
    psi = 1e-5
    algo, config = get_algorithm("wd1")(psi=psi).validate(fam), SamplingConfig()
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    batch["advantages"], batch["weight"] = advantages, group_weights(advantages, 2, psi, True) * 2
    batch["noise"] = [algo.corrupt(fam, batch, torch.Generator().manual_seed(0), config)]
    params = list(model.parameters())
    loss, _ = algo.step_loss(model, fam, batch, 0, 0, algo.normaliser(fam, batch, config), config)
    got = torch.autograd.grad(loss, params)
    logp = algo.score(model, fam, batch, batch["noise"][0], config).logp
    reinforce = -(2 / 2 * advantages * (logp * batch["loss_mask"]).sum(-1)).sum() / 2  # c_i -> 2 psi A_i / G
    expected = torch.autograd.grad(reinforce, params)
    worst = max(((a / psi - b).abs().max() / b.abs().max()).item() for a, b in zip(got, expected, strict=True))
    assert worst < 1e-5, worst  # the second-order term: psi x A


# ------------------------------------------------------------------------------------------------------ dmpo

def test_dmpo_advantages_sum_to_zero_vanish_on_equal_rewards_and_ignore_reward_shifts():
    from dare.algos.dmpo import dmpo_advantages
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=g, dtype=torch.float64)
    rewards[8:] = 0.7  # the third group: all alike
    z = torch.randn(12, generator=g, dtype=torch.float64)
    for baseline in ("negative", "mean"):
        for coeff in (1.0, 0.3):
            a = dmpo_advantages(rewards, z, 4, 0.1, coeff, baseline).view(3, 4)
            assert a.sum(-1).abs().max() < 1e-12, (baseline, coeff)
            if baseline == "negative":  # w+ = w- up to rounding when the rewards agree, whatever z
                assert a[:2].abs().min() > 1e-6 and a[2].abs().max() < 1e-15, a
            shifted = dmpo_advantages(rewards + torch.tensor([3.0, -2.0, 5.0]).repeat_interleave(4), z, 4, 0.1,
                                      coeff, baseline)
            assert torch.allclose(shifted, a.view(-1), atol=1e-12), "a constant added to a group's rewards"
    # the negative baseline by hand for G = 2, z = 0: w+ - w- = tanh((r1 - r2) / alpha / 2) x (1, -1)
    two = dmpo_advantages(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.zeros(2, dtype=torch.float64), 2,
                          2.0, 1.0, "negative")
    assert torch.allclose(two, math.tanh(0.25) * torch.tensor([1.0, -1.0], dtype=torch.float64), atol=1e-14)


def test_dmpo_mean_baseline_is_zero_at_the_target_and_not_elsewhere():
    """At p_old = p* ∝ p_ref exp(r / alpha): z = log p_ref - log p_old = -r / alpha + log Z, so w+ is uniform and
    the mean baseline's a (the loss's weights) is exactly 0; a policy off the target gets weights."""
    from dare.algos.dmpo import dmpo_advantages
    g = torch.Generator().manual_seed(1)
    rewards, alpha = torch.rand(8, generator=g, dtype=torch.float64), 0.2
    log_z = torch.tensor([1.5, -4.0], dtype=torch.float64).repeat_interleave(4)
    at_target = dmpo_advantages(rewards, -rewards / alpha + log_z, 4, alpha, 1.0, "mean")
    assert at_target.abs().max() < 1e-15
    off = dmpo_advantages(rewards, -rewards / alpha / 2 + log_z, 4, alpha, 1.0, "mean")
    assert off.abs().min() > 1e-3
    assert torch.allclose(dmpo_advantages(rewards, -rewards / alpha, 4, alpha, 0.5, "mean"), at_target, atol=1e-15)


@pytest.mark.parametrize("masks, samples", [("stratified", 3), ("antithetic", 4)])
def test_dmpo_loss_is_the_weighted_denoising_cross_entropy_free_of_ratios(masks, samples):
    model, fam, batch = setup()
    algo, config = get_algorithm("dmpo")(samples=samples, masks=masks).validate(fam), SamplingConfig()
    weight = torch.tensor([1.5, -1.5, 0.5, -0.5], dtype=torch.float64)
    batch.update(weight=weight, rewards=torch.zeros(4), log_ref_ratio=torch.zeros(4))
    batch["noise"] = [algo.corrupt(fam, batch, torch.Generator().manual_seed(0), config)]
    params, normaliser = list(model.parameters()), algo.normaliser(fam, batch, config)
    assert algo.streams(fam, config) == samples
    losses = [algo.step_loss(model, fam, batch, 0, s, normaliser, config)[0] for s in range(samples)]
    got = torch.autograd.grad(sum(losses), params)
    drawn = batch["noise"][0]["masks"]
    dce = []
    for j in range(samples):  # by hand: the masked tokens' mean cross-entropy of each draw
        noisy = torch.cat([batch["prompt_ids"], batch["completion_ids"].masked_fill(drawn[:, j], fam.mask_id)], 1)
        logp = torch.log_softmax(fam.logits(model, noisy)[:, -10:].double(), -1)
        logp = logp.gather(-1, batch["completion_ids"][..., None])[..., 0]
        dce.append(-(logp * drawn[:, j]).sum(-1) / drawn[:, j].sum(-1).clamp(min=1))
    expected = (weight * torch.stack(dce, -1).mean(-1)).sum() / 4
    assert torch.allclose(sum(losses), expected, atol=1e-10)
    batch["old"] = [torch.randn(4, samples, dtype=torch.float64)]  # any rollout-policy score: never read
    again = sum(algo.step_loss(model, fam, batch, 0, s, normaliser, config)[0] for s in range(samples))
    assert all(torch.equal(a, b) for a, b in zip(got, torch.autograd.grad(again, params), strict=True))


def test_dmpo_antithetic_masks_pair_each_draw_with_its_complement():
    """The authors' masks: draw j + K/2 is draw j's complement among the maskable tokens (together they mask each
    once), each at a rate in [0.1, 1]; the padding is never masked; an odd count is refused."""
    from dare.likelihood import AntitheticElbo
    _, fam, batch = setup()
    batch["loss_mask"][0, 7:] = 0  # a row with 3 padding positions
    noise = AntitheticElbo(6).corrupt(fam, batch, torch.Generator().manual_seed(0))
    masks, maskable = noise["masks"], batch["loss_mask"].bool()
    first, second = masks[:, :3], masks[:, 3:]
    assert torch.equal(first ^ second, maskable[:, None].expand_as(first)) and not (first & second).any()
    assert not masks[0, :, 7:].any()
    rates = first.sum(-1) / maskable.sum(-1, keepdim=True)
    assert 0 < rates.mean() < 1 and torch.equal(noise["p"], masks.sum(-1).clamp(min=1) / maskable.sum(-1)[:, None])
    many = AntitheticElbo(2000).corrupt(fam, batch, torch.Generator().manual_seed(1))["masks"][:, :1000].float()
    share = (many * maskable[:, None]).sum() / (maskable.sum() * 1000)
    assert abs(share.item() - 0.55) < 0.02  # E[lambda] = 0.1 + 0.9 / 2 on the maskable positions
    with pytest.raises(ValueError, match="come in pairs"):
        get_algorithm("dmpo")(samples=3).validate(fam)


def test_dmpo_tilts_toward_the_reference_across_micro_batches():
    """``after_scoring`` takes z = L (ELBO_ref - ELBO_old) per row over every draw and slot and normalises over
    whole groups even when a micro-batch cuts one; the "policy" tilt leaves the batch's z = 0 weights."""
    from dare.algos.dmpo import dmpo_advantages
    g = torch.Generator().manual_seed(2)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    lengths = torch.tensor([3, 5, 2, 6, 4, 1])
    loss_mask = (torch.arange(6)[None] < lengths[:, None]).long()
    old = [torch.randn(6, 2, generator=g) for _ in range(2)]  # two noise slots, two draws each
    ref = [torch.randn(6, 2, generator=g) for _ in range(2)]
    cuts = [slice(0, 2), slice(2, 5), slice(5, 6)]  # group of 3 rows: the first micro-batch ends mid-group
    parts = [{"rewards": rewards[c], "loss_mask": loss_mask[c], "old": [o[c] for o in old],
              "ref": [r[c] for r in ref]} for c in cuts]
    algo = get_algorithm("dmpo")(alpha=0.5)
    algo.after_scoring(parts, 3)
    z = (torch.cat(ref, -1).mean(-1) - torch.cat(old, -1).mean(-1)) * lengths
    a = dmpo_advantages(rewards, z, 3, 0.5, 1.0, "negative")
    assert torch.allclose(torch.cat([p["log_ref_ratio"] for p in parts]), z)
    assert torch.allclose(torch.cat([p["weight"] for p in parts]), 3 * a)
    policy = get_algorithm("dmpo")(tilt="policy")
    assert not policy.needs_old and not policy.needs_reference
    untouched = [{"weight": torch.ones(2)}]
    policy.after_scoring(untouched, 2)
    assert torch.equal(untouched[0]["weight"], torch.ones(2))
    # the policy tilt's weights are set with the batch: a x G, so that the mean over rows is, per prompt, the sum of
    # a_i x DCE_i over its group (the authors' loss), averaged over prompts
    _, fam, batch = setup(rows=6)
    rollout = SimpleNamespace(**{k: batch[k] for k in ("prompt_ids", "prompt_mask", "completion_ids",
                                                        "completion_mask")})
    made = policy.make_batch(fam, rollout, rewards, 3, None, 0, SamplingConfig())
    assert torch.allclose(made["weight"], 3 * policy.advantages(rewards, 3)) and made["weight"].abs().sum() > 0


# ------------------------------------------------------------------------------------------------------ gdpo

def test_gauss_legendre_nodes_integrate_polynomials_exactly():
    from dare.likelihood import gauss_legendre
    for points in range(1, 6):
        t, w = gauss_legendre(points)
        assert ((t > 0) & (t < 1)).all() and abs(w.sum() - 1) < 1e-14
        for j in range(2 * points):
            assert abs((w * t**j).sum() - 1 / (j + 1)) < 1e-13, (points, j)
    t, w = gauss_legendre(3)
    assert torch.allclose(w, torch.tensor([5 / 18, 8 / 18, 5 / 18], dtype=torch.float64))


def exact_elbo(model, fam, batch):
    """The ELBO's time integral in closed form, ``sum_m (|m|-1)! (L-|m|)! / L! S_m`` over every non-empty mask m of
    the L completion tokens (S_m: the masked tokens' log-probs given m masked), divided by L."""
    import itertools

    from dare.likelihood import _masked_input
    length = batch["completion_ids"].shape[1]
    masks = torch.tensor([[i in m for i in range(length)] for k in range(1, length + 1)
                          for m in itertools.combinations(range(length), k)])
    weight = torch.tensor([math.factorial(int(k) - 1) * math.factorial(length - int(k)) / math.factorial(length)
                           for k in masks.sum(-1)], dtype=torch.float64)
    values = []
    for row in range(len(batch["completion_ids"])):
        rows = {k: v[row:row + 1].expand(len(masks), -1) for k, v in batch.items()}
        logp = score_tokens(model, fam, rows, _masked_input(fam, rows, masks)).logp
        values.append((weight * (logp * masks).sum(-1)).sum() / length)
    return torch.stack(values)


@pytest.mark.parametrize("family_name", ["llada", "sdar"])
def test_gdpo_quadrature_elbo_is_unbiased_and_beats_plain_monte_carlo_at_equal_forwards(family_name):
    """L = 6 completion tokens, 3 Gauss nodes (exact for the degree-5 integrand): the mean of 1000 SDMC estimates is
    the enumerated ELBO within 3 SE; plain double Monte Carlo (t ~ U(0,1), Bernoulli(t) masks, weight 1/t) with the
    same 3 forwards per estimate has a larger variance."""
    from dare.diffusion import uniform
    from dare.likelihood import QuadratureElbo, _masked_input
    model, fam, batch = setup(family_name, rows=2, length=6)
    exact = exact_elbo(model, fam, batch)
    repeats = 1000
    many = {k: v.repeat(repeats, 1) for k, v in batch.items()}
    sdmc = QuadratureElbo(points=3)
    g = torch.Generator().manual_seed(0)
    estimates = sdmc.score(model, fam, many, sdmc.corrupt(fam, many, g)).logp.mean(-1).view(repeats, 2)
    mean, se = estimates.mean(0), estimates.std(0) / math.sqrt(repeats)
    margin = ((mean - exact).abs() / se).max().item()
    print(f"{family_name}: SDMC mean {mean.tolist()} vs exact ELBO {exact.tolist()}: worst {margin:.2f} SE")
    assert margin < 3
    plain = []
    for _ in range(3):
        t = uniform((len(many["completion_ids"]), 1), g, "cpu").double()
        masked = uniform(many["completion_ids"].shape, g, "cpu").double() < t
        logp = score_tokens(model, fam, many, _masked_input(fam, many, masked)).logp
        plain.append((logp * masked).sum(-1) / t[:, 0] / 6)
    plain = torch.stack(plain, -1).mean(-1).view(repeats, 2)
    ratio = (estimates.var(0) / plain.var(0)).max().item()
    print(f"{family_name}: variance SDMC / plain MC at 3 forwards: {ratio:.3f}; plain MC mean {plain.mean(0).tolist()}")
    assert ratio < 1  # plain MC's variance is infinite (the 1/t weight near 0): 0.10-0.59 over 6 seeds x 2 rows


def test_gdpo_loss_is_the_clipped_sequence_ratio_and_on_policy_its_gradient_is_reinforce_on_the_elbo():
    model, fam, batch = setup()
    algo, config = get_algorithm("gdpo")(points=2, stream=False).validate(fam), SamplingConfig()
    batch["advantages"] = torch.tensor([1.0, -0.5, 0.25, -0.75], dtype=torch.float64)
    batch["noise"] = [algo.corrupt(fam, batch, torch.Generator().manual_seed(0), config)]
    params = list(model.parameters())
    loss, stats = algo.step_loss(model, fam, batch, 0, 0, algo.normaliser(fam, batch, config), config)
    assert stats["ratio"][0] / stats["ratio"][1] == 1.0
    value = algo.score(model, fam, batch, batch["noise"][0], config).logp.mean(-1)
    expected = torch.autograd.grad(-(batch["advantages"] * value).sum() / 4, params, retain_graph=True)
    got = torch.autograd.grad(loss, params)
    assert all(torch.allclose(a, b, atol=1e-10) for a, b in zip(got, expected, strict=True))
    ratio_loss = algo.sequence_loss(torch.log(torch.tensor([2.0, 0.3], dtype=torch.float64)),
                                    torch.zeros(2, dtype=torch.float64), None,
                                    {"advantages": torch.tensor([1.0, -1.0], dtype=torch.float64)})[0]
    assert torch.allclose(ratio_loss, torch.tensor([-1.2, 0.8], dtype=torch.float64))  # clipped at 1 +- 0.2


def test_chunked_entropy_equals_the_whole_tensor_formula():
    from dare.likelihood import entropy_of
    logp = torch.randn(3, 37, 501, dtype=torch.float64).log_softmax(-1)
    logp[..., :7] = float("-inf")  # banned tokens
    logp = logp - logp.logsumexp(-1, keepdim=True)
    expected = -(logp.exp() * logp.masked_fill(torch.isinf(logp), 0)).sum(-1)
    assert torch.allclose(entropy_of(logp, chunk=5), expected, atol=1e-12)
    assert torch.allclose(entropy_of(logp.float()), expected.float(), atol=1e-5)


# ---------------------------------------------------------------------------------------- unigrpo, maskgrpo

def test_unigrpo_copies_hide_answer_tokens_at_their_own_ratio_and_score_each_copy():
    """RandomMasking: each of J copies hides only loss-mask tokens (the prompt and the padding after the stop never
    drawn), each at its own t ~ U[t_min, t_max]; a copy's log-probs equal scoring that copy alone (one forward for
    all copies), and the padding after the stop is hidden in every copy."""
    from dare.likelihood import RandomMasking, _masked_input

    model, fam, batch = setup(rows=3, length=12)
    batch["loss_mask"][2, 8:] = 0  # row 2 stopped at token 7
    estimator = RandomMasking(draws=3, t_min=0.3, t_max=0.6)
    noise = estimator.corrupt(fam, batch, torch.Generator().manual_seed(0))
    masks = noise["masks"]
    assert masks.shape == (3, 3, 12) and not masks[2, :, 8:].any()
    _, _, long = setup(rows=2, length=2000)
    many = RandomMasking(draws=500, t_min=0.3, t_max=0.6).corrupt(fam, long, torch.Generator().manual_seed(1))
    share = many["masks"].float().mean(-1)  # each copy's hidden share, ~ its own t
    assert 0.27 < float(share.min()) and float(share.max()) < 0.63 and abs(float(share.mean()) - 0.45) < 0.01
    assert float(share.std()) > 0.07  # a ratio per copy (U[0.3, 0.6]: std 0.087), not one for all
    with torch.no_grad():
        scored = estimator.score(model, fam, batch, noise).logp
        for j in range(3):
            alone = score_tokens(model, fam, batch, _masked_input(fam, batch, masks[:, j])).logp
            torch.testing.assert_close(scored[:, j], alone)
        assert not torch.allclose(scored[:, 0], scored[:, 1])
    assert (_masked_input(fam, batch, masks[:, 0])[2, 6 + 8:] == fam.mask_id).all()


def test_unigrpo_loss_averages_each_copys_hidden_tokens_then_the_copies_and_sums_its_kl():
    """The loss equals dLLM-RL's random_masking loss restated: per copy the clipped surrogate's mean over its hidden
    tokens (not the batch's token mean: copies hide different counts), the copies averaged, plus beta x the k3 KL to
    the rollout policy summed over a copy's hidden tokens."""
    from dare.algos.core import kl_estimate

    model, fam, batch = setup(rows=2, length=10)
    batch["advantages"] = torch.tensor([1.0, -0.5], dtype=torch.float64)
    algo, config = get_algorithm("unigrpo")(draws=2, beta=0.3).validate(fam), SamplingConfig()
    batch["noise"] = [algo.corrupt(fam, batch, torch.Generator().manual_seed(3), config)]
    with torch.no_grad():
        old = algo.score(model, fam, batch, batch["noise"][0], config).logp
    batch["old"] = [old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(4), dtype=old.dtype)]
    normaliser = algo.normaliser(fam, batch, config)
    assert int(normaliser) == 4
    loss, stats = algo.step_loss(model, fam, batch, 0, 0, normaliser, config)
    logp, hidden = algo.score(model, fam, batch, batch["noise"][0], config).logp, batch["noise"][0]["masks"].double()
    assert len({int(c) for c in hidden.sum(-1).flatten()}) > 1  # copies hide different counts
    ratio, adv = torch.exp(logp - batch["old"][0]), batch["advantages"][:, None, None]
    surrogate = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    kl = kl_estimate(logp, batch["old"][0], "k3")
    expected = ((surrogate * hidden).sum(-1) / hidden.sum(-1) + 0.3 * (kl * hidden).sum(-1)).mean()
    torch.testing.assert_close(loss, expected)
    token_mean = ((surrogate + 0.3 * kl) * hidden).sum() / hidden.sum()
    assert not torch.isclose(loss, token_mean)
    assert set(stats) == {"clip_fraction", "ratio", "kl", "entropy"}


def test_maskgrpo_remasks_more_each_inner_iteration_and_fades_towards_the_end():
    """MaskGRPO's ratio r_i = min(c + (1 - c)(i + 1) / mu, 0.999); fading keeps early tokens more than late ones with
    a mean keep of 1 - r (random: flat); the trainer draws iteration i's noise at r_i and the loss averages over the
    hidden tokens of that iteration (its normaliser)."""
    from dare.likelihood import Remasking

    _, fam, batch = setup(rows=4000, length=10)
    algo = get_algorithm("maskgrpo")(min_mask_rate=0.6, num_iterations=12)
    assert [round(algo.ratio(i), 4) for i in (0, 5, 11)] == [0.6333, 0.8, 0.999]
    g = torch.Generator().manual_seed(0)
    kept = (~Remasking(0.7, fading=True).corrupt(fam, batch, g)["masks"][:, 0]).float().mean(0)
    line = (torch.linspace(1, 0, 10) * 0.3 * 10 / 5).clamp(max=1)
    assert torch.allclose(kept, line, atol=0.03) and abs(float(kept.mean()) - 0.3) < 0.01
    assert kept[0] > 0.5 > 0.05 > kept[-1]
    flat = (~Remasking(0.7, fading=False).corrupt(fam, batch, g)["masks"][:, 0]).float().mean(0)
    assert torch.allclose(flat, torch.full((10,), 0.3), atol=0.03)
    config = SamplingConfig()
    hidden = [float(algo.corrupt(fam, batch, g, config, iteration=i)["masks"].float().mean()) for i in (0, 11)]
    assert abs(hidden[0] - 0.6333) < 0.01 and hidden[1] > 0.99
    model, fam, small = setup(rows=2, length=10)
    small["advantages"] = torch.tensor([1.0, -1.0], dtype=torch.float64)
    small["noise"] = [algo.corrupt(fam, small, torch.Generator().manual_seed(i), config, iteration=i) for i in (0, 1)]
    with torch.no_grad():
        small["ref"] = [algo.score(model, fam, small, n, config).logp for n in small["noise"]]
    counts = algo.normaliser(fam, small, config)
    assert counts.tolist() == [float(n["masks"].sum()) for n in small["noise"]]
    loss, _ = algo.step_loss(model, fam, small, 1, 0, counts, config)
    torch.testing.assert_close(loss, torch.zeros((), dtype=loss.dtype), atol=1e-12, rtol=0)  # on-policy value 0...
    params = [p for p in model.parameters() if p.requires_grad]
    grad = torch.autograd.grad(loss, params, allow_unused=True)
    assert any(g is not None and g.abs().sum() > 0 for g in grad)  # ... but a gradient


def test_the_trainer_draws_each_inner_iterations_noise_with_its_index(tmp_path, monkeypatch):
    """train_rl.py hands corrupt the inner iteration it draws for (MaskGRPO's ratio grows with it)."""
    import train_rl
    from dare.algos.maskgrpo import MaskGRPO
    from dare.data.tasks import write_task

    seen, corrupt = [], MaskGRPO.corrupt
    monkeypatch.setattr(MaskGRPO, "corrupt", lambda self, *a, iteration=0, **k: seen.append(iteration) or
                        corrupt(self, *a, iteration=iteration, **k))
    args = train_rl.args_class("maskgrpo")(model="tiny:llada", output_dir=str(tmp_path / "out"), max_steps=3,
                                           save_steps=3, prompts_per_step=2, num_generations=2, micro_batch_size=4)
    args.data.path, args.rollout.gen_length, args.algo_config.num_iterations = \
        write_task("addition", str(tmp_path / "train.jsonl"), 8), 8, 3
    train_rl.main(args)
    assert seen == [0, 1, 2]
