"""Every online algorithm on the same learnable tiny task, side by side: held-out accuracy before / after RL,
the mean training reward of the first and last quarter, seconds per optimiser step (median) and per rollout batch
(the whole run / rollouts, both validations included), and model forward passes per completion and rollout batch
for training (old/reference passes included, rollout excluded).

    python bench/bench_algos.py                          # tiny LLaDA (EBPO: tiny SDAR), 60 rollouts each, ~35 min
    python bench/bench_algos.py --algos d1 bgpo --rollouts 20

Setup (the quickstart's, tests/test_quickstart.py): a tiny model SFT'd 600 steps on generated single-digit sums answers ~18 % of
held-out prompts; each algorithm then gets ``--rollouts`` rollout batches of 16 prompts x 8 completions (T = 1,
lr 3e-4, 12 tokens), i.e. ``rollouts x num_iterations`` optimiser steps, with its own defaults otherwise (K = 16
for BGPO/EBPO, mu = 8 for ESPO, mu = 12 and trees of 2 x 4 leaves for d-TreeRPO, all 12 steps for CJ-GRPO and
MDPO). Accuracy: greedy, 200 held-out prompts. Each run is a forked child. VRPO (offline): bench/bench_vrpo.py.
"""

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from _common import in_child

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import train_rl  # noqa: E402
import train_sft  # noqa: E402
from dare.algos import get_algorithm, known  # noqa: E402
from dare.data.tasks import write_task  # noqa: E402
from dare.models.family import Family  # noqa: E402
from dare.trainers.rl import DiffusionRLTrainer  # noqa: E402


def sft(family, folder, train, queue):
    torch.set_num_threads(1)
    a = train_sft.Args(model=f"tiny:{family}", output_dir=folder, max_steps=600, learning_rate=3e-3,
                       warmup_steps=0.0, lr_scheduler_type="constant", per_device_train_batch_size=16,
                       logging_steps=100, save_steps=10 ** 6)
    a.data.path, a.data.prompt_key, a.data.response_key = train, "prompt", "extra_info.solution"
    a.data.max_length, a.data.pad_to = 64, "longest"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        train_sft.main(a)
    queue.put(folder)


def rl(algo, model, train, test, rollouts, queue):
    torch.set_num_threads(1)
    counter = {"on": False, "rows": 0}
    logits = Family.logits

    def counted(self, model, input_ids, *args, **kwargs):
        counter["rows"] += counter["on"] * input_ids.shape[0]  # sequences through the model
        return logits(self, model, input_ids, *args, **kwargs)

    def counting(method):
        def wrapped(self, *args, **kwargs):
            counter["on"] = True
            try:
                return method(self, *args, **kwargs)
            finally:
                counter["on"] = False
        return wrapped

    Family.logits = counted
    DiffusionRLTrainer.compute_loss = counting(DiffusionRLTrainer.compute_loss)
    DiffusionRLTrainer._score_old_and_reference = counting(DiffusionRLTrainer._score_old_and_reference)
    mu = get_algorithm(algo)().cycle
    with tempfile.TemporaryDirectory() as out:
        a = train_rl.args_class(algo)(model=model, output_dir=out, max_steps=rollouts * mu, prompts_per_step=16,
                                      num_generations=8, micro_batch_size=128, learning_rate=3e-4,
                                      eval_steps=rollouts * mu, eval_on_start=True, save_steps=10 ** 6 * mu,
                                      logging_steps=1, log_completions=0)
        a.data.path, a.data.eval_path = train, test
        a.rollout.gen_length = a.validation.gen_length = 12
        a.rollout.temperature = 1.0
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            logs = train_rl.main(a).state.log_history
        seconds = time.perf_counter() - start
    accuracy = [h["eval_acc"] for h in logs if "eval_acc" in h]
    rewards = [h["reward"] for h in logs if "reward" in h]
    quarter = max(1, len(rewards) // 4)
    steps = [h["time/train"] + h.get("time/rollout", 0) + h.get("time/reward", 0) + h.get("time/old_ref_logp", 0)
             for h in logs if "time/train" in h]
    queue.put(dict(before=accuracy[0], after=accuracy[-1], first=statistics.mean(rewards[:quarter]),
                   last=statistics.mean(rewards[-quarter:]), step=statistics.median(steps), mu=mu,
                   forwards=counter["rows"] / rollouts / 128, seconds=seconds))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", nargs="+", default=[a for a in known() if not getattr(get_algorithm(a), "offline", False)])
    p.add_argument("--rollouts", type=int, default=60)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        train = write_task("addition", f"{tmp}/train.jsonl", 4000, 0, "train")
        test = write_task("addition", f"{tmp}/test.jsonl", 200, 0, "test")
        models = {}
        print(f"{args.rollouts} rollout batches of 16 prompts x 8 completions per algorithm\n")
        print("| algorithm | model | mu | held-out acc before | after | train reward first 1/4 | last 1/4 | "
              "s / opt. step | s / rollout batch | train forwards per completion | total s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for algo in args.algos:
            families = get_algorithm(algo).families
            family = "llada" if families is None or "llada" in families else "sdar"
            if family not in models:
                models[family] = in_child(sft, family, f"{tmp}/sft-{family}", train)
            r = in_child(rl, algo, models[family], train, test, args.rollouts)
            print(f"| {algo} | tiny {family} | {r['mu']} | {r['before']:.3f} | {r['after']:.3f} | {r['first']:.3f} | "
                  f"{r['last']:.3f} | {r['step']:.2f} | {r['seconds'] / args.rollouts:.2f} | {r['forwards']:.0f} | "
                  f"{r['seconds']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
