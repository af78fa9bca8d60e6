"""``--rollout-mode ahead``: rollout k + 1 decodes on a copy of the policy while rollout k trains. Its bookkeeping is
checked exactly: each rollout is what the previous cycle's weights decode, its ratio's old log-likelihoods come from
those same weights (the policy that produced it), nothing changes when the weights do not move, a resumed run lands
on the uninterrupted run's weights, and the next batch's decoding starts before the current one has trained."""

import shutil
import threading
import time

import pytest
import torch
from test_algo_contract import knobs
from test_train_rl import data, history, rl_args, weights  # noqa: F401

import train_rl
from dare.algos import get_algorithm
from dare.engines import HFEngine
from dare.engines.base import weights_digest
from dare.models import load_pretrained
from dare.trainers.rl import DiffusionRLTrainer, RepeatSampler
from dare.trainers.rollout_modes import WEIGHTS, OneStepAhead


def steps(out, last):
    return [h for h in history(out, last) if "loss" in h]


def test_each_rollout_is_decoded_and_its_ratio_scored_by_the_previous_cycles_weights(data, tmp_path,  # noqa: F811
                                                                                       monkeypatch):
    decoded, scored = {}, {}
    decode, rollout_policy = DiffusionRLTrainer.decode, OneStepAhead.rollout_policy

    def recording_decode(self, policy, rows, index, version):
        out = decode(self, policy, rows, index, version)
        decoded[index] = (weights_digest(policy), version, out.rollout.completion_ids.clone(),
                          [r["prompt"] for r in rows], self._seed("rollout", index))
        return out

    def recording_policy(self, policy):
        model = rollout_policy(self, policy)
        scored.setdefault(self.trainer.state.global_step, weights_digest(model))
        return model

    monkeypatch.setattr(DiffusionRLTrainer, "decode", recording_decode)
    monkeypatch.setattr(OneStepAhead, "rollout_policy", recording_policy)
    out = tmp_path / "ahead"
    trainer = train_rl.main(rl_args(data, out, max_steps=3, save_steps=1, save_total_limit=10,
                                    learning_rate=3e-2, rollout_mode="ahead"))
    assert sorted(decoded) == [0, 1, 2] and sorted(scored) == [0, 1, 2]
    logs = steps(out, 3)
    for k in range(3):
        # rollouts 0 and 1 decode with the starting weights, rollout k > 1 with those after step k - 1
        folder = "tiny:llada" if k <= 1 else str(out / f"checkpoint-{k - 1}")
        digest, version, ids, prompts, seed = decoded[k]
        assert version == max(k - 1, 0) and logs[k]["rollout/policy_lag"] == (1 if k else 0)
        assert scored[k] == digest  # the ratio's denominator: the policy that decoded the rollout
        model, tokenizer, family = load_pretrained(folder, dtype=torch.float32)
        assert weights_digest(model) == digest
        again = HFEngine(model, tokenizer, family).generate(prompts, 4, trainer.sampling, seed)
        assert torch.equal(again.completion_ids, ids)
    assert logs[0]["ratio"] == 1.0  # rollout 0 decodes on-policy
    assert logs[1]["ratio"] != 1.0 and logs[2]["ratio"] != 1.0  # one step off: the ratio corrects it


def test_with_weights_that_do_not_move_ahead_equals_sync(data, tmp_path):  # noqa: F811
    for mode in ("sync", "ahead"):
        train_rl.main(rl_args(data, tmp_path / mode, max_steps=3, save_steps=3, learning_rate=0.0, rollout_mode=mode))
    keys = ("loss", "reward", "ratio", "entropy", "completion_length")
    sync, ahead = ([[h[k] for k in keys] for h in steps(tmp_path / m, 3)] for m in ("sync", "ahead"))
    assert sync == ahead


def test_a_resumed_ahead_run_lands_on_the_uninterrupted_runs_weights(data, tmp_path):  # noqa: F811
    kw = dict(max_steps=4, save_steps=2, rollout_mode="ahead")
    train_rl.main(rl_args(data, tmp_path / "straight", **kw))
    train_rl.main(rl_args(data, tmp_path / "resumed", **kw))
    assert (tmp_path / "resumed" / "checkpoint-2" / WEIGHTS).exists()
    shutil.rmtree(tmp_path / "resumed" / "checkpoint-4")
    (tmp_path / "resumed" / "model.safetensors").unlink()
    train_rl.main(rl_args(data, tmp_path / "resumed", resume=True, **kw))
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    logged = [[(h["loss"], h["reward"], h["ratio"]) for h in steps(tmp_path / run, 4)][2:]
              for run in ("straight", "resumed")]
    assert logged[0] == logged[1]


def test_the_next_batch_decodes_while_this_one_trains(data, tmp_path, monkeypatch):  # noqa: F811
    """The background decoding of rollout k + 1 is under way before the trainer has finished training rollout k."""
    started, trained = {}, {}
    decode, training_step = DiffusionRLTrainer.decode, DiffusionRLTrainer.training_step

    def timed_decode(self, policy, rows, index, version):
        started[index] = (time.perf_counter(), threading.current_thread() is threading.main_thread())
        return decode(self, policy, rows, index, version)

    def timed_training_step(self, *args, **kwargs):
        loss = training_step(self, *args, **kwargs)
        trained[self.state.global_step] = time.perf_counter()  # the last micro-batch of the step wins
        return loss

    monkeypatch.setattr(DiffusionRLTrainer, "decode", timed_decode)
    monkeypatch.setattr(DiffusionRLTrainer, "training_step", timed_training_step)
    train_rl.main(rl_args(data, tmp_path, max_steps=4, save_steps=4, rollout_mode="ahead"))
    assert started[0][1] and not any(started[k][1] for k in (1, 2, 3))  # rollout 0 in the trainer, then behind it
    assert all(started[k + 1][0] < trained[k] for k in range(3))


@pytest.mark.parametrize("algo", ["cj-grpo", "bgpo", "wd1"])
def test_every_kind_of_algorithm_trains_ahead(algo, data, tmp_path):  # noqa: F811
    """A trajectory replay (streams per group), a sequence-level ELBO ratio, a ratio-free loss: the second step trains
    on a rollout of the step before, and where there is a ratio it is no longer 1."""
    trainer = train_rl.main(rl_args(data, tmp_path, algo=algo, rollout_mode="ahead", **knobs(algo)))
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["rollout/policy_lag"] for h in logs] == [0, 1]
    if get_algorithm(algo).uses_ratio:
        assert logs[0]["ratio"] == 1.0 and logs[1]["ratio"] != 1.0
    else:
        assert "ratio" not in logs[1]


def test_ahead_is_refused_where_it_cannot_run(data, tmp_path, monkeypatch):  # noqa: F811
    with pytest.raises(ValueError, match="sequence-parallel 1"):
        train_rl.main(rl_args(data, tmp_path, rollout_mode="ahead", sequence_parallel=2))
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(ValueError, match="not FSDP or DeepSpeed"):
        train_rl.main(rl_args(data, tmp_path, rollout_mode="ahead"))


def test_the_prefetched_prompts_are_the_ones_the_sampler_yields_over_epochs():
    sampler, yielded = RepeatSampler(10, 3, 2, seed=5), []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        order = list(sampler)
        yielded += [order[i:i + 3] for i in range(0, len(order), 6)]  # each block twice in a row
        assert all(order[i:i + 3] == order[i + 3:i + 6] for i in range(0, len(order), 6))
    assert yielded == [sampler.prompts_of(step) for step in range(9)]  # 3 blocks per epoch of 10 prompts
    assert yielded[0] != yielded[3]  # a new epoch, a new order
