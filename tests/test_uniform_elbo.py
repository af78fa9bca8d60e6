"""The uniform-noise likelihood estimates (DiffusionGemma; ``dare.diffusion.uniform_elbo_terms``, the uniform branches
of ``MeanField`` and ``QuadratureElbo``): the ELBO is exact where it can be enumerated (a 3-token vocabulary, two
positions: with the true posterior as the model, the time integral of the expected terms is -log p(x) for every x),
any other model pays in expectation, the closed form is the Bregman sum it stands for, and on the tiny model the
noise follows the forward process, the positions after the stop reveal nothing and a later canvas changes no
earlier score."""

import itertools

import pytest
import torch

from dare.diffusion import uniform_elbo_terms
from dare.likelihood import MeanField, QuadratureElbo, gauss_legendre, uniform_noisy
from dare.models import tiny
from dare.models.family import Family

V, L = 3, 2
SEQUENCES = torch.tensor(list(itertools.product(range(V), repeat=L)))


def forward(z, x, t):
    """q_t(z | x) of whole sequences (last dimension), alpha = 1 - t."""
    return torch.where(z == x, 1 - t + t / V, t / V).prod(-1)


def data_distribution(seed=0):
    p = torch.rand(len(SEQUENCES), generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.05
    return p / p.sum()


def posterior_logits(p, t):
    """For every noisy sequence z: log p(x_i = v | z) ``[Z, L, V]``, by enumeration."""
    post = p[None] * forward(SEQUENCES[:, None], SEQUENCES[None], t)  # [z, x]
    post = post / post.sum(-1, keepdim=True)
    onehot = torch.nn.functional.one_hot(SEQUENCES, V).double()  # [x, L, V]
    return torch.einsum("zx,xlv->zlv", post, onehot).log()


def expected_terms(logits_of, x, t):
    """``E_{z ~ q_t(.|x)} sum_i f_i(t, z)``, every z enumerated."""
    logits = logits_of(t)
    terms = uniform_elbo_terms(logits, x.expand(len(SEQUENCES), -1), SEQUENCES, torch.tensor(t).expand(len(SEQUENCES)))
    return float((forward(SEQUENCES, x, t) * terms.sum(-1)).sum())


def negative_elbo(logits_of, x, nodes=96):
    """The time integral on [0, 1] by Gauss-Legendre after t = s^2 (the integrand has a log singularity at 0)."""
    s, w = gauss_legendre(nodes)
    return sum(float(w_k) * 2 * float(s_k) * expected_terms(logits_of, x, float(s_k) ** 2)
               for s_k, w_k in zip(s, w, strict=True))


def bregman_sum(m, x, z, t, vocab):
    """``f`` as its definition writes it, in 50-digit arithmetic (mpmath; torch's sympy dependency)."""
    import mpmath

    mpmath.mp.dps = 50
    t, m = mpmath.mpf(t), [mpmath.mpf(v) for v in m]
    alpha = 1 - t
    total = mpmath.mpf(0)
    for y in range(vocab):
        if y != z:
            s = 1 + vocab * alpha / t * m[y] - vocab * alpha / (vocab * alpha + t) * m[z]  # the model's ratio
            r = (vocab * alpha * (y == x) + t) / (vocab * alpha * (z == x) + t)  # the true one given x
            total += r * (s / r - mpmath.log(s / r) - 1)
    return float(total / (alpha * vocab))


def test_the_closed_form_is_the_bregman_sum_it_stands_for():
    vocab = 7
    gen = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(2, vocab, generator=gen, dtype=torch.float64)
    clean, moved = torch.tensor([2, 6]), torch.tensor([5, 0])
    m = logits.softmax(-1).tolist()
    for t in (1e-3, 0.3, 0.9, 0.999):
        for noisy in (clean, moved):
            closed = uniform_elbo_terms(logits, clean, noisy, torch.tensor(t, dtype=torch.float64))
            exact = [bregman_sum(m[i], int(clean[i]), int(noisy[i]), t, vocab) for i in range(2)]
            assert torch.allclose(closed, torch.tensor(exact, dtype=torch.float64), rtol=1e-9), (t, closed, exact)
            assert bool((closed > 0).all())


@pytest.fixture(scope="module")
def distribution():
    return data_distribution()


def test_the_elbo_is_exact_with_the_true_posterior(distribution):
    p = distribution
    gaps = [negative_elbo(lambda t: posterior_logits(p, t), x) + float(p[i].log()) for i, x in enumerate(SEQUENCES)]
    print(f"uniform ELBO with the true posterior: max |NELBO + log p(x)| over {len(gaps)} sequences = "
          f"{max(map(abs, gaps)):.1e}")
    assert max(map(abs, gaps)) < 1e-5, gaps


def test_any_other_model_pays_in_expectation_over_the_data(distribution):
    p = distribution
    entropy = -float((p * p.log()).sum())
    noise = 0.7 * torch.randn(len(SEQUENCES), L, V, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    models = {"the posterior, perturbed": lambda t: posterior_logits(p, t) + noise,
              "the data marginals, ignoring z": lambda t: posterior_logits(p, 1.0 - 1e-9),
              "uniform": lambda t: torch.zeros(len(SEQUENCES), L, V, dtype=torch.float64)}
    for name, logits_of in models.items():
        excess = sum(float(p[i]) * negative_elbo(logits_of, x, nodes=48) for i, x in enumerate(SEQUENCES)) - entropy
        print(f"{name}: E[NELBO] - H(p) = {excess:.4f} nats")
        assert excess > 0.01, name


@pytest.fixture(scope="module")
def parts():
    model, tok = tiny("diffusion_gemma")
    family = Family.from_pretrained(model.config, tok)
    gen = torch.Generator().manual_seed(0)
    n, width = 4, 20  # 3 canvases of 8, the last partial
    completion = torch.randint(3, family.vocab_size, (n, width), generator=gen)
    completion_mask = (torch.arange(width)[None] < torch.tensor([20, 13, 7, 1])[:, None]).long()
    batch = {"prompt_ids": torch.randint(3, family.vocab_size, (n, 6), generator=gen),
             "prompt_mask": torch.ones(n, 6, dtype=torch.long), "completion_ids": completion,
             "completion_mask": completion_mask, "loss_mask": completion_mask}
    return model.eval(), family, batch


def with_tail_changed(family, batch, seed=9):
    """The batch with every completion token after the loss mask replaced."""
    gen = torch.Generator().manual_seed(seed)
    other = torch.randint(3, family.vocab_size, batch["completion_ids"].shape, generator=gen)
    return {**batch, "completion_ids": torch.where(batch["loss_mask"].bool(), batch["completion_ids"], other)}


def test_the_noise_follows_the_forward_process_and_the_tail_is_pure_noise(parts):
    _, family, batch = parts
    big = {k: v.repeat(64, 1) for k, v in batch.items()}
    width_p = batch["prompt_ids"].shape[1]
    for t in (0.25, 0.75):
        noisy = uniform_noisy(family, big, t, torch.Generator().manual_seed(3))
        assert noisy.shape[1] == width_p + 24  # whole canvases
        changed = (noisy[:, width_p:width_p + 20] != big["completion_ids"])[big["loss_mask"].bool()].float()
        expected = t * (1 - 1 / family.vocab_size)
        se = (expected * (1 - expected) / changed.numel()) ** 0.5
        assert abs(changed.mean().item() - expected) < 5 * se, (t, changed.mean().item(), expected)
        assert torch.equal(noisy[:, :width_p], big["prompt_ids"])  # p_prompt = 0: the prompt is clean
        again = uniform_noisy(family, with_tail_changed(family, big), t, torch.Generator().manual_seed(3))
        assert torch.equal(again, noisy), "positions after the stop must be noise whatever they held"
    prompt_noised = uniform_noisy(family, big, 1.0, torch.Generator().manual_seed(3), p_prompt=0.5)
    share = (prompt_noised[:, :width_p] != big["prompt_ids"]).float().mean().item()
    assert abs(share - 0.5 * (1 - 1 / family.vocab_size)) < 0.05


@pytest.mark.parametrize("estimator", [MeanField(0.0), QuadratureElbo(points=2)], ids=["mean_field", "quadrature"])
def test_scores_reveal_nothing_after_the_stop(parts, estimator):
    model, family, batch = parts
    noise = estimator.corrupt(family, batch, torch.Generator().manual_seed(4))
    with torch.no_grad():
        one = estimator.score(model, family, batch, noise).logp
        two = estimator.score(model, family, with_tail_changed(family, batch), noise).logp
    assert torch.isfinite(one).all()
    if one.shape == batch["loss_mask"].shape:  # per token: the loss tokens' scores (the targets after differ)
        one, two = one * batch["loss_mask"], two * batch["loss_mask"]
    assert torch.equal(one, two)


def test_a_later_canvas_cannot_change_an_earlier_canvas_mean_field_score(parts):
    model, family, batch = parts
    estimator = MeanField(0.0)
    noise = estimator.corrupt(family, batch, torch.Generator().manual_seed(5))
    later = batch["completion_ids"].clone()
    later[:, 8:] = (later[:, 8:] + 1) % family.vocab_size
    with torch.no_grad():
        one = estimator.score(model, family, batch, noise).logp
        two = estimator.score(model, family, {**batch, "completion_ids": later}, noise).logp
    assert torch.equal(one[:, :8], two[:, :8])
    assert not torch.equal(one[:1, 8:16], two[:1, 8:16])  # the second canvas sees the first one's clean tokens


def test_the_quadrature_elbo_is_a_weighted_mean_of_its_nodes_terms(parts):
    model, family, batch = parts
    estimator = QuadratureElbo(points=3)
    noise = estimator.corrupt(family, batch, torch.Generator().manual_seed(6))
    assert torch.allclose(noise["weight"].sum(-1), torch.full((4,), 3.0, dtype=noise["weight"].dtype))
    with torch.no_grad():
        values = estimator.score(model, family, batch, noise).logp
    assert values.shape == (4, 3) and bool((values <= 0).all())
    one = estimator.score(model, family, batch, noise, draw=1).logp
    assert torch.allclose(one[:, 0], values[:, 1])
