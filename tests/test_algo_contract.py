"""Contract tests for EVERY registered algorithm (parametrised over the registry: a new algorithm file is tested
here without new tests): it runs under train_rl.py on every family it supports and refuses the others with a
reason; the first inner iteration is on-policy (old, reference and current policy see the same noise: ratio 1,
KL 0); its loss does not depend on the micro-batch split (nor on streaming); empty and all-EOS completions give
finite losses and gradients."""

import random

import pytest
import torch
from test_train_rl import data, history, rl_args, weights  # noqa: F401  (fixture + helpers)

import train_rl
from dare.algos import get_algorithm, known
from dare.algos.base import Algorithm
from dare.engines import HFEngine
from dare.models import Family, tiny
from dare.sampling import SamplingConfig

FAMILIES = ("llada", "dream", "sdar", "llada2", "diffusion_gemma")
FAST = {"bgpo": {"samples": 3}, "ebpo": {"samples": 3}, "espo": {"num_iterations": 1}, "spg": {},
        "d-treerpo": {"num_iterations": 1, "branch": 2}, "mdpo": {"train_steps": 3},
        "maskgrpo": {"num_iterations": 1}}
ONLINE = [a for a in known() if get_algorithm(a).trainer == "rl"]  # the preference trainer: tests/test_vrpo.py
NO_KL = {"spg", "dmpo"}  # refuse beta > 0 (no KL term)


def knobs(algo, **extra):
    return {f"algo_config__{k}": v for k, v in {**FAST.get(algo, {}), **extra}.items()}


def supported(algo, family):
    return get_algorithm(algo).supports(family)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("algo", ONLINE)
def test_runs_on_policy_on_every_supported_family(algo, family, data, tmp_path):  # noqa: F811
    cls = get_algorithm(algo)
    extra = {"num_iterations": 2} if cls.uses_ratio else {}
    if algo not in NO_KL:
        extra["beta"] = 0.1
    args = rl_args(data, tmp_path, algo=algo, model=f"tiny:{family}", **knobs(algo, **extra))
    if not supported(algo, family):
        with pytest.raises(ValueError, match=f"{algo} does not apply to {family}.+\\(.+\\)"):
            train_rl.main(args)
        return
    train_rl.main(args)
    first, second = [h for h in history(tmp_path, 2) if "loss" in h]
    assert "reward" in first and first["grad_norm"] == first["grad_norm"]  # not NaN
    if "ratio" in first:
        assert first["ratio"] == 1.0, "the first inner iteration must be on-policy (same noise for old and new)"
    if "log_ratio" in first:
        assert first["log_ratio"] == 0.0
    if "log_ref_ratio" in first:
        assert first["log_ref_ratio"] == 0.0, "the reference must see the same noise as the rollout policy"
    if "kl" in first:
        assert first["kl"] == 0.0, "the reference must see the same noise as the policy"


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    from dare.data.tasks import write_task

    folder = tmp_path_factory.mktemp("picture-data")
    return (write_task("shapes", str(folder / "train.parquet"), 16, 0, "train"),
            write_task("shapes", str(folder / "test.parquet"), 4, 0, "test"))


@pytest.mark.parametrize("algo", ONLINE)
def test_runs_on_policy_on_pictures(algo, pictures, tmp_path):
    """LLaDA-V on the visual task: every algorithm its math allows trains on picture prompts (rollouts, old and
    reference scoring, the loss, validation), on-policy at its first inner iteration."""
    cls = get_algorithm(algo)
    extra = {"num_iterations": 2} if cls.uses_ratio else {}
    if algo not in NO_KL:
        extra["beta"] = 0.1
    args = rl_args(pictures, tmp_path, algo=algo, model="tiny:llada_v", eval_steps=1, **knobs(algo, **extra))
    if not supported(algo, "llada_v"):
        with pytest.raises(ValueError, match=f"{algo} does not apply to llada_v.+\\(.+\\)"):
            train_rl.main(args)
        return
    train_rl.main(args)
    first = [h for h in history(tmp_path, 2) if "loss" in h][0]
    assert "reward" in first and first["grad_norm"] == first["grad_norm"]  # not NaN
    assert first.get("ratio", 1.0) == 1.0 and first.get("kl", 0.0) == 0.0
    assert any("eval_reward" in h for h in history(tmp_path, 2))


@pytest.mark.parametrize("algo", ONLINE)
def test_loss_does_not_depend_on_micro_batches_or_streaming(algo, data, tmp_path):  # noqa: F811
    family = "llada" if supported(algo, "llada") else "sdar"
    runs = {"one": dict(micro_batch_size=8), "four": dict(micro_batch_size=2)}
    if "stream" in get_algorithm(algo).__dataclass_fields__:
        runs["unstreamed"] = dict(micro_batch_size=8, **knobs(algo, stream=False))
    for name, kw in runs.items():
        kw = {**knobs(algo), **kw}
        train_rl.main(rl_args(data, tmp_path / name, algo=algo, model=f"tiny:{family}", max_steps=1, save_steps=1,
                              optim="sgd", learning_rate=1.0, **kw))
    start, one = weights(f"tiny:{family}"), weights(tmp_path / "one")
    assert any((one[k] - start[k]).abs().max() > 1e-5 for k in one), "the step must move the weights"
    for name in runs:
        other = weights(tmp_path / name)
        worst = max((one[k] - other[k]).abs().max().item() for k in one)
        assert worst < 1e-6, f"{name}: {worst}"


