"""d1 raises the reward of a tiny model on a task it half knows: SFT a tiny LLaDA on generated single-digit sums
until it answers some of them (train_sft.py), then run d1 (train_rl.py) and compare greedy accuracy on held-out
prompts before and after. About a minute and a half on one CPU thread."""

import json

import train_rl
import train_sft
from dare.data.tasks import write_task


def test_d1_raises_held_out_accuracy(tmp_path):
    train = write_task("addition", str(tmp_path / "train.jsonl"), 4000, 0, "train")
    test = write_task("addition", str(tmp_path / "test.jsonl"), 200, 0, "test")

    sft = train_sft.Args(model="tiny:llada", output_dir=str(tmp_path / "sft"), max_steps=600, learning_rate=3e-3,
                         warmup_steps=0.0, lr_scheduler_type="constant", per_device_train_batch_size=16,
                         logging_steps=100, save_steps=10 ** 6)
    sft.data.path, sft.data.prompt_key, sft.data.response_key = train, "prompt", "extra_info.solution"
    sft.data.max_length, sft.data.pad_to = 64, "longest"
    train_sft.main(sft)

    rl = train_rl.args_class("d1")(model=str(tmp_path / "sft"), output_dir=str(tmp_path / "rl"), max_steps=60,
                                   prompts_per_step=16, num_generations=8, micro_batch_size=128, learning_rate=3e-4,
                                   eval_steps=60, eval_on_start=True, save_steps=60, logging_steps=10)
    rl.data.path, rl.data.eval_path = train, test
    rl.rollout.gen_length = rl.validation.gen_length = 12
    rl.rollout.temperature = 1.0
    train_rl.main(rl)

    logs = json.loads((tmp_path / "rl" / "checkpoint-60" / "trainer_state.json").read_text())["log_history"]
    before, after = [h["eval_acc"] for h in logs if "eval_acc" in h]
    assert 0.05 < before < 0.5, f"the SFT model should answer some prompts, not all: {before}"
    assert after >= before + 0.05, f"held-out accuracy {before:.3f} -> {after:.3f}"
