"""The rollout-record algorithms' own properties (algorithms.md §3.4 MDPO, §3.5 CJ-GRPO, §3.9 d-TreeRPO, §9 vectors;
models-and-sampling.md §4.8) and the sampler options they need (EOS early rejection, ascending step sizes, whole-
canvas predictions, resuming a partial decoding). Shared contract tests (ratio 1 on-policy, micro-batch
invariance, every family) are in test_algo_contract.py."""

from dataclasses import replace

import pytest
import torch

from dare.algos import get_algorithm
from dare.algos.dtreerpo import distillation_targets, sd_schedule, sibling_advantages
from dare.algos.mdpo import select_steps, step_advantages, step_scores
from dare.engines import HFEngine
from dare.likelihood import Estimate
from dare.models import Family, tiny
from dare.sampling import SamplingConfig, generate
from dare.sampling.primitives import decode_step, eos_factor

PROMPTS = ["hi", "what is two plus two?"]


def engine(name):
    model, tok = tiny(name, initializer_range=0.2)
    return HFEngine(model.double(), tok, Family.from_pretrained(model.config, tok))


def blank(x, fam):
    return torch.full_like(x, fam.mask_id)


def attention(rollout, fam):
    tail = (rollout.step_map >= 0).long() if fam.is_block_diffusion else torch.ones_like(rollout.completion_ids)
    return torch.cat([rollout.prompt_mask, tail], 1)


# ---------------------------------------------------------------------------------------------- cj-grpo

