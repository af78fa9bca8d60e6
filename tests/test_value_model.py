"""The value model beside the policy (dare/trainers/value.py) and TraceRL's step-level GAE (dare/algos/tracerl.py):
the GAE against a step-by-step reference, its reductions (constant value: GRPO's advantage), the value loss falling
on a fixed batch, the zero-initialised value model changing nothing at the first step, exact resume and export."""

import shutil

import pytest
import torch
from safetensors.torch import load_file
from test_train_rl import data, history, rl_args, weights  # noqa: F401  (fixture + helpers)

import train_rl
from dare.algos import get_algorithm
from dare.algos.tracerl import step_gae
from dare.engines import HFEngine
from dare.models import Family, tiny
from dare.sampling import SamplingConfig
from dare.trainers.value import ValueModel, value_network


def reference_gae(order, live, values, reward, gamma, lam):
    """TraceRL's recursion row by row over the sorted distinct steps (the code's loop, written plainly)."""
    advantages, returns = torch.zeros_like(values), torch.zeros_like(values)
    for n in range(len(order)):
        steps = sorted({int(k) for k, on in zip(order[n], live[n], strict=True) if on})
        v_next = a_next = r_next = 0.0
        for position, t in enumerate(reversed(steps)):
            tokens = [j for j in range(order.shape[1]) if live[n, j] and order[n, j] == t]
            r = float(reward[n]) if position == 0 else 0.0
            v_step = sum(float(values[n, j]) for j in tokens) / len(tokens)
            for j in tokens:
                advantages[n, j] = r - values[n, j] + gamma * v_next + gamma * lam * a_next
                returns[n, j] = r + gamma * r_next
            a_next = r - v_step + gamma * v_next + gamma * lam * a_next
            r_next = r + gamma * r_next
            v_next = v_step
    return advantages, returns


def random_trace(seed, rows=5, width=12):
    g = torch.Generator().manual_seed(seed)
    order = torch.randint(0, 9, (rows, width), generator=g) * 3  # gaps between step numbers, ties within a step
    live = torch.rand(rows, width, generator=g) < 0.8
    live[-1] = False  # a row with nothing on its trace
    values = torch.randn(rows, width, generator=g, dtype=torch.float64)
    reward = torch.randn(rows, generator=g, dtype=torch.float64)
    return order, live, values, reward


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.7), (1.0, 0.0), (0.5, 1.0)])
def test_step_gae_equals_the_step_by_step_recursion(gamma, lam):
    for seed in range(4):
        order, live, values, reward = random_trace(seed)
        got = step_gae(order, live, values, reward, gamma, lam)
        expected = reference_gae(order, live, values, reward, gamma, lam)
        for a, b in zip(got, expected, strict=True):
            assert torch.allclose(a, b, atol=1e-12), (seed, (a - b).abs().max())
        assert (got[0][~live] == 0).all() and (got[1][~live] == 0).all()


def test_step_gae_with_a_constant_value_is_grpos_advantage():
    """gamma = lam = 1: A_j = r̂ - c on every token of the trace (c = 0, the zeroed head's start: exactly GRPO's)."""
    order, live, _, reward = random_trace(7)
    for c in (0.0, 0.37):
        values = torch.full(order.shape, c, dtype=torch.float64)
        advantages, returns = step_gae(order, live, values, reward, 1.0, 1.0)
        expected = (reward[:, None] - c).expand_as(values)
        assert torch.allclose(advantages[live], expected[live], atol=1e-12)
        assert torch.allclose(returns[live], reward[:, None].expand_as(values)[live], atol=1e-12)


def sdar_batch(algo, seed=0):
    model, tok = tiny("sdar")
    fam = Family.from_pretrained(model.config, tok)
    algo.validate(fam)
    sampling = algo.rollout_sampling(fam, SamplingConfig(gen_length=16, temperature=1.0))
    rollout = algo.rollout(HFEngine(model, tok, fam), ["a b", "c d e"], 4, sampling, seed)
    rewards = torch.tensor([float(i % 3 == 0) for i in range(8)])
    batch = algo.make_batch(fam, rollout, rewards, 4, lambda ids, rows: torch.zeros(len(ids)), 0, sampling)
    return model, fam, sampling, batch


