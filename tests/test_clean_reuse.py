"""The clean half of ``[x_t ‖ x_0]`` computed once for every draw of no-grad scoring (``likelihood.shared_clean``):
the same values as scoring each draw in the whole layout, fewer columns fed, and no sharing where it cannot hold."""

import pytest
import torch
from conftest import BLOCK_FAMILIES, ROOT, load_script

from dare.likelihood import BlockElbo, MCElbo, MeanField, Sandwich, SequenceElbo, Trajectory, shared_clean
from dare.models import Family, tiny
from dare.packing import PackedFamily

FedCounter = load_script(ROOT / "bench" / "_common.py", "dare_bench_common").FedCounter  # columns fed, summed
ESTIMATORS = {"mc": MCElbo(samples=4), "block": BlockElbo(samples=3), "sequence": SequenceElbo(samples=2),
              "sandwich": Sandwich(samples=3), "trajectory": Trajectory(steps=4)}


def rollout(family_name, seed=0):
    """Left-padded prompts, completions of 3 blocks (row 2 stopped early), each token's decoding step."""
    model, tok = tiny(family_name)
    fam = Family.from_pretrained(model.config, tok)
    g = torch.Generator().manual_seed(seed)
    width = 3 * fam.block_size
    prompt = torch.randint(20, len(tok), (3, 10), generator=g)
    prompt_mask = torch.ones_like(prompt)
    prompt_mask[1, :3] = 0
    prompt[1, :3] = fam.pad_id
    completion = torch.randint(20, len(tok), (3, width), generator=g)
    completion_mask = torch.ones_like(completion)
    completion_mask[2, width // 2:] = 0
    steps = torch.randint(0, 4, (3, width), generator=g)
    return model, fam, {"prompt_ids": prompt, "prompt_mask": prompt_mask, "completion_ids": completion,
                        "completion_mask": completion_mask, "loss_mask": completion_mask, "steps": steps}


class Unshared:
    """The family with the clean half's cache refused: every draw in the whole ``[x_t ‖ x_0]`` layout (as before)."""

    def __init__(self, family):
        self.family = family

    def __getattr__(self, name):
        return getattr(self.family, name)

    def clean_cache(self, *args, **kwargs):
        return None


@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize("family_name", BLOCK_FAMILIES)
def test_shared_clean_half_gives_each_draws_values_and_feeds_fewer_columns(family_name, name):
    model, fam, batch = rollout(family_name)
    est = ESTIMATORS[name]
    noise = est.corrupt(fam, batch, torch.Generator().manual_seed(1))
    with torch.no_grad():
        fed = FedCounter(model)
        alone = est.score(model, Unshared(fam), batch, noise).logp
        columns_alone, fed.positions = fed.positions, 0
        shared = est.score(model, fam, batch, noise).logp
        fed.handle.remove()
    assert shared.shape == alone.shape
    assert torch.allclose(shared, alone, rtol=1e-6, atol=1e-6), (shared - alone).abs().max()  # float sum order
    assert fed.positions < columns_alone, (fed.positions, columns_alone)


def test_no_sharing_for_one_draw_a_graph_packed_rows_or_masked_families():
    model, fam, batch = rollout("sdar")
    with torch.no_grad():
        assert shared_clean(model, fam, batch, 2) is not None
        assert shared_clean(model, fam, batch, 1) is None
        assert shared_clean(model, PackedFamily(fam, 64), batch, 2) is None
        llada, ltok = tiny("llada")
        assert shared_clean(llada, Family.from_pretrained(llada.config, ltok), batch, 2) is None
    assert shared_clean(model, fam, batch, 2) is None  # a graph: every draw keeps its own clean pass


def test_a_cache_of_other_rows_is_refused():
    model, fam, batch = rollout("sdar")
    with torch.no_grad():
        cache = fam.clean_cache(model, batch["prompt_ids"])
        with pytest.raises(ValueError, match="clean cache holds 10 columns"):
            fam.logits(model, batch["completion_ids"], clean_ids=batch["completion_ids"], clean_cache=cache)


@pytest.mark.parametrize("family_name", ["sdar", "sdar_moe", "llada2"])
def test_a_draw_scores_the_same_numbers_shared_or_alone_and_its_gradient_is_the_whole_layouts(family_name):
    """Shared (no grad) and alone (with a graph) a draw makes the same two passes: equal to the bit, so a policy at
    the reference has a margin of exactly 0. Its gradient is the whole layout's (float64; the norms compute in
    float32), reaching the same parameters: an expert only clean tokens chose gets a zero gradient, as before."""
    model, fam, batch = rollout(family_name)
    model.double()
    est = ESTIMATORS["mc"]
    noise = est.corrupt(fam, batch, torch.Generator().manual_seed(3))
    with torch.no_grad():
        shared = est.score(model, fam, batch, noise).logp
    alone = torch.cat([est.score(model, fam, batch, noise, draw=j).logp for j in range(est.samples)], -1)
    assert torch.equal(alone.detach(), shared)
    mean_field = MeanField(p_prompt=0.0)  # a fully masked completion: on sdar_moe an expert only clean tokens chose
    noise, grads = mean_field.corrupt(fam, batch, torch.Generator().manual_seed(0)), []
    for family in (Unshared(fam), fam):
        model.zero_grad(set_to_none=True)
        mean_field.score(model, family, batch, noise).logp.sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for n, g in grads[0].items():
        assert (grads[1][n] - g).abs().max() <= 1e-6 * g.abs().max().clamp(min=1e-12), n


def test_activation_checkpointing_in_training_keeps_the_one_call_layout():
    """Its layers drop every cache when they build a graph, so the no-grad passes keep the one-call layout too."""
    model, fam, batch = rollout("sdar")
    model.train().activation_checkpointing_enable({"use_reentrant": False})
    with torch.no_grad():
        assert shared_clean(model, fam, batch, 2) is None
        model.eval()
        assert shared_clean(model, fam, batch, 2) is not None