@pytest.mark.parametrize("family_name", ["llada", "sdar"])
@pytest.mark.parametrize("algo", ONLINE)
def test_empty_and_all_eos_completions_are_finite(algo, family_name):
    if not supported(algo, family_name):
        pytest.skip(f"{algo} does not apply to {family_name}")
    model, tok = tiny(family_name)
    model = model.double()
    fam = Family.from_pretrained(model.config, tok)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(20, 200, (4, 6), generator=g)
    completion = torch.randint(20, 200, (4, 8), generator=g)
    completion[1] = fam.eos_id  # all EOS
    completion_mask = torch.ones_like(completion)
    loss_mask = completion_mask.clone()
    loss_mask[0] = 0  # nothing to train on
    batch = {"prompt_ids": prompt, "prompt_mask": torch.ones_like(prompt), "completion_ids": completion,
             "completion_mask": completion_mask, "loss_mask": loss_mask,
             "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)}
    algorithm = get_algorithm(algo)(**FAST.get(algo, {})).validate(fam)
    config = algorithm.rollout_sampling(fam, SamplingConfig(gen_length=8))
    if type(algorithm).make_batch is not Algorithm.make_batch:  # rows built from rollout records: roll out all-EOS
        add = torch.zeros(fam.vocab_size, dtype=torch.float64)
        add[fam.eos_id] = 50.0
        model.get_output_embeddings().register_forward_hook(lambda module, args, out: out + add)
        rollout = algorithm.rollout(HFEngine(model, tok, fam), ["a", "b c"], 2, config, 0)
        assert (rollout.completion_ids == fam.eos_id).all() or (rollout.completion_ids[:, 0] == fam.eos_id).all()
        batch = algorithm.make_batch(fam, rollout, torch.tensor([1.0, 0.0, 0.0, 1.0]), 2,
                                     lambda ids, rows: torch.zeros(len(ids)), 0, config)
    batch["noise"] = [algorithm.corrupt(fam, batch, g, config)]
    if algorithm.beta:
        with torch.no_grad():
            batch["ref"] = [algorithm.score(model, fam, batch, batch["noise"][0], config).logp]
    for stream in range(algorithm.streams(fam, config)):
        loss, _ = algorithm.step_loss(model, fam, batch, 0, stream, algorithm.normaliser(fam, batch, config), config)
        loss.backward()
        assert torch.isfinite(loss), (algo, stream)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("family_name", ["llada", "sdar"])
@pytest.mark.parametrize("algo", ONLINE)
def test_hooks_depend_only_on_their_arguments(algo, family_name):
    """Every hook called on a fresh instance, the planning hooks in a shuffled order, gives exactly the rollout,
    batch, noise and losses of one instance used in the trainer's order: no hook keeps state for another."""
    if not supported(algo, family_name):
        pytest.skip(f"{algo} does not apply to {family_name}")
    model, tok = tiny(family_name)
    fam = Family.from_pretrained(model.config, tok)
    engine = HFEngine(model, tok, fam)
    kw = {**FAST.get(algo, {}), **({"beta": 0.1} if algo not in NO_KL else {})}
    asked = SamplingConfig(gen_length=8, temperature=1.0, block_length=4 if fam.block_size is None else None)

    def step(instance, order):
        plan = {"sampling": lambda: instance().rollout_sampling(fam, asked)}
        for hook in order:  # the planning hooks, each on what the others return
            if hook == "streams":
                plan[hook] = instance().streams(fam, plan["sampling"]())
            elif hook == "estimator":
                plan[hook] = type(instance().estimator(fam, plan["sampling"]()))
        sampling = plan["sampling"]()
        rollout = instance().rollout(engine, ["a b", "c"], 2, sampling, 0)
        rewards = torch.tensor([float(len(t) % 3) for t in rollout.texts])
        batch = instance().make_batch(fam, rollout, rewards, 2, lambda ids, rows: (ids % 3 == 0).double().mean(-1),
                                      0, sampling)
        batch["noise"] = [instance().corrupt(fam, batch, torch.Generator().manual_seed(5), sampling)]
        with torch.no_grad():
            logp = instance().score(model, fam, batch, batch["noise"][0], sampling).logp
        batch["old"], batch["ref"] = [logp + 0.01], [logp - 0.02]
        instance().after_scoring([batch], 2)
        normaliser = instance().normaliser(fam, batch, sampling)
        losses = [instance().step_loss(model, fam, batch, 0, s, normaliser, sampling)[0].detach()
                  for s in range(instance().streams(fam, sampling))]
        return plan["streams"], plan["estimator"], rollout.completion_ids, losses

    one = get_algorithm(algo)(**kw)
    expected = step(lambda: one, ["streams", "estimator"])
    order = ["estimator", "streams"]
    random.Random(algo).shuffle(order)
    got = step(lambda: get_algorithm(algo)(**kw), order)
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])
    assert len(got[3]) == expected[0] and all(torch.equal(a, b) for a, b in zip(got[3], expected[3], strict=True))
