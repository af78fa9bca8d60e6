"""train_rl.py end to end on tiny models: every family, metrics, checkpoints and exact resume, inner iterations,
the KL reference (frozen copy and LoRA-disabled base), micro-batch invariance, and clear errors."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train_rl
from dare.data.tasks import write_task
from dare.models import load_pretrained
from dare.rewards import REWARDS, RewardResult, reward
from dare.trainers import COMPLETE

ROOT = Path(__file__).resolve().parents[1]

if "test_length" not in REWARDS:
    @reward("test_length")
    def _length_reward(completion, ground_truth, extra_info=None):
        """Varies across random completions, so a random tiny model gets non-zero advantages and gradients."""
        score = (len(completion) % 7) / 6
        return RewardResult(score, float(score > 0.5))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rl-data")
    return (write_task("addition", str(folder / "train.jsonl"), 64, 0, "train"),
            write_task("addition", str(folder / "test.jsonl"), 6, 0, "test"))


def rl_args(data, out, algo="d1", **kw):
    args = train_rl.args_class(algo)(model=kw.pop("model", "tiny:llada"), output_dir=str(out), max_steps=2,
                                     prompts_per_step=2, num_generations=4, micro_batch_size=4, save_steps=2,
                                     learning_rate=1e-3, rewards=["test_length"], log_completions=1)
    args.data.path, args.data.eval_path = data
    args.rollout.gen_length = args.validation.gen_length = 8
    args.rollout.temperature = 1.0
    return set_fields(args, **kw)


def set_fields(args, **kw):
    """``args`` with ``a__b=value`` keyword arguments set as ``args.a.b = value``."""
    for key, value in kw.items():
        target = args
        *parents, leaf = key.split("__")
        for p in parents:
            target = getattr(target, p)
        setattr(target, leaf, value)
    return args


def history(out, step):
    return json.loads((Path(out) / f"checkpoint-{step}" / "trainer_state.json").read_text())["log_history"]


def weights(folder):
    return load_pretrained(str(folder), dtype=torch.float32)[0].state_dict()


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2"])
def test_d1_runs_on_every_family(family, data, tmp_path):
    train_rl.main(rl_args(data, tmp_path, model=f"tiny:{family}", eval_steps=2, report_to="tensorboard"))
    assert list(tmp_path.rglob("events.out.tfevents.*")), "tensorboard event files"
    assert (tmp_path / "checkpoint-2" / COMPLETE).exists()
    logs = history(tmp_path, 2)
    train = [h for h in logs if "loss" in h]
    assert len(train) == 2
    for key in ("reward", "reward_std", "reward/addition", "acc", "acc/addition", "completion_length",
                "clip_fraction", "entropy", "ratio", "time/rollout", "time/reward", "time/train",
                "rollout/tokens_per_s", "grad_norm"):
        assert key in train[0], key
    assert train[0]["ratio"] == 1.0 and train[0]["clip_fraction"] == 0.0  # one inner iteration: on-policy
    assert any(h["grad_norm"] > 0 for h in train)
    assert any("eval_acc/addition" in h for h in logs)
    lines = (tmp_path / "completions.jsonl").read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["source"] == "addition"
    before, after = weights(f"tiny:{family}"), weights(tmp_path)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_resume_is_exact(data, tmp_path):
    """mu = 2 (a rollout every other step): crash after step 2, resume, and land on the same weights."""
    kw = dict(max_steps=4, algo_config__num_iterations=2)
    train_rl.main(rl_args(data, tmp_path / "straight", **kw))
    train_rl.main(rl_args(data, tmp_path / "resumed", **kw))
    shutil.rmtree(tmp_path / "resumed" / "checkpoint-4")
    (tmp_path / "resumed" / "model.safetensors").unlink()
    train_rl.main(rl_args(data, tmp_path / "resumed", resume=True, **kw))
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    def after_resume(out):
        return [(h["loss"], h["grad_norm"], h.get("reward")) for h in history(out, 4) if "loss" in h][2:]
    assert after_resume(tmp_path / "straight") == after_resume(tmp_path / "resumed")
    # resuming the finished run trains nothing (no step 5): the final model keeps its weights exactly
    train_rl.main(rl_args(data, tmp_path / "straight", resume=True, **kw))
    again = weights(tmp_path / "straight")
    assert all(torch.equal(a[k], again[k]) for k in a)
    assert not list((tmp_path / "straight").glob("checkpoint-[5-9]*"))


def test_inner_iterations_start_on_policy_then_move(data, tmp_path):
    """Old log-probs come from a separate no-grad pass at rollout time: at the first inner iteration the ratio is
    still exactly 1; at the second (after an optimiser step) it is not, and the clip can engage."""
    train_rl.main(rl_args(data, tmp_path, max_steps=2, learning_rate=3e-2, algo_config__num_iterations=2,
                          algo_config__eps_low=0.01, algo_config__eps_high=0.01))
    first, second = [h for h in history(tmp_path, 2) if "loss" in h]
    assert first["ratio"] == 1.0 and first["clip_fraction"] == 0.0
    assert second["ratio"] != 1.0 and second["clip_fraction"] > 0.0


def test_loss_does_not_depend_on_the_micro_batch_split(data, tmp_path):
    """One micro-batch of 8 or four of 2: the same gradient (SGD, so the update is the gradient)."""
    for name, size in (("one", 8), ("four", 2)):
        train_rl.main(rl_args(data, tmp_path / name, max_steps=1, save_steps=1, micro_batch_size=size, optim="sgd",
                              learning_rate=1.0))
    a, b, start = weights(tmp_path / "one"), weights(tmp_path / "four"), weights("tiny:llada")
    assert any((a[k] - start[k]).abs().max() > 1e-4 for k in a)
    assert all(torch.allclose(a[k], b[k], atol=1e-7) for k in a)


@pytest.mark.parametrize("lora", [False, True])
def test_kl_to_the_reference_starts_at_zero(data, tmp_path, lora):
    """beta > 0: the reference is a frozen copy (full fine-tuning) or the LoRA-disabled base; both equal the policy
    before the first update, so the first KL is exactly 0, and it grows once the policy moves."""
    kw = dict(max_steps=3, save_steps=3, learning_rate=3e-2 if lora else 1e-2, algo_config__beta=0.1)
    if lora:
        kw.update(lora__rank=4, lora__alpha=8)
    train_rl.main(rl_args(data, tmp_path, **kw))
    kls = [h["kl"] for h in history(tmp_path, 3) if "loss" in h]
    assert kls[0] == 0.0 and kls[-1] > 0.0
    if lora:
        assert set(weights(tmp_path / "merged")) == set(weights("tiny:llada"))


def run_script(*flags):
    return subprocess.run([sys.executable, "train_rl.py", *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_unknown_algorithm_lists_the_registered_ones():
    result = run_script("--algo", "nope")
    assert result.returncode == 2 and result.stderr.startswith("error: Unknown algorithm 'nope'; registered: ")
    assert "d1" in result.stderr.splitlines()[0]


def test_help_lists_the_algorithm_knobs():
    result = run_script("--algo", "d1", "--help")
    assert result.returncode == 0
    for flag in ("--algo-config.p-prompt", "--algo-config.num-iterations", "--rollout.temperature", "--rewards"):
        assert flag in result.stdout, flag
    for flag in ("--algo-config.advantage {drgrpo,grpo,rloo}", "--algo-config.kl-to {reference,rollout}",
                 "--rollout.cache {none,prefix,dual,block}|None", "--algo-config.dynamic-sampling.mode {off,pad,"):
        assert flag in result.stdout, flag  # the enumerated knobs show their choices


def declared_flags(full: str) -> str:
    """The flag column of tyro's ``--help-full``: every box's cells, as tyro prints boxes side by side on a wide
    terminal."""
    return "\n".join(cell[1:].split("  ")[0] for line in full.splitlines() for cell in line.split("│")
                     if cell.startswith(" --"))


@pytest.mark.parametrize("argv", [["train_rl.py", "--algo", "cj-grpo"], ["train_rl.py", "--algo", "vrpo"],
                                  ["train_sft.py"], ["evaluate.py"]], ids=lambda a: " ".join(a))
def test_help_is_grouped_short_and_loses_no_flag(argv):
    """--help: one line per flag under themed titles, the algorithm's knobs first, under 200 lines; every flag of
    --help-full (tyro's whole help) is there, and no field is left to an "other" group."""
    import re
    short, full = (subprocess.run([sys.executable, *argv, flag], cwd=ROOT, capture_output=True, text=True, timeout=300,
                                  env={**os.environ, "COLUMNS": "120"}).stdout for flag in ("--help", "--help-full"))
    lines = short.splitlines()
    print(f"{' '.join(argv)} --help: {len(lines)} lines (--help-full {len(full.splitlines())})")
    assert len(lines) <= 200 and max(map(len, lines)) <= 200
    flags = lambda text: {f.replace("--no-", "--").replace(".no-", ".")  # a switch's negation: the same flag
                          for f in re.findall(r"(?<![\w-])--[a-z][\w.-]*[a-z0-9]", text)}
    declared = declared_flags(full)
    assert flags(declared) - {"--help"} <= flags(short), flags(declared) - flags(short)
    assert "\nother:" not in short
    if "train_rl.py" in argv:
        first = next(line for line in lines if line.startswith("  --"))
        assert first.startswith("  --algo {") and lines[lines.index(first) + 1].startswith("  --algo-config.")


@pytest.mark.parametrize("argv", [["train_rl.py", "--algo", "cj-grpo"], ["train_rl.py", "--algo", "vrpo"],
                                  ["train_sft.py"], ["evaluate.py"]], ids=lambda a: " ".join(a))
def test_unknown_flags_are_refused_in_one_line_and_known_ones_pass(argv):
    """The flag check before tyro knows exactly tyro's flags (--help-full's, negations and aliases included), so it
    refuses no real flag and lets no typo reach tyro's box; a typo gets one line naming the nearest flag."""
    import re

    import evaluate
    import train_sft
    from dare.config import flag_names
    full = subprocess.run([sys.executable, *argv, "--help-full"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200"}).stdout
    declared = declared_flags(full)
    tyro_flags = {f[2:] for f in re.findall(r"(?<![\w-])--[a-z][\w.-]*[a-z0-9]", declared)} - {"help"}
    args = (train_rl.args_class(argv[2])() if argv[0] == "train_rl.py" else
            train_sft.Args() if argv[0] == "train_sft.py" else evaluate.Args())
    ours = flag_names(args, prefixes=argv[0] != "evaluate.py")
    assert tyro_flags == ours, (tyro_flags - ours, ours - tyro_flags)
    typo = {"train_rl.py": ("--lr", "--learning-rate"), "train_sft.py": ("--max_step", "--max-steps"),
            "evaluate.py": ("--limt", "--limit")}[argv[0]]
    result = subprocess.run([sys.executable, *argv, typo[0], "1"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2 and "╭" not in result.stderr, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"error: unknown flag {typo[0].replace('_', '-')} (did you mean {typo[1]}"), first


def test_clear_errors_for_bad_input(data, tmp_path):
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        train_rl.main(rl_args(data, tmp_path, rewards=["nope"]))
    with pytest.raises(ValueError, match=r"data source\(s\) \['addition'\] have no reward"):
        train_rl.main(rl_args(data, tmp_path, rewards=["gsm8k=gsm8k"]))
    rows = [json.loads(line) for line in Path(data[0]).read_text().splitlines()]
    rows[3]["reward_model"]["ground_truth"] = ""
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"row 3: no ground truth \(column 'reward_model.ground_truth'\)"):
        train_rl.main(rl_args((str(bad), None), tmp_path, data__strict=True))
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size"):
        train_rl.main(rl_args(data, tmp_path, micro_batch_size=3))
    with pytest.raises(ValueError, match="must be a multiple of num_iterations"):
        train_rl.main(rl_args(data, tmp_path, save_steps=3, algo_config__num_iterations=2))
    with pytest.raises(ValueError, match="'question' not found"):
        train_rl.main(rl_args(data, tmp_path, data__prompt_key="question"))
    with pytest.raises(ValueError, match="no prompt fits data.max_prompt_length=5"):
        train_rl.main(rl_args(data, tmp_path, data__max_prompt_length=5))


def test_unscorable_rows_are_dropped_with_their_count_and_reason(data, tmp_path, capsys):  # noqa: F811
    """Rows no reward can score (an empty or missing answer; code tests that do not parse or have no known format)
    are dropped at load with a count per file and reason, not silently and not fatally; data.strict refuses them."""
    from dare.data.rl import RLDataConfig, prompt_rows
    rows = [json.loads(line) for line in Path(data[0]).read_text().splitlines()][:6]
    rows[1]["reward_model"]["ground_truth"] = None
    rows[2]["reward_model"]["ground_truth"] = "  "
    code = {"prompt": [{"role": "user", "content": "def add(a, b):\n    \"\"\"Add.\"\"\""}], "data_source": "humaneval",
            "extra_info": {"task": "code"}}
    rows += [{**code, "reward_model": {"ground_truth": "def check(candidate):\n    assert candidate(1, 2) == 3\n"}},
             {**code, "reward_model": {"ground_truth": "def check(candidate):\n    assert candidate(1, 2 == 3\n"}},
             {**code, "reward_model": {"ground_truth": "print('no tests here')"}}]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept = prompt_rows(str(mixed), "train", RLDataConfig())
    assert len(kept) == 5 and kept[-1]["data_source"] == "humaneval"
    assert capsys.readouterr().out == (
        f"{mixed}: dropped 4 of 9 rows the reward cannot score: 2 no ground truth (rows 1, 2); 1 tests do not parse "
        "('(' was never closed) (rows 7); 1 tests of no known format (rows 8)\n")
    with pytest.raises(ValueError, match=r"mixed.jsonl, row 1: no ground truth"):
        prompt_rows(str(mixed), "train", RLDataConfig(strict=True))


def test_mini_batches_split_a_rollout_into_optimiser_steps(data, tmp_path):  # noqa: F811
    """mini_batches=2: one rollout, two optimiser steps on its halves (the second off-policy: ratio != 1, old
    log-probs from the rollout policy); the result does not depend on the micro-batch size."""
    for name, micro in (("four", 4), ("two", 2)):
        train_rl.main(rl_args(data, tmp_path / name, micro_batch_size=micro, optim="sgd", learning_rate=1.0,
                              algo_config__mini_batches=2, algo_config__beta=0.0))
    steps = [h for h in history(tmp_path / "four", 2) if "loss" in h]
    assert len(steps) == 2 and "reward" in steps[0] and "reward" not in steps[1]  # one rollout for both steps
    assert steps[0]["ratio"] == 1.0 and steps[1]["ratio"] != 1.0
    four, two = weights(tmp_path / "four" / "checkpoint-2"), weights(tmp_path / "two" / "checkpoint-2")
    assert max((four[k] - two[k]).abs().max().item() for k in four) < 1e-6
    with pytest.raises(ValueError, match="mini_batches=3"):
        train_rl.main(rl_args(data, tmp_path / "bad", algo_config__mini_batches=3))


if "test_even_only" not in REWARDS:
    @reward("test_even_only")
    def _even_only_reward(completion, ground_truth, extra_info=None):
        """A spread of rewards on prompts whose answer is even, none on the others (every completion scores 0)."""
        score = (len(completion) % 7) / 6 if int(ground_truth) % 2 == 0 else 0.0
        return RewardResult(score, float(score > 0.5))


if "test_length_wrong" not in REWARDS:
    @reward("test_length_wrong")
    def _length_wrong(completion, ground_truth, extra_info=None):
        """Scores that differ within a group, and every answer wrong (accuracy 0)."""
        return RewardResult((len(completion) % 7) / 6, 0.0)


def test_signal_groups_keep_the_groups_with_a_signal_first():
    from dare.algos.base import DynamicSampling
    from dare.trainers.rl import signal_groups
    scores = torch.tensor([1.0, 1, 0, 1, 0, 0, 1, 0])  # groups of 2: flat, spread, flat, spread
    spread = DynamicSampling(mode="pad").signal(scores, scores, 2).tolist()
    assert spread == [False, True, False, True]
    assert signal_groups(spread, 2) == ([1, 3], 0)
    assert signal_groups(spread, 3) == ([0, 1, 3], 1)
    assert signal_groups([False] * 3, 2) == ([0, 1], 2)
    # TraceRL's accuracy band, both ends kept: groups of 5 at accuracy 0, 0.2, 0.6, 0.8, 1
    accuracy = torch.tensor([0.0] * 5 + [1, 0, 0, 0, 0] + [1, 1, 1, 0, 0] + [1, 1, 1, 1, 0] + [1.0] * 5)
    band = DynamicSampling(mode="drop", keep="accuracy", low=0.2, high=0.8)
    assert band.signal(torch.zeros(25), accuracy, 5).tolist() == [False, True, True, True, False]
    mixed = DynamicSampling(mode="resample", keep="mixed")  # DiRL's: some right, some wrong
    assert mixed.signal(torch.zeros(25), accuracy, 5).tolist() == [False, True, True, True, False]
    assert mixed.signal(torch.zeros(10), torch.tensor([0.0] * 5 + [1, 1, 1, 1, 0.5]), 5).tolist() == [False, True]


def trained_prompts(folder):
    return [json.loads(line) for line in (Path(folder) / "completions.jsonl").read_text().splitlines()]


def test_dynamic_sampling_trains_on_the_groups_with_a_signal(data, tmp_path):
    """pad: one extra draw of 1.5 x the prompts, decoded with the step's own; resample (DiRL's): new rounds until the
    step holds its prompts' worth of groups with a signal; both then train on those first."""
    pad = rl_args(data, tmp_path / "pad", rewards=["test_even_only"], max_steps=1, save_steps=1, log_completions=8,
                  algo_config__dynamic_sampling__mode="pad", algo_config__dynamic_sampling__extra=1.5)
    train_rl.main(pad)
    logged, rows = history(tmp_path / "pad", 1)[0], trained_prompts(tmp_path / "pad")
    assert len(rows) == 8  # 2 prompts x 4 completions trained, from 2 + 3 rolled out
    odd = {r["prompt"] for r in rows if int(r["ground_truth"]) % 2}
    assert logged["rollout/groups_without_signal"] == len(odd) and logged["rollout/dynamic_rounds"] == 0
    resample = rl_args(data, tmp_path / "resample", rewards=["test_even_only"], max_steps=2, save_steps=2,
                       log_completions=8, algo_config__dynamic_sampling__mode="resample",
                       algo_config__dynamic_sampling__extra=0.5)
    train_rl.main(resample)
    logged = [h for h in history(tmp_path / "resample", 2) if "loss" in h]
    rows = trained_prompts(tmp_path / "resample")
    assert len(rows) == 16 and all(int(r["ground_truth"]) % 2 == 0 for r in rows), rows  # every group has a signal
    assert all(h["rollout/groups_without_signal"] == 0 for h in logged)
    assert sum(h["rollout/dynamic_rounds"] for h in logged) > 0, "a step drew an odd prompt and decoded again"
    # no group can have a signal: the rounds run out and flat groups fill the step
    flat = rl_args(data, tmp_path / "flat", rewards=["test_length:0"], max_steps=1, save_steps=1,
                   algo_config__dynamic_sampling__mode="resample", algo_config__dynamic_sampling__rounds=2)
    train_rl.main(flat)
    logged = history(tmp_path / "flat", 1)[0]
    assert logged["rollout/dynamic_rounds"] == 2 and logged["rollout/groups_without_signal"] == 2
    args = rl_args(data, tmp_path / "tree", algo="d-treerpo", algo_config__dynamic_sampling__mode="pad")
    with pytest.raises(ValueError, match="dynamic sampling cannot drop d-treerpo's groups one by one: its rollout"):
        train_rl.main(args)
    with pytest.raises(ValueError, match="mode drop .+dmpo weighs its rows itself"):
        train_rl.main(rl_args(data, tmp_path / "dmpo", algo="dmpo", algo_config__dynamic_sampling__mode="drop"))
    with pytest.raises(ValueError, match="Unknown dynamic_sampling.mode 'refill'"):
        train_rl.main(rl_args(data, tmp_path / "bad", algo_config__dynamic_sampling__mode="refill"))


def test_dropped_groups_leave_the_loss(data, tmp_path):
    """TraceRL's filter: groups whose accuracy is outside [0.2, 0.8] leave the loss with no refill. Every answer here
    is wrong (accuracy 0) while the scores differ: dropped, the step moves nothing; kept, it moves the weights."""
    start = weights("tiny:llada")
    for mode in ("drop", "off"):
        train_rl.main(rl_args(data, tmp_path / mode, rewards=["test_length_wrong"], max_steps=1, save_steps=1,
                              optim="sgd", learning_rate=1.0, weight_decay=0.0,
                              algo_config__dynamic_sampling__mode=mode, algo_config__dynamic_sampling__keep="accuracy"))
    moved = {mode: max((weights(tmp_path / mode)[k] - start[k]).abs().max().item() for k in start)
             for mode in ("drop", "off")}
    assert moved["drop"] == 0.0 and moved["off"] > 1e-5, moved
    assert history(tmp_path / "drop", 1)[0]["rollout/groups_dropped"] == 2


def test_a_truncated_completion_scores_zero(data, tmp_path):
    """--truncated-is-wrong (TraceRL's and DiRL's rule): a completion that never stops scores 0, whatever it holds."""
    for flag in (True, False):
        train_rl.main(rl_args(data, tmp_path / str(flag), max_steps=1, save_steps=1, truncated_is_wrong=flag,
                              rollout__stop_at_eos=False, algo_config__loss_mask="all"))
    cut, kept = (history(tmp_path / str(flag), 1)[0] for flag in (True, False))
    assert cut["completion_unfinished"] == kept["completion_unfinished"] > 0.5  # the same rollout
    assert kept["reward"] > 0 and cut["reward"] <= kept["reward"] * (1 - cut["completion_unfinished"]) + 1e-9
    assert cut["reward"] < kept["reward"]


def test_the_kl_to_the_rollout_policy_needs_no_reference():
    """kl_to rollout (TraceRL's code): the KL is measured to the log-probs of the policy that decoded the batch, so no
    reference model is kept; on an on-policy pass it is exactly 0."""
    from dare.algos import get_algorithm
    algo = get_algorithm("d1")(beta=0.1, kl_to="rollout")
    assert not algo.needs_reference and get_algorithm("d1")(beta=0.1).needs_reference
    logp, old = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    loss, stats = algo.surrogate(logp, old, torch.tensor([1.0]), None)
    d = logp - old
    assert torch.allclose(stats["kl"], torch.exp(-d) + d - 1)
    _, on_policy = algo.surrogate(logp, logp, torch.tensor([1.0]), None)
    assert on_policy["kl"].abs().max() == 0
    with pytest.raises(ValueError, match="kl_to rollout .+wd1 scores none"):
        family = type("F", (), {"noise": "mask", "name": "llada", "causal_block": None})()
        get_algorithm("wd1")(kl_to="rollout").validate(family)


def test_rollout_rows_can_be_selected():
    from dare.engines import HFEngine
    from dare.models import Family, tiny
    from dare.sampling import SamplingConfig
    model, tok = tiny("sdar")
    rollout = HFEngine(model, tok, Family.from_pretrained(model.config, tok)).generate(
        ["a", "b c"], 2, SamplingConfig(gen_length=8, temperature=1.0, record_states=True), 0)
    same = rollout.select([0, 1, 2, 3])
    assert torch.equal(same.completion_ids, rollout.completion_ids) and same.texts == rollout.texts
    part = rollout.select([3, 2])
    assert part.texts == rollout.texts[3:1:-1] and torch.equal(part.replay_ids, rollout.replay_ids[[3, 2]])
    assert all(torch.equal(a, b[[3, 2]]) for a, b in zip(part.states, rollout.states, strict=True))


@pytest.mark.parametrize("name", ["llada", "sdar"])
def test_rollouts_of_several_rounds_join_row_by_row(name):
    """Resampling's rounds joined: each row as its own round had it (prompts left-padded to the widest, completion
    sides right-padded as never decoded), so the replay and the likelihoods of a row do not change."""
    from dare.engines import HFEngine
    from dare.engines.base import Rollout
    from dare.likelihood import decoding_path, rollout_attention
    from dare.models import Family, tiny
    from dare.sampling import SamplingConfig
    model, tok = tiny(name)
    fam = Family.from_pretrained(model.config, tok)
    engine = HFEngine(model, tok, fam)
    config = SamplingConfig(gen_length=8, temperature=1.0, record_entropy=True)
    first = engine.generate(["a"], 2, config, 0)
    second = engine.generate(["b c d e f", "g"], 1, config, 1)
    both = Rollout.join([first, second], fam.pad_id)
    assert both.texts == first.texts + second.texts and both.nfe == first.nfe + second.nfe
    for i, (part, row) in enumerate([(first, 0), (first, 1), (second, 0), (second, 1)]):
        width = part.prompt_ids.shape[1]
        assert torch.equal(both.prompt_ids[i, -width:], part.prompt_ids[row])
        assert not both.prompt_mask[i, :-width].any()
        ids, steps, _ = decoding_path(fam, both.select([i]))
        own_ids, own_steps, _ = decoding_path(fam, part.select([row]))
        assert torch.equal(ids[0, :own_ids.shape[1]], own_ids[0]) and (steps[0, own_ids.shape[1]:] == -1).all()
        assert torch.equal(steps[0, :own_steps.shape[1]], own_steps[0])
        attended = rollout_attention(fam, both.prompt_mask[i:i + 1], both.completion_mask[i:i + 1]).sum()
        assert attended == rollout_attention(fam, part.prompt_mask[row:row + 1],
                                             part.completion_mask[row:row + 1]).sum()
    assert both.entropy is not None and both.entropy.shape[0] == 4
    with pytest.raises(ValueError, match="cannot be joined"):
        Rollout.join([engine.generate(["a"], 1, SamplingConfig(gen_length=8, record_states=True), 0)] * 2, fam.pad_id)


def test_a_rollouts_rewards_are_scored_once_per_prompt_and_text():
    """IGPO scores mid-rollout and the trainer scores the rollout it returns: each (prompt, text) once."""
    from types import SimpleNamespace

    from dare.trainers.rl import DiffusionRLTrainer
    seen = []

    class Counting:
        def score(self, texts, rows, workers):
            seen.extend(texts)
            return [RewardResult(float(len(t)), 0.0) for t in texts]
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    expanded = [r for r in rows for _ in range(2)]
    score = DiffusionRLTrainer._scorer(SimpleNamespace(rewards=Counting(), reward_workers=1), expanded, 2)
    assert [r.score for r in score(["x", "yy"], [0, 3])] == [1.0, 2.0]
    assert [r.score for r in score(["x", "x", "zzz", "yy"], range(4))] == [1.0, 1.0, 3.0, 2.0]
    assert seen == ["x", "yy", "zzz"], "prompt 0's x and prompt 1's yy were known"
    score(["x"], [2])
    assert seen[-1] == "x", "the same text of another prompt is scored against that prompt"