def test_the_value_loss_falls_on_a_fixed_batch():
    algo = get_algorithm("tracerl")()
    algo.value.model, algo.value.learning_rate, algo.value.clip = "policy", 3e-3, 0.0
    model, fam, sampling, batch = sdar_batch(algo)
    value = ValueModel(value_network(model, "policy", fam.name), algo.value)
    assert value.network.get_output_embeddings().weight.abs().max() == 0  # the zeroed head
    assert value.network.get_output_embeddings() is not model.get_output_embeddings()
    with torch.no_grad():
        algo.value_targets(value.network, fam, [batch], 4, sampling)
    assert batch["old_values"].abs().max() == 0 and batch["returns"].abs().max() > 0
    tokens = batch["loss_mask"].sum().float()
    streams = algo.streams(fam, sampling)

    def loss_of(stream, normaliser):
        return algo.value_loss(value.network, fam, batch, stream, normaliser, sampling)
    losses = [value.step(loss_of, range(streams), tokens)["value/loss"] for _ in range(25)]
    first, last = (total / count for total, count in (losses[0], losses[-1]))
    assert last < 0.2 * first, (first, last)


def random_value_model(model, fam):
    network = value_network(model, "policy", fam.name)
    torch.nn.init.normal_(network.get_output_embeddings().weight, std=1.0)  # values that vary with the input
    return network


def batch_of(name, seed=0):
    if name == "sdar":
        return sdar_batch(get_algorithm("tracerl")(), seed)
    algo = get_algorithm("tracerl")()
    model, tok = tiny(name)
    fam = Family.from_pretrained(model.config, tok)
    algo.validate(fam)
    sampling = algo.rollout_sampling(fam, SamplingConfig(gen_length=8, steps=4, block_length=None, temperature=1.0,
                                                         stop_at_eos=False))
    rollout = algo.rollout(HFEngine(model, tok, fam), ["a b", "c d e"], 4, sampling, seed)
    batch = algo.make_batch(fam, rollout, torch.tensor([float(i % 3 == 0) for i in range(8)]), 4,
                            lambda ids, rows: torch.zeros(len(ids)), 0, sampling)
    return model, fam, sampling, batch


@pytest.mark.parametrize("name", ["llada", "sdar"])
def test_the_value_of_a_token_is_read_from_the_canvas_before_its_step(name):
    """V_j sees what the policy saw before j's step (the code's masked copy): changing a token changes no value of
    its own step or an earlier one (of its block, block families: later blocks see it clean), and changes later
    ones. A value read from the clean sequence would change the token's own value."""
    from dare.likelihood import trajectory_blocks
    algo = get_algorithm("tracerl")()
    model, fam, sampling, batch = batch_of(name)
    network = random_value_model(model, fam)
    rewards = batch["advantages"]
    with torch.no_grad():
        algo.value_targets(network, fam, [batch], 4, sampling)
        before = batch["old_values"].clone()
        batch["advantages"] = rewards
        steps, blocks, live = batch["steps"], trajectory_blocks(fam, batch), batch["loss_mask"].bool()
        p = int(torch.where(live[0] & (steps[0] == 0))[0][0])  # a first-step token of row 0: later steps see it
        batch["completion_ids"] = batch["completion_ids"].clone()
        batch["completion_ids"][0, p] = (batch["completion_ids"][0, p] + 1) % fam.mask_id
        algo.value_targets(network, fam, [batch], 4, sampling)
    after = batch["old_values"]
    seen = (blocks[0] > blocks[0, p]) | ((blocks[0] == blocks[0, p]) & (steps[0] > steps[0, p]))
    assert torch.equal(after[1:], before[1:]) and torch.equal(after[0][live[0] & ~seen], before[0][live[0] & ~seen])
    assert (after[0][live[0] & seen] != before[0][live[0] & seen]).any()


