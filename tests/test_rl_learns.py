"""The rollout-record algorithms learn: on the quickstart's task (a tiny LLaDA SFT'd on generated single-digit sums
until it answers some held-out prompts), ten rollout batches of cj-grpo, mdpo and d-treerpo each raise the mean
reward of greedy answers to 200 held-out prompts (d1 is covered by tests/test_quickstart.py, the rest of the zoo by
bench/bench_algos.py). About half a minute per algorithm on one CPU thread."""

import statistics

import pytest

import train_rl
import train_sft
from dare.data.tasks import write_task

ROLLOUTS = 10


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learns")
    train = write_task("addition", str(folder / "train.jsonl"), 4000, 0, "train")
    test = write_task("addition", str(folder / "test.jsonl"), 200, 0, "test")
    a = train_sft.Args(model="tiny:llada", output_dir=str(folder / "sft"), max_steps=600, learning_rate=3e-3,
                       warmup_steps=0.0, lr_scheduler_type="constant", per_device_train_batch_size=16,
                       logging_steps=100, save_steps=10 ** 6)
    a.data.path, a.data.prompt_key, a.data.response_key = train, "prompt", "extra_info.solution"
    a.data.max_length, a.data.pad_to = 64, "longest"
    train_sft.main(a)
    return str(folder / "sft"), train, test


@pytest.mark.parametrize("algo", ["cj-grpo", "mdpo", "d-treerpo"])
def test_rollout_record_algorithms_raise_reward(algo, sft, tmp_path):
    model, train, test = sft
    cycle = train_rl.args_class(algo)().algo_config.cycle
    a = train_rl.args_class(algo)(model=model, output_dir=str(tmp_path), max_steps=ROLLOUTS * cycle,
                                  prompts_per_step=16, num_generations=8, micro_batch_size=128, learning_rate=3e-4,
                                  eval_steps=ROLLOUTS * cycle, eval_on_start=True, save_steps=ROLLOUTS * cycle,
                                  log_completions=0)
    a.data.path, a.data.eval_path = train, test
    a.rollout.gen_length = a.validation.gen_length = 12
    a.rollout.temperature = 1.0
    logs = train_rl.main(a).state.log_history
    held_out = [h["eval_reward"] for h in logs if "eval_reward" in h]
    rewards = [h["reward"] for h in logs if "reward" in h]  # T = 1 samples: noisy over a few rollouts, reported only
    print(f"{algo}: held-out greedy reward {held_out[0]:.3f} -> {held_out[-1]:.3f}; training reward "
          f"{statistics.mean(rewards[:ROLLOUTS // 2]):.3f} -> {statistics.mean(rewards[ROLLOUTS // 2:]):.3f}")
    assert held_out[-1] >= held_out[0] + 0.05, held_out
