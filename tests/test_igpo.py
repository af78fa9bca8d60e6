"""IGPO's inpainting (dare/algos/igpo.py): the hint canvas, a sampler that never changes a given token, and a
rollout that inpaints only the groups whose completions all failed, replaces at most its share of them with hinted
successes, and leaves the hints out of the loss. Shared contract tests are in test_algo_contract.py."""

import pytest
import torch

from dare.algos import get_algorithm
from dare.algos.igpo import hint_canvas
from dare.engines import HFEngine
from dare.models import Family, tiny
from dare.rewards import RewardResult
from dare.sampling import SamplingConfig


def test_hint_canvas_shows_whole_chunks_of_the_reference_at_their_positions():
    reference = list(range(100, 160))  # 60 tokens
    for share in (0.0, 0.3, 1.0):
        canvas, given = hint_canvas(reference, 64, share, 5, 10, 20, 0, torch.Generator().manual_seed(1))
        assert not given[44:].any(), "the free tail is never hinted"
        assert torch.equal(canvas[given], torch.tensor(reference)[:64][given[:60]]), "tokens at their own positions"
        assert (canvas[~given] == 0).all()
        runs = torch.diff(torch.cat([torch.tensor([0]), given.long(), torch.tensor([0])])).nonzero().flatten()
        assert all(b - a >= 5 or b == 44 for a, b in zip(runs[::2].tolist(), runs[1::2].tolist(), strict=True))
    assert not hint_canvas(reference, 64, 0.0, 5, 10, 20, 0, torch.Generator())[1].any()
    assert hint_canvas(reference, 64, 1.0, 5, 10, 20, 0, torch.Generator())[1].sum() == 44


@pytest.mark.parametrize("name", ["llada", "dream", "sdar"])
def test_the_sampler_never_changes_a_given_token(name):
    model, tok = tiny(name)
    engine = HFEngine(model, tok, Family.from_pretrained(model.config, tok))
    fam = engine.family
    g = torch.Generator().manual_seed(0)
    given = torch.rand(4, 16, generator=g) < 0.4
    canvas = torch.where(given, torch.randint(20, 200, (4, 16), generator=g), fam.mask_id)
    block = None if fam.is_block_diffusion else 8
    for config in (SamplingConfig(gen_length=16, temperature=1.0, block_length=block),
                   SamplingConfig(gen_length=16, temperature=1.0, threshold=0.5, stop_at_eos=False)):
        out = engine.generate(["a b", "c"], 2, config, 3, canvas=canvas, given=given)
        kept = out.given
        assert torch.equal(out.completion_ids[kept], canvas[kept]) and (out.step_map[kept] == -1).all()
        assert kept.sum() > 0 and not (kept & ~given).any()
    with pytest.raises(ValueError, match="given marks canvas tokens"):
        engine.generate(["a"], 1, SamplingConfig(gen_length=16), 0, canvas=torch.full((1, 16), fam.mask_id),
                        given=torch.ones(1, 16, dtype=torch.bool))


def test_igpo_inpaints_only_all_failed_groups_and_leaves_the_hints_out_of_the_loss():
    model, tok = tiny("llada")
    engine = HFEngine(model, tok, Family.from_pretrained(model.config, tok))
    fam, n = engine.family, 4
    algo = get_algorithm("igpo")(free_tail=4, chunk_min=2, chunk_max=3, hint_low=0.5, hint_high=0.5).validate(fam)
    config = SamplingConfig(gen_length=16, temperature=1.0, block_length=8)
    rows = [{"prompt": "one", "extra_info": {"solution": "the answer is two plus two is four"}},
            {"prompt": "two", "extra_info": {"solution": "five"}},
            {"prompt": "three", "extra_info": {}}]  # no reference: never hinted
    calls = []

    def score(texts, picks):  # the first rollout: prompt 1 solved once, 0 and 2 never; every hinted row succeeds
        calls.append(list(picks))
        first = len(calls) == 1
        return [RewardResult(float(ok), float(ok)) for ok in
                ([p == 5 for p in picks] if first else [True] * len(picks))]
    plain = engine.generate([r["prompt"] for r in rows], n, config, 7)
    out = algo.rollout(engine, [r["prompt"] for r in rows], n, config, 7, rows=rows, score=score)
    assert calls[1] == [0, 1, 2, 3], "only group 0 (all failed, with a reference) is inpainted"
    assert out.given[:2].any(-1).all() and not out.given[2:].any(), "floor(0.5 x 4) = 2 rows replaced"
    assert torch.equal(out.completion_ids[2:], plain.completion_ids[2:]) and out.texts[2:] == plain.texts[2:]
    assert out.stats["igpo/replaced"] == (2.0, 12.0) and out.stats["igpo/failed_groups"] == (2.0, 3.0)
    batch = algo.make_batch(fam, out, torch.zeros(12), n, None, 0, config)
    assert not (batch["loss_mask"].bool() & out.given).any() and batch["loss_mask"][2:].all()
    block, block_tok = tiny("sdar")
    with pytest.raises(ValueError, match="igpo does not apply to sdar .*later blocks' hints"):
        algo.check_family(Family.from_pretrained(block.config, block_tok))


def test_the_sequence_ratio_is_one_clipped_ratio_per_row():
    """ratio_level sequence (the authors' use_gspo): every loss token of a row carries s = exp(the row's mean
    log-ratio over its loss tokens), clipped as one: a row whose s left the clip range has no gradient, even where
    its own token's ratio would not have been clipped; per token (ratio_level token) those tokens still move. The
    sequence ratio is IGPO's default."""
    from dare.likelihood import Estimate
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0], [-2.0, -2.0, -2.0, -2.0]], dtype=torch.float64)
    shift = torch.tensor([[0.6, 0.6, 0.6, -0.3], [0.01, -0.02, 0.03, 0.0]], dtype=torch.float64)  # row 0: s = e^0.3
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    batch = {"loss_mask": mask, "advantages": torch.tensor([1.0, 1.0], dtype=torch.float64)}
    grads = {}
    for level in ("sequence", "token"):
        logp = (old + shift).requires_grad_()
        kind = {} if level == "sequence" else {"ratio_level": level}  # the default: the authors' sequence ratio
        algo = get_algorithm("igpo")(**kind, eps_low=0.2, eps_high=0.2)
        loss, stats = algo.loss(Estimate(logp), batch, old, None, mask.sum())
        grads[level] = torch.autograd.grad(loss, logp)[0]
        if level == "sequence":
            s = torch.exp((shift * mask).sum(-1) / mask.sum(-1))
            ratio_sum, tokens = stats["ratio"]
            assert abs(float(ratio_sum) - float((s[:, None] * mask).sum())) < 1e-5 and tokens == 7
            expected = torch.where(mask.bool(), -s[1] / 7, 0.0)[1]  # row 1 unclipped: d(-A s) / d logp_t = -A s / N
            assert torch.allclose(grads[level][1], expected)
    assert (grads["sequence"][0] == 0).all(), "row 0's sequence ratio e^0.3 > 1.2: the whole row is clipped"
    assert grads["token"][0, 3] != 0, "per token, the token whose own ratio is e^-0.3 is not clipped"