def test_the_value_loss_clips_pessimistically_around_the_rollout_prediction():
    """PPO's value clip: 0.5 max((V - R)^2, (V_old + clip(V - V_old, +-eps) - R)^2), the larger error (the code's
    torch.maximum): a prediction that moved past the clip toward its return gains nothing from the move."""
    algo = get_algorithm("tracerl")()
    algo.value.clip = 0.2
    model, fam, sampling, batch = batch_of("sdar")
    network = random_value_model(model, fam)
    from dare.likelihood import canvas_before, token_values
    stream = 0
    target = ((batch["steps"] == stream) & batch["loss_mask"].bool()).double()
    values = token_values(network, fam, batch, canvas_before(fam, batch, stream)).detach().double()
    for offset, expected_clipped in ((1.0, True), (-1.0, False)):
        batch["old_values"], batch["returns"] = values - 0.5, values + offset  # V moved +0.5 since the rollout
        loss, _ = algo.value_loss(network, fam, batch, stream, target.sum(), sampling)
        clipped = (values - 0.5 + 0.2 - batch["returns"]) ** 2
        worst = torch.maximum((values - batch["returns"]) ** 2, clipped)
        assert torch.allclose(loss.double(), 0.5 * (worst * target).sum() / target.sum(), atol=1e-6)
        assert torch.allclose(worst[target.bool()], clipped[target.bool()] if expected_clipped
                              else (values - batch["returns"])[target.bool()] ** 2)
        grads = torch.autograd.grad(loss, network.get_output_embeddings().weight)[0]
        assert (grads.abs().max() == 0) == expected_clipped  # the clipped error does not move V


def test_a_zero_initialised_value_model_leaves_the_first_step_as_tracerl_without_one(data, tmp_path):  # noqa: F811
    """At the start the head is zero, so V = 0 and (gamma = lam = 1) the advantages are GRPO's: the same update."""
    for name, source in (("plain", ""), ("valued", "policy")):
        train_rl.main(rl_args(data, tmp_path / name, algo="tracerl", model="tiny:sdar", max_steps=1, save_steps=1,
                              optim="sgd", learning_rate=1.0, algo_config__value__model=source))
    a, b = weights(tmp_path / "plain"), weights(tmp_path / "valued")
    assert all(torch.equal(a[k], b[k]) for k in a)
    logged = [h for h in history(tmp_path / "valued", 1) if "loss" in h][0]
    assert logged["value/prediction"] == 0.0 and logged["value/loss"] > 0 and "time/value" in logged
    moved = load_file(str(tmp_path / "valued" / "value" / "model.safetensors"))
    assert any(v.abs().max() > 0 for k, v in moved.items() if "lm_head" in k), "one value step moved its head"
    assert not (tmp_path / "plain" / "value").exists()
    # the exported value model starts another run as it is (a policy of another size is refused)
    policy = tiny("sdar")[0]
    again = value_network(policy, str(tmp_path / "valued" / "value"), "sdar").state_dict()
    assert all(torch.equal(again[k], moved[k]) for k in moved)
    with pytest.raises(ValueError, match="another architecture"):
        value_network(tiny("sdar", hidden_size=96)[0], str(tmp_path / "valued" / "value"), "sdar")
    with pytest.raises(FileNotFoundError, match="value.model ./nowhere does not exist"):
        rl_args(data, tmp_path / "x", algo="tracerl", algo_config__value__model="./nowhere").algo_config.validate(
            Family.from_pretrained(policy.config, tiny("sdar")[1]))


def test_resume_with_a_value_model_is_exact(data, tmp_path):  # noqa: F811
    """Crash after step 2 of 4, resume: the policy, the value model and its optimiser land where the straight run
    does, and the logged metrics (value loss included) agree."""
    kw = dict(algo="tracerl", model="tiny:sdar", max_steps=4, algo_config__value__model="policy",
              algo_config__value__learning_rate=1e-3)
    train_rl.main(rl_args(data, tmp_path / "straight", **kw))
    train_rl.main(rl_args(data, tmp_path / "resumed", **kw))
    shutil.rmtree(tmp_path / "resumed" / "checkpoint-4")
    (tmp_path / "resumed" / "model.safetensors").unlink()
    shutil.rmtree(tmp_path / "resumed" / "value")
    train_rl.main(rl_args(data, tmp_path / "resumed", resume=True, **kw))
    for folder in ("", "value"):
        a, b = (load_file(str(tmp_path / run / folder / "model.safetensors")) for run in ("straight", "resumed"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), folder or "policy"
    a, b = (torch.load(tmp_path / run / "checkpoint-4" / "value" / "optimizer.pt", weights_only=True)
            for run in ("straight", "resumed"))
    assert all(torch.equal(a["state"][i][key], b["state"][i][key]) for i in a["state"] for key in a["state"][i])

    def logged(out):
        return [(h["loss"], h["value/loss"], h["value/grad_norm"]) for h in history(out, 4) if "loss" in h]
    assert logged(tmp_path / "straight") == logged(tmp_path / "resumed")