@pytest.mark.parametrize("name", ["llada", "dream", "sdar", "llada2"])
def test_cj_replay_reproduces_states_and_the_path_log_probability(name):
    """Replaying the recorded steps gives the sampler's state before every step, and the per-step log-probs sum
    to the path's log-probability computed independently from those states (single-stream forwards). Block
    families replay the whole last block (decoded whole, the output cut to gen_length)."""
    eng = engine(name)
    fam, model = eng.family, eng.model
    algo = get_algorithm("cj-grpo")().validate(fam)
    per_block = 2
    config = algo.rollout_sampling(fam, SamplingConfig(gen_length=8 if fam.block_size != 32 else 64, temperature=1.0,
                                                       steps=4 if not fam.is_block_diffusion else per_block,
                                                       block_length=None, record_states=True, stop_at_eos=False))
    rollout = eng.generate(PROMPTS, 2, config, seed=3)
    batch = algo.make_batch(fam, rollout, torch.tensor([1.0, 0, 0, 1]), 2, None, 0, config)
    steps, completion = batch["steps"], batch["completion_ids"]
    length = rollout.completion_ids.shape[1]
    assert (steps[:, :length] >= 0).all() and steps.max() < algo.streams(fam, config)
    if fam.is_block_diffusion:  # the global step of each replayed token: its block's slot + its local step
        p_len = rollout.prompt_mask.sum(-1, keepdim=True)
        k = torch.arange(completion.shape[1])
        ends = -(-(p_len + length) // fam.block_size) * fam.block_size - p_len
        assert torch.equal(steps >= 0, k[None] < ends)  # every token up to the end of the last block, none after
        glob = torch.where(steps >= 0, ((p_len + k) // fam.block_size - p_len // fam.block_size) * per_block + steps,
                           -1)
        attended = torch.cat([rollout.prompt_mask, (steps >= 0).long()], 1)
    else:
        glob, attended = steps, attention(rollout, fam)
    executed = glob[glob >= 0].unique().tolist()
    assert len(executed) == len(rollout.states)
    expected = torch.zeros(len(completion), dtype=torch.float64)
    for i, g in enumerate(executed):
        before = completion.masked_fill(glob >= g, fam.mask_id).masked_fill(glob < 0, fam.pad_id)
        recorded = blank(rollout.completion_ids, fam) if i == 0 else rollout.states[i - 1]
        assert torch.equal(before[:, :length], recorded), g
        logits = fam.logits(model, torch.cat([rollout.prompt_ids, before], 1), attended)
        logp = logits[:, rollout.prompt_ids.shape[1]:].double().log_softmax(-1)
        expected += (logp.gather(-1, completion[..., None])[..., 0] * (glob == g)).sum(-1)
    with torch.no_grad():
        replayed = algo.estimator(fam, config).score(model, fam, batch, {}).logp.sum(-1)
    torch.testing.assert_close(replayed, expected, atol=1e-9, rtol=1e-9)


def test_cj_masked_families_use_global_steps_block_families_local_ones():
    """Spec finding 1: an MDLM trajectory over several blocks carries global step ids (block b's steps follow
    block b-1's); each token is assigned exactly one step; block families replay block-local steps."""
    eng = engine("llada")
    algo = get_algorithm("cj-grpo")()
    config = algo.rollout_sampling(eng.family, SamplingConfig(gen_length=16, block_length=8, steps=8))
    rollout = eng.generate(PROMPTS, 1, config, seed=0)
    batch = algo.make_batch(eng.family, rollout, torch.zeros(2), 1, None, 0, config)
    assert algo.streams(eng.family, config) == 8 and torch.equal(batch["steps"], rollout.step_map)
    assert (batch["steps"][:, 8:].min(-1).values > batch["steps"][:, :8].max(-1).values).all()
    counts = torch.stack([(batch["steps"] == s).sum(-1) for s in range(8)], -1)
    assert (counts == 2).all()  # 16 tokens over 8 steps, each token once
    sdar = engine("sdar")
    config = algo.rollout_sampling(sdar.family, SamplingConfig(gen_length=8, steps=2, stop_at_eos=False))
    rollout = sdar.generate(PROMPTS, 1, config, seed=0)
    batch = algo.make_batch(sdar.family, rollout, torch.zeros(2), 1, None, 0, config)
    assert algo.streams(sdar.family, config) == 2 and torch.equal(batch["steps"][:, :8], rollout.block_step)
    assert batch["steps"].max() == 1


def test_cj_block_replay_keeps_the_stop_block():
    """After an early stop the visible completion ends at the stop token, but the replay keeps the stop token's
    whole block (tokens decoded after it in that block), identical to the decoding without stopping."""
    model, tok = tiny("sdar", initializer_range=0.2)
    fam = Family.from_pretrained(model.config, tok)
    add = torch.zeros(fam.vocab_size)
    add[fam.eos_id] = 4.0
    model.get_output_embeddings().register_forward_hook(lambda module, args, out: out + add)
    ids = torch.randint(20, 200, (3, 6), generator=torch.Generator().manual_seed(1))
    cfg = SamplingConfig(gen_length=24, steps=2)
    stop = generate(model, fam, ids, None, cfg)
    full = generate(model, fam, ids, None, SamplingConfig(gen_length=24, steps=2, stop_at_eos=False))
    b, checked = fam.block_size, 0
    for r in range(3):
        hits = torch.isin(stop.sequences[r], torch.tensor(fam.stop_ids)).nonzero()
        if not len(hits):
            continue
        end = ((6 + int(hits[0])) // b + 1) * b - 6  # first generated index after the stop's block
        checked += end > int(hits[0]) + 1
        assert torch.equal(stop.replay_ids[r, :end], full.sequences[r, :end])
        assert torch.equal(stop.replay_step[r, :end], full.block_step[r, :end])
        assert (stop.replay_step[r, end:] == -1).all() and (stop.sequences[r, int(hits[0]) + 1:] == fam.pad_id).all()
    assert checked, "no row stopped before the end of its block"


def test_cj_normalisers_step_mean_and_transition_weights():
    eng = engine("sdar")
    fam = eng.family
    for aggregation in ("step", "transition"):
        algo = get_algorithm("cj-grpo")(aggregation=aggregation).validate(fam)
        config = algo.rollout_sampling(fam, SamplingConfig(gen_length=8, steps=2, stop_at_eos=False))
        batch = algo.make_batch(fam, eng.generate(PROMPTS, 2, config, seed=0), torch.zeros(4), 2, None, 0, config)
        norm = algo.normaliser(fam, batch, config)
        if aggregation == "step":
            assert norm.tolist() == [int((batch["steps"] == s).sum()) for s in range(algo.streams(fam, config))]
        else:  # each sample's transition weights sum to one; every token of a transition weighs the same
            assert int(norm) == 4
            torch.testing.assert_close(batch["weights"].sum(-1), torch.ones(4))


def test_eos_early_rejection_and_ascending_steps():
    """EOSER scales EOS confidences by a factor rising from gamma_min to 1; ASS commits 1, 2, 4, ... tokens."""
    assert eos_factor(0.01, 0, 5) == 0.01 and eos_factor(0.01, 4, 5) == 1.0 and eos_factor(None, 0, 5) == 1.0
    logits = torch.full((1, 2, 5), -5.0)
    logits[0, 0, 1], logits[0, 1, 3] = 5.0, 0.5  # position 0 proposes EOS (id 1) confidently
    config = SamplingConfig(remasking="low_confidence", schedule="linear")
    masked, n = torch.ones(1, 2, dtype=torch.bool), torch.tensor([1])
    assert decode_step(logits, masked, n, config, eos_id=1)[1].tolist() == [[True, False]]
    assert decode_step(logits, masked, n, config, eos_id=1, eos_scale=0.01)[1].tolist() == [[False, True]]
    eng = engine("llada")
    out = eng.generate(PROMPTS, 1, SamplingConfig(gen_length=8, schedule="ascending"), seed=0)
    assert torch.bincount(out.step_map[0]).tolist() == [1, 2, 4, 1]  # 4 = ceil(log2(9)) steps for 8 tokens
    sdar = engine("sdar")
    out = sdar.generate(PROMPTS, 1, SamplingConfig(gen_length=8, schedule="ascending", stop_at_eos=False), seed=0)
    assert out.block_step.max() == 2 and (out.step_map >= 0).all()  # blocks of 4: 1 + 2 + 1
    with pytest.raises(ValueError, match="eos_early_rejection scales a probability"):
        eng.generate(PROMPTS, 1, SamplingConfig(gen_length=8, remasking="entropy", eos_early_rejection=0.1))


@pytest.mark.parametrize("name", ["llada", "dream", "sdar", "llada2"])
def test_resuming_a_partial_decoding_continues_it(name):
    """Greedy decoding stopped at step 3 and resumed from its canvas equals the uninterrupted decoding; the
    resumed run's step ids continue the schedule (block families: block k owns steps k*S..). Threshold decoding
    has no fixed schedule and refuses to resume."""
    eng = engine(name)
    block = eng.family.block_size
    config = (SamplingConfig(gen_length=8, block_length=4, steps=8) if block is None else
              SamplingConfig(gen_length=2 * block + 3, steps=2, stop_at_eos=False))
    whole = eng.generate(PROMPTS, 1, config)
    first = eng.generate(PROMPTS, 1, config, to_step=3)
    assert torch.equal(first.completion_ids != eng.family.mask_id, (whole.step_map >= 0) & (whole.step_map < 3))
    assert (first.completion_ids == eng.family.mask_id).any()
    rest = eng.generate(PROMPTS, 1, config, canvas=first.completion_ids, from_step=3)
    assert torch.equal(rest.completion_ids, whole.completion_ids)
    assert torch.equal(rest.step_map[first.step_map < 0], whole.step_map[first.step_map < 0])
    assert torch.equal(rest.completion_mask, whole.completion_mask) and rest.texts == whole.texts
    with pytest.raises(ValueError, match="from_step"):
        eng.generate(PROMPTS, 1, config, from_step=4, to_step=3)
    with pytest.raises(ValueError, match="fixed step schedule"):
        eng.generate(PROMPTS, 1, replace(config, threshold=0.9), from_step=1)


# ---------------------------------------------------------------------------------------------- mdpo

def test_mdpo_vectors_and_step_selection():
    q = step_scores(torch.tensor([[0.0, 0.0, 1.0, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(q, torch.tensor([[5 / 3, 2.0, 3.0, 2.0]], dtype=torch.float64))
    scores = torch.tensor([[1.0, 2.0, 3.0], [3.0, 2.0, 0.0], [0.0, 5.0, 1.0], [0.0, 5.0, 3.0]])
    adv = step_advantages(scores, 2)
    torch.testing.assert_close(adv.view(2, 2, 3).mean(1), torch.zeros(2, 3))
    torch.testing.assert_close(adv[:2, 0], torch.tensor([-1, 1]) / (2 ** 0.5 + 1e-4))  # unbiased std over the group
    assert (adv[2:, 1] == 0).all()  # equal scores at a step: no signal
    torch.testing.assert_close(step_advantages(scores, 1), scores)  # a group of one: mean 0, std 1
    total = torch.tensor([[0.1, 3.0, 0.2, 2.0, 5.0]])
    assert select_steps(total, 3).tolist() == [1, 3, 4] and select_steps(total, 9).tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("name", ["llada", "dream", "sdar", "llada2"])
def test_mdpo_step_rewards_from_recorded_predictions(name):
    """x̂0_s keeps the decoded tokens and fills the masks the step proposed for (masked families: every mask;
    block families: the current block's, later blocks stay masked); its confidence is the proposal's probability
    there and 0 elsewhere; the trained positions are the masked ones with a proposal."""
    eng = engine(name)
    fam = eng.family
    algo = get_algorithm("mdpo")(train_steps=3).validate(fam)
    length = 8 if fam.block_size != 32 else 40
    masked = fam.block_size is None
    config = algo.rollout_sampling(fam, SamplingConfig(gen_length=length, block_length=4 if masked else None,
                                                       steps=8 if masked else 2, temperature=1.0,
                                                       cache="prefix" if masked else None, stop_at_eos=False))
    assert config.record_states and algo.streams(fam, config) == 3
    assert config.cache == ("none" if fam.block_size is None else None)
    rollout = eng.generate(PROMPTS, 2, config, seed=1)
    seen = []

    def reward_of(ids, rows):  # a reward that varies: the fraction of even token ids
        seen.append((ids.clone(), list(rows)))
        return (ids % 2 == 0).double().mean(-1)

    batch = algo.make_batch(fam, rollout, torch.zeros(4), 2, reward_of, 0, config)
    predictions = torch.stack(rollout.predictions, 1)
    steps = predictions.shape[1]
    (ids, rows), = seen
    assert torch.equal(ids, predictions.reshape(-1, length)) and rows == [i for i in range(4) for _ in range(steps)]
    befores = [blank(rollout.completion_ids, fam)] + rollout.states[:-1]
    grid = (rollout.prompt_mask.sum(-1, keepdim=True) + torch.arange(length)) // (fam.block_size or 10 ** 9)
    for s, before in enumerate(befores):
        decoded = before != fam.mask_id
        proposed = predictions[:, s] != fam.mask_id
        assert torch.equal(predictions[:, s][decoded], before[decoded]) and (proposed | ~decoded).all()
        committed = (rollout.states[s] != fam.mask_id) & ~decoded
        assert torch.equal(predictions[:, s][committed], rollout.completion_ids[committed])
        if fam.block_size is None:
            assert proposed.all()
        else:  # exactly the masks of the block being decoded
            current = torch.stack([grid[r] == grid[r][committed[r]].min() if committed[r].any() else
                                   torch.zeros(length, dtype=torch.bool) for r in range(4)])
            assert torch.equal((proposed & ~decoded)[committed.any(-1)], (current & ~decoded)[committed.any(-1)])
        conf = rollout.confidences[s]
        new = proposed & ~decoded
        assert (conf[~new] == 0).all() and ((conf[new] > 0) & (conf[new] <= 1)).all()
    rho = ((predictions % 2 == 0).double().mean(-1))
    adv = step_advantages(step_scores(rho), 2, algo.adv_eps)
    keep = select_steps(adv, 3)
    torch.testing.assert_close(batch["step_advantages"], adv[:, keep])
    assert torch.equal(batch["states"], torch.stack(befores, 1)[:, keep])
    masked = (batch["states"] == fam.mask_id) & (batch["targets"] != fam.mask_id)
    assert torch.equal(batch["train_mask"], masked) and masked.any(-1).all()
    torch.testing.assert_close(batch["scale"], length / masked.sum(-1).float())


def test_mdpo_on_policy_loss_is_the_weighted_advantage_mean():
    """Sanity 4: with ratio 1 the loss is -sum m lambda c A / sum m (and its gradient the REINFORCE one)."""
    eng = engine("llada")
    fam = eng.family
    algo = get_algorithm("mdpo")(train_steps=2).validate(fam)
    config = algo.rollout_sampling(fam, SamplingConfig(gen_length=8, steps=8, temperature=1.0))
    rollout = eng.generate(PROMPTS, 2, config, seed=2)
    batch = algo.make_batch(fam, rollout, torch.zeros(4), 2, lambda ids, rows: (ids % 3 == 0).double().mean(-1), 0,
                            config)
    norm = algo.normaliser(fam, batch, config)
    total = 0.0
    for k in range(2):
        loss, _ = algo.step_loss(eng.model, fam, batch, 0, k, norm, config)
        total += float(loss.detach())
    m = batch["train_mask"].double()
    weight = batch["scale"][..., None] * batch["confidence"]
    expected = -(m * weight * batch["step_advantages"][..., None]).sum() / m.sum()
    assert total == pytest.approx(float(expected), rel=1e-6)  # lambda is float32


# ---------------------------------------------------------------------------------------------- d-treerpo

def test_dtreerpo_vectors():
    adv = sibling_advantages(torch.tensor([0.5, 0.25, 1.0, 0.0], dtype=torch.float64))
    torch.testing.assert_close(adv, torch.tensor([1 / 12, -0.25, 0.75, -7 / 12], dtype=torch.float64))
    assert float(adv.sum()) == pytest.approx(0.0, abs=1e-12)
    assert torch.equal(sibling_advantages(torch.tensor([0.7])), torch.tensor([0.7]))  # no siblings: baseline 0
    weight, tau = sd_schedule(0.5, 3e-3, 2.0, 2.0, 0.7)
    assert weight == pytest.approx(8.0682e-4, rel=1e-4) and tau == pytest.approx(1.231144, rel=1e-6)
    assert sd_schedule(0.0, 3e-3, 2, 2, 0.7) == (0.0, 2.0)
    assert sd_schedule(1.0, 3e-3, 2, 2, 0.7)[0] == pytest.approx(3e-3)


@pytest.mark.parametrize("name", ["llada", "sdar"])
def test_dtreerpo_tree_structure_values_and_edges(name):
    """Every leaf continues its first-level node; tree values and sibling advantages match a hand computation;
    along a root-to-leaf path the two edges' tokens are disjoint and cover the completion. Block families branch
    the block schedule: the first level decodes exactly the first half of the blocks."""
    eng = engine(name)
    fam = eng.family
    algo = get_algorithm("d-treerpo")(branch=3, loss_mask="all").validate(fam)
    config = SamplingConfig(gen_length=8, steps=8 if fam.block_size is None else 2, temperature=1.0,
                            stop_at_eos=False)
    rollout = algo.rollout(eng, PROMPTS, 6, config, seed=0)  # per prompt: 2 first-level nodes x 3 leaves
    first = rollout.records["first_level"]
    if fam.block_size is None:
        assert first.shape == (4, 8) and ((first != fam.mask_id).sum(-1) == 4).all()  # 4 of 8 one-token steps
    else:  # 2 of the 4 scheduled steps (2 blocks x 2): the first decoded block, which the prompt partly fills
        p_len = rollout.prompt_mask.sum(-1)[::3, None]  # a first-level node's leaves are consecutive rows
        assert torch.equal(first != fam.mask_id, (p_len + torch.arange(8)) // 4 == p_len // 4)
    leaves = rollout.completion_ids
    assert not (leaves == fam.mask_id).any()
    parent = first.repeat_interleave(3, 0)
    assert torch.equal(leaves[parent != fam.mask_id], parent[parent != fam.mask_id])
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5])
    batch = algo.make_batch(fam, rollout, rewards, 6, None, 0, config)
    # prompt 0: first-level values .5 and 0 -> root edges +.5 / -.5; leaves 1 - .25, 0 - .75, .5 - .5 and 0, 0, 0
    # prompt 1: first-level values 1 and .5 -> +.5 / -.5; leaves 0, 0, 0 and 0 - .75, 1 - .25, .5 - .5
    expected = torch.tensor([[0.5, -0.5, 0.0], [0.75, -0.75, 0.0], [0.0, 0.0, 0.0],
                             [0.5, -0.5, 0.0], [0.0, 0.0, 0.0], [-0.75, 0.75, 0.0]])
    torch.testing.assert_close(batch["advantages"], expected)
    assert torch.equal(batch["completion_ids"][[0, 3]], blank(leaves[:2], fam))  # root parents: all masks
    active = batch["active"]
    for p in range(2):
        root = 3 * p
        for a in range(2):
            for k in range(3):
                edge1, edge2 = active[root, a], active[root + 1 + a, k]
                assert not (edge1 & edge2).any() and (edge1 | edge2).all()
    assert not active[0, 2].any()  # the root has 2 children: its third slot is padding


@pytest.mark.parametrize("name", ["llada", "sdar"])
def test_dtreerpo_prompt_padding_is_invisible(name):
    """Finding 10: a tree row of the shorter (left-padded) prompt scores exactly as without any padding."""
    eng = engine(name)
    fam = eng.family
    algo = get_algorithm("d-treerpo")(branch=2).validate(fam)
    steps = 8 if fam.block_size is None else 2
    config = SamplingConfig(gen_length=8, steps=steps, temperature=1.0)
    rollout = algo.rollout(eng, PROMPTS, 2, config, seed=0)
    batch = algo.make_batch(fam, rollout, torch.tensor([1.0, 0.0, 0.0, 1.0]), 2, None, 0, config)
    assert (batch["prompt_mask"][:2] == 0).any()  # "hi" is the shorter prompt: left-padded
    alone = {k: v[:2] for k, v in batch.items()}
    width = int(alone["prompt_mask"][0].sum())
    alone["prompt_ids"], alone["prompt_mask"] = alone["prompt_ids"][:, -width:], alone["prompt_mask"][:, -width:]
    with torch.no_grad():
        padded = algo.score(eng.model, fam, batch, {}, config).logp[:2]
        unpadded = algo.score(eng.model, fam, alone, {}, config).logp
    torch.testing.assert_close(padded, unpadded, atol=1e-10, rtol=1e-10)


def test_dtreerpo_self_distillation_targets():
    """Positive siblings (A > 0) weighted by softmax(A / tau) form q at each position; agreeing siblings merge."""
    children = torch.tensor([[[5, 6], [5, 7], [9, 9]]])  # 3 siblings, 2 positions
    active = torch.ones(1, 3, 2, dtype=torch.bool)
    adv = torch.tensor([[1.0, 0.5, -1.5]])
    omega, logq = distillation_targets(children, active, adv, torch.ones(1, 3, dtype=torch.bool), tau=1.0)
    w = torch.softmax(torch.tensor([1.0, 0.5]), 0)
    torch.testing.assert_close(omega[0, :, 0], torch.tensor([w[0], w[1], 0.0]))
    torch.testing.assert_close(logq[0, :2, 0], torch.zeros(2))  # both chose 5: q = 1
    torch.testing.assert_close(logq[0, :2, 1], torch.log(w))
    assert (omega[0, 2] == 0).all()  # the negative child is not a target
    lone = distillation_targets(children[:, :1], active[:, :1], adv[:, :1], torch.ones(1, 1, dtype=torch.bool), 1.0)
    assert (lone[0] == 0).all()  # a group needs two members


def test_cj_transition_weights_do_not_depend_on_micro_batches(tmp_path):
    """Sanity 3 of §3.5: with DARE's block-diffusion transition weights (each sample's transitions weigh 1 in all,
    averaged over samples) one SGD step is the same for micro-batches of 8 and 2."""
    from test_train_rl import rl_args, weights

    import train_rl
    from dare.data.tasks import write_task
    data = (write_task("addition", str(tmp_path / "train.jsonl"), 16, 0, "train"), None)
    for micro in (8, 2):
        train_rl.main(rl_args(data, tmp_path / str(micro), algo="cj-grpo", model="tiny:sdar", micro_batch_size=micro,
                              max_steps=1, save_steps=1, optim="sgd", learning_rate=1.0,
                              algo_config__aggregation="transition"))
    one, four = weights(tmp_path / "8"), weights(tmp_path / "2")
    assert max((one[k] - four[k]).abs().max().item() for k in one) < 1e-6
    start = weights("tiny:sdar")
    assert any((one[k] - start[k]).abs().max() > 1e-5 for k in one)


def test_clear_errors_for_rollouts_these_algorithms_cannot_use():
    eng = engine("llada")
    fam = eng.family
    with pytest.raises(ValueError, match=r"num_generations \(3\) must be a multiple of branch \(2\)"):
        get_algorithm("d-treerpo")(branch=2).rollout(eng, PROMPTS, 3, SamplingConfig(gen_length=8), 0)
    with pytest.raises(ValueError, match="mdpo trains a fixed number of steps"):
        get_algorithm("mdpo")().rollout_sampling(fam, SamplingConfig(gen_length=8, threshold=0.9))
    with pytest.raises(ValueError, match="cj-grpo replays first-unmask steps"):
        get_algorithm("cj-grpo")().rollout_sampling(fam, SamplingConfig(gen_length=8, editing_threshold=0.9))
    with pytest.raises(ValueError, match="Unknown aggregation 'mean'"):
        get_algorithm("cj-grpo")(aggregation="mean").validate(fam)


# ------------------------------------------------------------------------------------------------- d2 StepMerge

def test_d2_groups_are_the_authors_contiguous_step_ranges():
    from dare.algos.d2 import merged_steps
    steps = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, -1]])
    assert merged_steps(steps, 10, 3).tolist() == [[0, 0, 0, 1, 1, 1, 2, 2, 2, 2, -1]]
    assert [int(n * 10 / 3) for n in range(4)] == [0, 3, 6, 10]  # the authors' boundaries
    assert torch.equal(merged_steps(steps, 10, 10), steps)
    assert merged_steps(steps, 10, 1).tolist() == [[0] * 10 + [-1]]


@pytest.mark.parametrize("name", ["llada", "sdar"])
def test_d2_with_every_step_its_own_group_is_cj_grpo_and_with_one_group_is_the_mean_field(name):
    """N = S scores each token exactly as CJ-GRPO's replay does; N = 1 scores every token from the fully masked
    canvas (masked families: d1's estimate with the prompt unmasked); N in between lies on neither."""
    from dare.likelihood import MeanField
    eng = engine(name)
    fam, model = eng.family, eng.model
    config = SamplingConfig(gen_length=8, temperature=1.0, steps=4, block_length=None, stop_at_eos=False)
    steps = 4 if not fam.is_block_diffusion else fam.block_size
    config = replace(config, steps=steps)
    cj = get_algorithm("cj-grpo")().validate(fam)
    rollout = eng.generate(PROMPTS, 2, cj.rollout_sampling(fam, config), seed=3)
    rewards = torch.tensor([1.0, 0, 0, 1])
    reference = cj.make_batch(fam, rollout, rewards, 2, None, 0, config)
    exact = cj.score(model, fam, reference, {}, config).logp

    def d2(groups):
        algo = get_algorithm("d2")(merge_groups=groups, loss_mask="all").validate(fam)
        batch = algo.make_batch(fam, rollout, rewards, 2, None, 0, config)
        assert algo.streams(fam, config) == min(groups, steps)
        return batch, algo.score(model, fam, batch, {}, config).logp
    batch, every = d2(steps)
    assert torch.equal(batch["steps"], reference["steps"]) and torch.equal(every, exact)
    batch, one = d2(1)
    decoded = batch["loss_mask"].bool()
    if not fam.is_block_diffusion:
        mean_field = MeanField(p_prompt=0.0)
        expected = mean_field.score(model, fam, batch, mean_field.corrupt(fam, batch)).logp
        assert torch.allclose(one[decoded], expected[decoded], atol=1e-12)
    _, two = d2(2)
    assert not torch.allclose(two[decoded], exact[decoded]) and not torch.allclose(two[decoded], one[decoded])


def test_d2_streams_add_up_to_the_token_mean_surrogate():
    eng = engine("llada")
    fam, model = eng.family, eng.model
    algo = get_algorithm("d2")(merge_groups=2).validate(fam)
    config = algo.rollout_sampling(fam, SamplingConfig(gen_length=8, temperature=1.0, steps=4, block_length=None))
    rollout = eng.generate(PROMPTS, 2, config, seed=1)
    batch = algo.make_batch(fam, rollout, torch.tensor([1.0, 0, 0, 1]), 2, None, 0, config)
    normaliser = algo.normaliser(fam, batch, config)
    params = list(model.parameters())
    streamed = [torch.autograd.grad(algo.step_loss(model, fam, batch, 0, s, normaliser, config)[0], params,
                                    allow_unused=True) for s in range(2)]
    logp = algo.score(model, fam, batch, {}, config).logp
    whole, _ = algo.loss(Estimate(logp), batch, logp.detach(), None, normaliser)
    expected = torch.autograd.grad(whole, params, allow_unused=True)
    for a, b, c in zip(*streamed, expected, strict=True):
        if c is not None:
            assert torch.allclose((0 if a is None else a) + (0 if b is None else b), c, atol=1e-10)
    with pytest.raises(ValueError, match="d2 merges a fixed schedule"):
        algo.rollout_sampling(fam, SamplingConfig(gen_length=8, threshold=0.9))


# ------------------------------------------------------------------------------------------------------- agrpo

@pytest.mark.parametrize("name", ["llada", "sdar"])
@pytest.mark.parametrize("step_weight,step_set", [("mean", "content"), ("sum", "content"), ("mean", "all")])
def test_agrpo_sampled_steps_average_to_the_full_trajectory_gradient(name, step_weight, step_set):
    """The estimator's expectation, enumerated: draw j = step j in every row and block (j < S), each weighted by
    S / S_b (the uniform draw of a block of S_b steps picks j with probability 1 / S_b), must have the gradient of the
    whole-trajectory objective computed from an independent replay of every step:
    -(1/rows) sum_i A_i c_i sum_t sum_{k in U_t} log pi(y_k | z_t), c_i = 1/T_i (mean) or 1 (sum), with the
    sampler's temperature and banned mask token (the entropy proposal's weights: the test below)."""
    from dare.likelihood import score_tokens, trajectory_blocks
    eng = engine(name)
    fam, model = eng.family, eng.model
    steps = 4 if not fam.is_block_diffusion else fam.block_size
    algo = get_algorithm("agrpo")(samples=steps, step_weight=step_weight, steps=step_set,
                                  proposal="uniform").validate(fam)
    config = algo.rollout_sampling(fam, SamplingConfig(gen_length=8, temperature=0.7, steps=steps, block_length=None,
                                                       stop_at_eos=False))
    rollout = eng.generate(PROMPTS, 2, config, seed=3)
    batch = algo.make_batch(fam, rollout, torch.tensor([1.0, 0, 0, 1]), 2, None, 0, config)
    noise = algo.corrupt(fam, batch, torch.Generator().manual_seed(0), config)
    decoded, blocks = batch["loss_mask"].bool(), trajectory_blocks(fam, batch)
    span = torch.zeros(batch["steps"].shape, dtype=torch.float64)  # steps of each position's block, by hand
    for i in range(4):
        for b in blocks[i][decoded[i]].unique():
            here = decoded[i] & (blocks[i] == b)
            span[i, here] = float(batch["steps"][i][here].max() + 1)
    assert ((noise["at"] >= 0) & (noise["at"] < span[:, None].clamp(min=1))).all(), "a draw past its block's steps"
    noise["at"] = torch.arange(steps)[None, :, None].expand_as(noise["at"]).contiguous()
    noise["weight"] = noise["weight"] * torch.where(decoded, steps / span.clamp(min=1), 0.0)[:, None]
    batch["noise"] = [noise]
    params = list(model.parameters())
    normaliser = algo.normaliser(fam, batch, config)
    grads = [torch.autograd.grad(algo.step_loss(model, fam, batch, 0, j, normaliser, config)[0], params,
                                 allow_unused=True) for j in range(steps)]
    logp = torch.zeros(batch["steps"].shape, dtype=torch.float64)
    for s in range(steps):  # every step from its own canvas
        hidden = (batch["steps"] >= s) | (batch["steps"] < 0)
        noisy = torch.cat([batch["prompt_ids"], batch["completion_ids"].masked_fill(hidden, fam.mask_id)], 1)
        logp = torch.where(batch["steps"] == s, score_tokens(model, fam, batch, noisy, 0.7, (fam.mask_id,)).logp, logp)
    total = torch.stack([torch.tensor(sum(float(span[i][decoded[i] & (blocks[i] == b)][0])
                                          for b in blocks[i][decoded[i]].unique())) for i in range(4)])
    scale = 1 / total.double() if step_weight == "mean" else torch.ones(4, dtype=torch.float64)
    objective = -(batch["advantages"] * scale * (logp * decoded).sum(-1)).sum() / 4
    expected = torch.autograd.grad(objective, params, allow_unused=True)
    for parts, e in zip(zip(*grads, strict=True), expected, strict=True):
        if e is not None:
            assert torch.allclose(sum(p for p in parts if p is not None), e, atol=1e-10)


def test_agrpo_draws_only_the_steps_up_to_the_last_content_step():
    """The authors' stop rule: steps after the last one that committed a non-stop token are never drawn (per block for
    block families), so T counts the content steps only."""
    from dare.algos.agrpo import content_steps
    eos = 9
    steps = torch.tensor([[0, 1, 2, 3, 4, -1], [2, 0, 1, 3, 0, 1]])
    ids = torch.tensor([[5, eos, 6, eos, eos, eos], [eos, 7, eos, 8, eos, eos]])
    masked = content_steps(steps, ids, torch.zeros_like(steps), (eos,))
    assert masked.tolist() == [[0, 1, 2, -1, -1, -1], [2, 0, 1, 3, 0, 1]]
    blocks = torch.tensor([[0, 0, 0, 1, 1, 1]] * 2)  # block-local steps: each block trimmed on its own
    assert content_steps(steps, ids, blocks, (eos,)).tolist() == [[0, 1, 2, -1, -1, -1], [-1, 0, -1, 3, 0, 1]]


def agrpo_noise(samples, proposal, low_discrepancy, seed=0):
    from dare.models.loading import load_config
    fam = load_config("tiny:llada")[2]
    algo = get_algorithm("agrpo")(samples=samples, proposal=proposal, low_discrepancy=low_discrepancy).validate(fam)
    batch = {"steps": torch.tensor([[0, 0, 1, 2, 3, -1], [1, 0, 2, 2, 4, 3]]), "prompt_mask": torch.ones(2, 3).long(),
             "entropy": torch.tensor([[0.5, 0.3, 0.0, 2.0, 1.0, 0.0], [1.5, 0.2, 0.1, 0.4, 3.0, 0.0]])}
    est = algo.estimator(fam, SamplingConfig(gen_length=6, temperature=1.0))
    return batch, est.corrupt(fam, batch, torch.Generator().manual_seed(seed))


def test_agrpo_entropy_proposal_draws_steps_by_their_entropy_and_weights_them_unbiasedly():
    """q_t = (1e-8 + the entropy step t committed) / sum, the weight 1 / (T q_t): every step's expected weight is 1/T
    (the (1/T) sum_t objective), and the draws follow q (row 0's step 1 committed a zero-entropy token)."""
    batch, noise = agrpo_noise(20000, "entropy", False)
    for i in range(2):
        T = int(batch["steps"][i].max()) + 1
        mass = torch.zeros(T, dtype=torch.float64).index_add_(0, batch["steps"][i].clamp(min=0), batch["entropy"][
            i].double() * (batch["steps"][i] >= 0)) + 1e-8
        q = mass / mass.sum()
        at, weight = noise["at"][i, :, 0], noise["weight"][i, :, 0]
        assert torch.allclose(weight, 1 / (T * q[at]), rtol=1e-9)
        for t in range(T):
            hit = (at == t).double()
            se = (hit.std() / len(hit) ** 0.5).item()
            assert abs(hit.mean().item() - q[t].item()) < 5 * se + 1e-3, (i, t, hit.mean(), q[t])
            if q[t] > 1e-3:  # a step that committed no entropy is (almost) never drawn: its tokens had no gradient
                assert abs((hit * weight).mean().item() - 1 / T) < 5 * (hit * weight).std().item() / len(hit) ** 0.5
    _, uniform = agrpo_noise(20000, "uniform", False)
    assert not torch.allclose(uniform["weight"], noise["weight"])  # the proposals differ


def test_agrpo_low_discrepancy_draws_fill_every_stratum_once():
    """The batch's rows x draws uniforms of a block are one per stratum of [0, 1) (the authors' draws): with every
    row of S steps and rows x draws a multiple of S, the uniform proposal draws each step equally often in the batch."""
    from dare.models.loading import load_config
    fam = load_config("tiny:llada")[2]
    batch = {"steps": torch.tensor([[0, 1, 2, 3, 3, -1], [3, 2, 1, 0, 0, 1]]), "prompt_mask": torch.ones(2, 3).long()}
    for low_discrepancy, seed in ((True, 0), (True, 1), (False, 0)):
        algo = get_algorithm("agrpo")(samples=8, proposal="uniform", low_discrepancy=low_discrepancy).validate(fam)
        noise = algo.estimator(fam, SamplingConfig(gen_length=6)).corrupt(fam, batch, torch.Generator().manual_seed(
            seed))
        counts = torch.bincount(noise["at"][:, :, 0].flatten(), minlength=4).tolist()
        assert (counts == [4, 4, 4, 4]) == low_discrepancy, (low_discrepancy, counts)


def test_agrpo_scores_with_the_samplers_top_k_filter_and_the_sampler_records_entropies():
    """With top-k, a drawn step's tokens are scored on the sampler's renormalised filtered distribution (the token
    always kept); the masked sampler records each committed token's entropy of that distribution (tempered)."""
    from dare.likelihood import canvas_before, completion_logits, score_tokens
    from dare.sampling.primitives import filter_logits, proposal_entropy
    eng = engine("llada")
    fam, model = eng.family, eng.model
    algo = get_algorithm("agrpo")(samples=2).validate(fam)
    config = algo.rollout_sampling(fam, SamplingConfig(gen_length=8, temperature=0.7, steps=4, block_length=None,
                                                       top_k=3, stop_at_eos=False, cache="none"))
    assert config.record_entropy
    rollout = eng.generate(PROMPTS, 2, config, seed=3)
    batch = algo.make_batch(fam, rollout, torch.tensor([1.0, 0, 0, 1]), 2, None, 0, config)
    for s in range(4):
        at = batch["steps"] == s
        full = score_tokens(model, fam, batch, canvas_before(fam, batch, s), 0.7, (fam.mask_id,))
        kept = score_tokens(model, fam, batch, canvas_before(fam, batch, s), 0.7, (fam.mask_id,),
                            keep=lambda x: filter_logits(x, top_k=3))
        est = algo.estimator(fam, config).score(model, fam, batch, {"at": torch.full((4, 2, 8), s)}, draw=0)
        assert torch.equal(est.logp, kept.logp)
        assert (kept.logp[at] > full.logp[at]).all()  # renormalised over 3 tokens
        lg = completion_logits(model, fam, batch, canvas_before(fam, batch, s)).double()
        lg[..., fam.mask_id] = float("-inf")
        recorded = rollout.entropy.double()
        assert torch.allclose(recorded[at], proposal_entropy(lg, 0.7, 3).double()[at], atol=1e-5)
    assert (rollout.entropy[rollout.step_map < 0] == 0).all() and (rollout.entropy[rollout.step_map >= 0] > 0).all()


# ----------------------------------------------------------------------------------------------------- tracerl

@pytest.mark.parametrize("name", ["llada", "sdar"])
def test_tracerl_with_shrinkage_one_is_the_per_step_replay_and_merges_runs_of_s(name):
    eng = engine(name)
    fam, model = eng.family, eng.model
    steps = 4 if not fam.is_block_diffusion else fam.block_size
    config = SamplingConfig(gen_length=8, temperature=1.0, steps=steps, block_length=None, stop_at_eos=False)
    cj = get_algorithm("cj-grpo")().validate(fam)
    rollout = eng.generate(PROMPTS, 2, cj.rollout_sampling(fam, config), seed=3)
    rewards = torch.tensor([1.0, 0, 0, 1])
    reference = cj.make_batch(fam, rollout, rewards, 2, None, 0, config)
    trace = get_algorithm("tracerl")(shrink=1, loss_mask="all").validate(fam)
    batch = trace.make_batch(fam, rollout, rewards, 2, None, 0, config)
    assert torch.equal(batch["steps"], reference["steps"])
    exact = cj.score(model, fam, reference, {}, config).logp
    assert torch.equal(trace.score(model, fam, batch, {}, config).logp, exact)
    runs = get_algorithm("tracerl")(shrink=3).validate(fam)
    assert runs.streams(fam, config) == -(-steps // 3)
    assert torch.equal(runs.groups(torch.arange(-1, 10), fam, config),
                       torch.tensor([-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3]))  # runs of 3, the last one shorter
    threshold = runs.rollout_sampling(fam, replace(config, steps=None, threshold=0.9))  # the runs follow the trace
    assert threshold.threshold == 0.9


@pytest.mark.parametrize("name", ["llada", "sdar"])
def test_dipo_scores_every_step_exactly_as_the_exhaustive_replay(name):
    """DiPO's likelihood is the exhaustive per-step sum (no sampled masks): each token from the canvas before its
    step, equal to CJ-GRPO's replay; its clip is the code's clip-higher."""
    eng = engine(name)
    fam, model = eng.family, eng.model
    config = SamplingConfig(gen_length=8, temperature=1.0, threshold=0.5, stop_at_eos=False)
    dipo = get_algorithm("dipo")(loss_mask="all").validate(fam)
    rollout = eng.generate(PROMPTS, 2, dipo.rollout_sampling(fam, config), seed=3)
    rewards = torch.tensor([1.0, 0, 0, 1])
    cj = get_algorithm("cj-grpo")().validate(fam)
    reference = cj.make_batch(fam, rollout, rewards, 2, None, 0, config)
    batch = dipo.make_batch(fam, rollout, rewards, 2, None, 0, config)
    assert torch.equal(dipo.score(model, fam, batch, {}, config).logp, cj.score(model, fam, reference, {}, config).logp)
    assert (dipo.eps_low, dipo.eps_high, dipo.dual_clip) == (0.2, 0.28, None)


def test_the_newer_algorithms_default_to_their_authors_rules():
    """Each default that the docstrings give as the authors' (DiRL's resampling and clip-higher, TraceRL's KL to the
    rollout policy and accuracy band, AGRPO's steps): a recipe that sets nothing gets them."""
    from dare.algos.base import DynamicSampling
    dipo, tracerl, agrpo = (get_algorithm(n)() for n in ("dipo", "tracerl", "agrpo"))
    assert dipo.dynamic_sampling == DynamicSampling(mode="resample", keep="mixed", extra=2.0, rounds=10)
    assert (dipo.eps_high, dipo.dual_clip) == (0.28, None)
    assert tracerl.dynamic_sampling == DynamicSampling(mode="drop", keep="accuracy", low=0.2, high=0.8)
    assert (tracerl.beta, tracerl.kl, tracerl.kl_to, tracerl.dual_clip) == (0.01, "k3", "rollout", None)
    assert (agrpo.steps, agrpo.proposal, agrpo.low_discrepancy, agrpo.truncate, agrpo.step_weight) == \
           ("content", "entropy", True, True, "mean")
