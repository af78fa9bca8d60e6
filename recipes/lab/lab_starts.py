"""The lab's shared SFT starts (``recipes/lab/compare.py``): how each family's start is trained, measured on the
held-out questions, and refused when its groups carry too little signal for RL."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import train_sft  # noqa: E402
from dare.data.tasks import write_task  # noqa: E402
from dare.eval.lab import held_out, mean_se  # noqa: E402

if TYPE_CHECKING:
    from compare import Lab

# SFT steps where a tiny model answers a fifth to a third of sum4's held-out questions at T = 1 (the rest: 1500).
# Tiny DiffusionGemma (uniform noise) sits on a loss plateau near 0.39 and falls off it at a step that depends on the
# seed and the CPU (before 2000 steps for SFT seeds 1 and 3, near 2700 and 4300 for 42 and 2): after 3000 steps its
# held-out reward was 0.04 to 0.76, and RL from a start on the plateau collapses. Its SFT stops instead at the first
# training loss below 0.26 (starts 0.55-0.60 for seeds 42, 2 and 5), 10000 steps at most.
SFT_STEPS = {"diffusion_gemma": 10000}
SFT_STOP_AT_LOSS = {"diffusion_gemma": 0.26}
# families whose lab start also learns the EOS run after the answer (their own recipe leaves it as padding): a tiny
# LLaDA-V from scratch never learns what follows its stop, fills the canvas's tail with answer pieces, and d1 at 1e-3
# then breaks the answer within a step ("The answer isboxedboxed{1}."; bench/results/cpu-2026-12-07/shapes-lab.md).
# A LLaDA-V checkpoint learnt the fill as LLaDA-Instruct.
EOS_TAIL = {"llada_v"}


def row_length(task: str, family: str, rows: int = 4000) -> int:
    """Tokens of the longest SFT row (chat-templated question and reference answer) of the lab's training rows, a
    picture counted as the placeholders it takes (beside its ``<image>`` text's tokens: a bound)."""
    from dare.data.images import IMAGE, load_image
    from dare.data.tasks import make_task
    from dare.models import pictures
    from dare.models.loading import load_config

    config, tokenizer, _ = load_config(f"tiny:{family}")
    reader = pictures(config)

    def placeholders(row):
        seen = [load_image(b) for b in row.get("images") or ()]
        if seen and reader is None:
            raise SystemExit(f"task {task} asks about pictures: tiny:{family} reads none (tiny:llada_v and tiny:mmada "
                             "do)")
        return reader.prompt_length(tokenizer, IMAGE * len(seen), seen) if seen else 0

    return max(len(tokenizer.apply_chat_template(r["prompt"] + [{"role": "assistant", "content": r["extra_info"][
        "solution"]}], tokenize=True, return_dict=False)) + placeholders(r) for r in make_task(task, rows, 0, "train"))


def answer_length(task: str, families: list[str], rows: int = 4000) -> int:
    """Completion tokens the task's longest reference answer needs in the lab's training rows (with its stop token),
    by the families' tokenizers, rounded up to a multiple of 4 (the tiny block families' block)."""
    from dare.data.tasks import make_task
    from dare.models.loading import load_config

    answers = [r["extra_info"]["solution"] for r in make_task(task, rows, 0, "train")]
    longest = max(len(ids) for family in families
                  for ids in load_config(f"tiny:{family}")[1](answers, add_special_tokens=False)["input_ids"])
    return -(-(longest + 1) // 4) * 4


def measure(model_dir: str, lab: Lab) -> dict:
    return held_out(model_dir, lab.task, lab.questions, lab.samples, lab.gen_length)


def start_measure(start: str, family: str, lab: Lab) -> dict:
    """The start's held-out measure, printed and kept beside it (``held_out.json``, per question): a rerun of the
    lab in the same folder (the same settings: ``lab.json``) reuses it."""
    path = Path(start) / "held_out.json"
    if not path.exists():
        path.write_text(json.dumps(measure(start, lab)))
    before = json.loads(path.read_text())
    (reward, se), greedy = mean_se(before["reward_q"]), statistics.fmean(before["greedy_q"])
    mixed = f", with right and wrong answers {statistics.fmean(before['right_wrong_q']):.1%}" \
        if "right_wrong_q" in before else ""  # measures kept by an older lab lack it
    print(f"{family} start on held-out {lab.task}: T=1 reward {reward:.3f} ± {se:.3f}, greedy {greedy:.3f}, groups "
          f"with signal {statistics.fmean(before['spread_q']):.1%}{mixed}", flush=True)
    return before


def sft(family: str, lab: Lab, folder: Path) -> str:
    """SFT of a tiny random model of ``family`` on the task's train split (``folder.parent/data``): the RL start."""
    train = write_task(lab.task, str(folder.parent / "data" / "train.jsonl"), 4000, 0, "train")
    a = train_sft.Args(model=f"tiny:{family}", output_dir=str(folder), max_steps=sft_steps(family, lab),
                       learning_rate=lab.sft_lr, warmup_steps=0.0, lr_scheduler_type="constant",
                       per_device_train_batch_size=16, logging_steps=100, save_steps=10 ** 6,
                       stop_at_loss=sft_stop_at_loss(family, lab), overwrite_output_dir=True)  # a killed run anew
    a.data.path, a.data.prompt_key, a.data.response_key = train, "prompt", "extra_info.solution"
    a.data.max_length, a.data.pad_to = max(64, row_length(lab.task, family) + 8), "longest"
    a.data.eos_tail = True if family in EOS_TAIL else None
    steps = train_sft.main(a).state.global_step
    (folder / "sft.json").write_text(json.dumps({"steps": steps, "stop_at_loss": a.stop_at_loss}))
    return str(folder)


def sft_steps(family: str, lab: Lab) -> int:
    return lab.sft_steps if lab.sft_steps is not None else SFT_STEPS.get(family, 1500)


def sft_stop_at_loss(family: str, lab: Lab) -> float:
    return lab.sft_stop_at_loss if lab.sft_stop_at_loss is not None else SFT_STOP_AT_LOSS.get(family, 0.0)


def sft_start(family: str, lab: Lab, out: Path) -> str:
    """The lab's shared start of ``family``, trained once per output folder."""
    folder = out / f"sft-{family}"
    return str(folder) if (folder / "model.safetensors").exists() else sft(family, lab, folder)


SIGNAL_FLOOR = 0.1  # the least share of the start's groups with differing rewards the lab spends RL on
# tasks the lab's tiny models do not learn, with what was measured (bench/results/cpu-2026-12-06/lab52, LLaDA, seed 0):
# refused before the SFT start unless --allow-no-signal
NOT_LEARNABLE = {
    "arithmetic": "a tiny model's SFT start answers under 5 % of the held-out questions (0.039 at T = 1 after 1500 "
                  "steps, 0.047 after 4000; 20-22 % of its groups with a signal) and d1 from it does not learn "
                  "(-0.9 SE; from the 4000-step start -6.0 SE, its control -0.6 SE)",
    "countdown": "a tiny model's SFT start solves none of the held-out puzzles (0.091 at T = 1, the format score; 0 % "
                 "of 200 questions' groups of 8 hold a right answer): its groups spread on format only, and RL has no "
                 "right answer to reinforce",
    "cycle": "a tiny model's SFT start (1500 steps) answers 1.2 % of 200 held-out questions at T = 1 (greedy 0.5 %) "
             "and only 5 % of their groups of 8 hold a right and a wrong answer, under the lab's 10 % floor: RL would "
             "get a gradient from almost none",
}


def check_signal(before: dict, family: str, lab: Lab) -> None:
    """Stop before the RL budget is spent when too few of the SFT start's groups carry a signal: the held-out
    questions' ``samples`` completions at T = 1 (the lab's groups when ``samples`` equals ``num_generations``) whose
    rewards differ. A group whose completions all score alike (a start that always fails, always succeeds, or earns
    one format-only score: countdown's 0.093 for every completion) has every advantage 0: RL learns nothing from it."""
    reward, share = statistics.fmean(before["reward_q"]), statistics.fmean(before["spread_q"])
    if share < SIGNAL_FLOOR and not lab.allow_no_signal:
        raise SystemExit(f"the SFT start of {family} on held-out {lab.task}: only {share:.1%} of its groups "
                         f"({lab.samples} completions of a question at T = 1) have rewards that differ (mean reward "
                         f"{reward:.3f}; the lab needs {SIGNAL_FLOOR:.0%}): RL would get no gradient from the rest. "
                         f"Train the start longer or shorter (--sft-steps {sft_steps(family, lab)} now), give it a "
                         "longer --gen-length or a denser reward, choose another task, or --allow-no-signal for a "
                         "smoke test")
