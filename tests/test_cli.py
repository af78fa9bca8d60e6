"""The scripts as a person meets them: recipe values converted to their declared types (or refused naming the key),
user errors as one ``error:`` line with exit status 2 (``--debug`` keeps the traceback), and every sampling, data and
length check made before the weights load (shown with model folders whose weights file is missing)."""

import json
import os
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from conftest import ROOT
from test_scale_out import free_port
from test_train_rl import rl_args

import train_rl
import train_sft
from dare.config import parse
from dare.data.tasks import write_task
from dare.models import save_tiny


def recipe(tmp_path, text):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return ["--config", str(path)]


def test_recipe_values_take_their_declared_types(tmp_path):
    args = parse(train_rl.args_class("d1"), recipe(tmp_path, "learning_rate: 1e-5\nmax_steps: '4'\nrollout:\n"
                                                             "  gen_length: 1e2\n  threshold: 1\nrewards: [auto]\n"))
    assert (args.learning_rate, args.max_steps, args.rollout.gen_length, args.rollout.threshold) == (1e-5, 4, 100, 1.0)
    assert type(args.learning_rate) is float and type(args.rollout.gen_length) is int
    for text, message in [("learning_rate: fast", "learning_rate: expected float, got 'fast'"),
                          ("rollout:\n  gen_length: 16.5", r"rollout.gen_length: expected int, got 16.5"),
                          ("rollout: 5", "'rollout' is a section"),
                          ("bf16: 'yes'", "bf16: expected bool"),
                          ("rewards: auto", "rewards: expected a list")]:
        with pytest.raises(ValueError, match=message):
            parse(train_rl.args_class("d1"), recipe(tmp_path, text))


def script(*argv, env=None):
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, **(env or {})})


def test_user_errors_are_one_line_with_exit_status_2(tmp_path):
    out = script("train_rl.py", "--algo", "nope")
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("error: Unknown algorithm 'nope'; registered: "), out.stderr
    traceback_file = out.stderr.split("(traceback in ")[1].split(";")[0]
    with open(traceback_file) as f:
        assert "Traceback" in f.read()
    again = script("train_rl.py", "--algo", "nope2")
    assert f"(traceback in {traceback_file};" in again.stderr, "one traceback file per user, overwritten"
    assert "nope2" in Path(traceback_file).read_text()
    out = script("train_sft.py", "--data.path", str(tmp_path / "missing.jsonl"), "--debug")
    assert out.returncode == 1 and "Traceback" in out.stderr and "Dataset file not found" in out.stderr
    out = script("evaluate.py", "--model", "tiny:llada", "--gen-length", "-16", "--prompt", "hi",
                 env={"DARE_DEBUG": "0"})
    assert out.returncode == 2 and out.stderr.startswith("error: sampling: gen_length must be positive, got -16")


def test_an_argument_error_under_a_two_process_launch_is_printed_once():
    env = {"ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                          "--main_process_port", str(free_port()), "train_rl.py", "--algo", "nope"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, **env})
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("error: ")]
    assert out.returncode != 0 and len(lines) == 1, out.stdout + out.stderr
    assert lines[0].startswith("error: Unknown algorithm 'nope'; registered: ")
    assert "(exitcode: 2)" in out.stderr, out.stderr[-2000:]


def test_a_rank_other_than_0_waits_for_the_launcher_then_prints_its_own_error(monkeypatch, capsys):
    """Before the processes join, rank 1 leaves the printing to rank 0 (the launcher stops rank 1 once rank 0 has
    left); an error rank 0 never meets is printed by rank 1 itself after the wait."""
    import dare.config

    monkeypatch.setattr(dare.config, "RANK_WAIT_S", 0.3)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    began = time.perf_counter()
    with pytest.raises(SystemExit) as exit_:
        dare.config.run(lambda args: (_ for _ in ()).throw(ValueError("only rank 1 lacks its shard")), lambda: None)
    assert exit_.value.code == 2 and time.perf_counter() - began >= 0.3
    assert capsys.readouterr().err.startswith("error: rank 1: only rank 1 lacks its shard\n")


@pytest.fixture(scope="module")
def weightless(tmp_path_factory):
    """Model folders with config and tokenizer but no weights: a check made after the weights load cannot pass."""
    folders = {}
    for family in ("llada", "sdar"):
        folder = tmp_path_factory.mktemp(family)
        save_tiny(family, folder)
        (folder / "model.safetensors").unlink()
        folders[family] = str(folder)
    return folders


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rl-data")
    return (write_task("addition", str(folder / "train.jsonl"), 16, 0, "train"),
            write_task("addition", str(folder / "test.jsonl"), 4, 0, "test"))


def test_rl_checks_run_before_the_weights_load(weightless, data, tmp_path):
    def run(**kw):
        train_rl.main(rl_args(data, tmp_path, model=weightless["llada"], **kw))

    with pytest.raises(ValueError, match="rollout: gen_length must be positive, got -16"):
        run(rollout__gen_length=-16)
    with pytest.raises(ValueError, match="validation: gen_length 12 is not divisible by block_length 8"):
        run(validation__gen_length=12, validation__block_length=8)
    with pytest.raises(ValueError, match="rollout: Unknown threshold_rule 'sometimes'"):
        run(rollout__threshold_rule="sometimes")
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size"):
        run(micro_batch_size=3)
    with pytest.raises(ValueError, match="unknown reward 'nope'"):
        run(rewards=["nope"])
    long = tmp_path / "long.jsonl"  # one 3,000-word prompt, on a model built for 1,024 positions
    long.write_text(json.dumps({"prompt": [{"role": "user", "content": "count " * 3000}], "data_source": "x",
                                "reward_model": {"ground_truth": "1"}}) + "\n")
    with pytest.raises(ValueError, match=r"rollout: a \d+-token prompt \+ gen_length 8 needs \d+ positions, more "
                                         r"than the model's 1024"):
        run(data__path=str(long), data__eval_path=None, data__max_prompt_length=10 ** 5)
    with pytest.raises(OSError, match="model.safetensors|no file named"):  # every check passed: the weights load
        run()


def test_block_length_that_does_not_divide_gen_length_warns_before_the_weights_load(weightless, data, tmp_path):
    with pytest.warns(UserWarning, match="gen_length 30 is not a multiple of sdar's block size 4: the last block is "
                                         "decoded whole"), pytest.raises(OSError):
        train_rl.main(rl_args(data, tmp_path, model=weightless["sdar"], rollout__gen_length=30))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(OSError):
            train_rl.main(rl_args(data, tmp_path, model=weightless["sdar"], rollout__gen_length=32))


def test_sft_reads_and_checks_its_data_before_the_weights_load(weightless, tmp_path):
    args = train_sft.Args(model=weightless["llada"], output_dir=str(tmp_path / "out"), max_steps=1)
    args.data.path = str(tmp_path / "missing.jsonl")
    with pytest.raises(FileNotFoundError, match="Dataset file not found"):
        train_sft.main(args)
    args.data.path = write_task("addition", str(tmp_path / "sft.jsonl"), 8)
    args.data.prompt_key, args.data.response_key = "question", "extra_info.solution"
    with pytest.raises(KeyError, match="'question' not found"):
        train_sft.main(args)
    args.data.prompt_key, args.data.response_key, args.data.max_length = "prompt", "extra_info.solution", 4096
    with pytest.raises(ValueError, match="data.max_length 4096 is more than the model's 1024 positions"):
        train_sft.main(args)



@pytest.mark.parametrize("knob, value, message", [
    ("steps", 0, "steps must be >= 1, got 0"), ("steps", -4, "steps must be >= 1, got -4"),
    ("top_p", 1.5, "top_p must be > 0 and <= 1, got 1.5"), ("top_k", 0, "top_k must be >= 1, got 0"),
    ("block_length", -8, "block_length must be >= 1, got -8"), ("threshold", -0.1, "threshold must be >= 0, got -0.1"),
    ("factor", 0.0, "factor must be > 0, got 0.0"), ("cfg_scale", -1.0, "cfg_scale must be >= 0, got -1.0"),
    ("temperature", float("nan"), "temperature must be >= 0, got nan"), ("top_p", float("nan"), "top_p must be > 0")])
def test_out_of_range_knobs_are_refused_before_the_weights_load(weightless, data, tmp_path, knob, value, message):
    """A decoding knob outside its range (accepted before: --steps 0 or -4 decoded nothing, --top-p 1.5 sampled as
    1) is one error naming it, before the weights load, in every script."""
    with pytest.raises(ValueError, match=f"rollout: {message}"):
        train_rl.main(rl_args(data, tmp_path, model=weightless["llada"], **{f"rollout__{knob}": value}))
    import evaluate
    with pytest.raises(ValueError, match=f"sampling: {message}"):
        evaluate.main(parse(evaluate.Args, ["--model", weightless["llada"], "--prompt", "hi",
                                            f"--{knob.replace('_', '-')}", str(value)],
                            config=(evaluate.tyro.conf.OmitArgPrefixes,)))


@pytest.mark.parametrize("knob, value, message", [
    ("prompts_per_step", 0, "--prompts-per-step must be at least 1, got 0"),
    ("num_generations", 0, "--num-generations must be at least 2"), ("num_generations", 1, "--num-generations must"),
    ("micro_batch_size", 0, "--micro-batch-size must be at least 1"), ("save_steps", 0, "--save-steps must")])
def test_batch_counts_out_of_range_are_refused_before_anything_loads(weightless, data, tmp_path, knob, value, message):
    """--num-generations 0 was a ZeroDivisionError traceback inside transformers, --prompts-per-step 0 a message
    about a batch_size no flag has."""
    with pytest.raises(ValueError, match=message):
        train_rl.main(rl_args(data, tmp_path, model=weightless["llada"], **{knob: value}))
    assert not (tmp_path / "checkpoint-1").exists()


@pytest.mark.parametrize("knob, value", [("rank", -4), ("alpha", 0), ("dropout", 1.0)])
def test_lora_knobs_out_of_range_are_refused(weightless, data, tmp_path, knob, value):
    """--lora.rank -4 trained every weight without a word (rank <= 0 meant full fine-tuning); now an error."""
    with pytest.raises(ValueError, match=f"lora needs rank >= 0 .* got rank=.*{knob}={value}|lora needs .*{knob}="):
        train_rl.main(rl_args(data, tmp_path, model=weightless["llada"], **{f"lora__{knob}": value}))
    args = train_sft.Args(model=weightless["llada"], output_dir=str(tmp_path / "sft"), max_steps=1)
    setattr(args.lora, knob, value)
    with pytest.raises(ValueError, match="lora needs rank >= 0"):
        train_sft.main(args)


HEAVY = ("transformers", "datasets", "peft", "trl", "accelerate", "deepspeed")

PROBE = """
import runpy, sys, time
start = time.perf_counter()
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
print("\\n%.2f" % (time.perf_counter() - start), sorted(m for m in HEAVY if m in sys.modules), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [["train_sft.py"], ["train_rl.py", "--algo", "cj-grpo"],
                                  ["train_rl.py", "--algo", "vrpo"], ["evaluate.py"]], ids=lambda a: " ".join(a))
def test_help_answers_without_loading_the_training_stack(argv):
    """--help imports only what the flags need (torch, the config dataclasses): transformers, datasets and peft
    alone take 4-8 s to import, the help itself about 1.3 s on 2 free cores."""
    out = script("-c", PROBE.replace("HEAVY", repr(HEAVY)), *argv, "--help")
    seconds, loaded = out.stderr.strip().splitlines()[-1].split(" ", 1)
    print(f"{' '.join(argv)} --help: {seconds} s")
    assert out.returncode == 0 and "--config FILE" in out.stdout, out.stderr
    assert loaded == "[]", f"--help imported {loaded}"


@pytest.mark.parametrize("argv, message", [
    (["--model", "tiny:llada", "--prompt", "hi", "--bench", "gsm8k"], "--prompt (one answer) and --bench"),
    (["--model", "tiny:llada", "--compare", "a.json"], "--compare reads finished reports"),
    (["--model", "tiny:llada", "--prompt", "hi", "--plot", "x.png"], "--plot draws a --compare chart"),
    (["--model", "tiny:llada", "--bench", "humaneval", "--pass-k", "1", "4"], "--pass-k 4 needs at least"),
    (["--model", "tiny:llada", "--bench", "task:addition", "--limit", "-2"], "--limit must be at least 1"),
    (["--model", "tiny:llada", "--bench", "task:addition", "--samples", "0"], "--samples must be at least 1"),
    (["--model", "tiny:llada:n_layers=abc", "--prompt", "hi"], "'tiny:llada:n_layers=abc': n_layers='abc' is not an"),
    (["--model", "tiny:llada:n_layers=-1", "--prompt", "hi"], "'tiny:llada:n_layers=-1': n_layers=-1 must be at"),
    (["--model", "/nonexistent/model", "--prompt", "hi"], "model folder /nonexistent/model does not exist"),
    (["--model", "tiny:llada", "--prompt", "\udcff"], "--prompt is not valid UTF-8"),
])
def test_evaluate_refuses_contradictions_and_bad_values_in_one_line(argv, message):
    out = subprocess.run([sys.executable, "evaluate.py", *argv], capture_output=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "DARE_DEBUG": "0"})
    stderr = out.stderr.decode("utf-8", "replace")
    assert out.returncode == 2 and stderr.startswith(f"error: {message}"), stderr[-500:]


def test_damaged_or_foreign_data_files_are_named(tmp_path):
    import pandas as pd

    from dare.data.loading import load_rows
    pd.DataFrame({"q": [], "a": []}).to_parquet(tmp_path / "empty.parquet")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not a parquet file")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"q": "a", "a": "b"}\n{"q": "\xe9t\xe9", "a": "b"}\n')
    for name, message in (("empty.parquet", "is empty"), ("broken.parquet", "broken.parquet is not a readable parquet"),
                          ("latin1.jsonl", "latin1.jsonl:2 is not UTF-8 text")):
        with pytest.raises(ValueError, match=message):
            load_rows(str(tmp_path / name))
    (tmp_path / "bad.yaml").write_text("model: [tiny:llada\nmax_steps: 2\n")
    out = script("train_sft.py", "--config", str(tmp_path / "bad.yaml"))
    assert out.returncode == 2 and out.stderr.startswith(f"error: {tmp_path / 'bad.yaml'}:2 is not valid YAML")


def test_a_reward_that_cannot_score_the_rows_is_refused(data, tmp_path):
    args = rl_args(data, tmp_path, rewards=["code"])
    with pytest.raises(ValueError, match="reward 'code' cannot score the 'addition' rows: tests of no known format"):
        train_rl.main(args)
    assert not (tmp_path / "checkpoint-2").exists()


def test_bf16_on_a_machine_without_it_trains_in_fp32_with_a_note(capsys):
    import torch

    from dare.trainers.distributed import mixed_precision
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        pytest.skip("this machine runs bf16")
    assert mixed_precision(True) is False and "training in fp32" in capsys.readouterr().err
    assert mixed_precision(False) is False


def test_a_benchmark_prompt_too_long_for_the_model_fails_before_anything_decodes(tmp_path):
    # addition's prompts (30 tokens) + 8 fit the 38 positions, arithmetic's (31) do not: nothing decodes first
    out = script("evaluate.py", "--model", "tiny:llada:max_sequence_length=38", "--bench",
                 "task:addition,task:arithmetic", "--limit", "2", "--gen-length", "8", "--output-dir", str(tmp_path),
                 env={"DARE_DEBUG": "0"})
    assert out.returncode == 2 and out.stderr.startswith("error: task:arithmetic: a 31-token prompt"), out.stderr[-800:]
    assert not list(tmp_path.glob("samples.*.jsonl"))


def test_an_unreachable_hub_loads_cached_names_at_once_and_names_missing_ones(tmp_path):
    """A closed port as the hub: a name in the cache loads without the hub's retries, one not cached fails in one
    line naming it (the retries took ~30 s before the offline message, which named nothing)."""
    snapshot = tmp_path / "hub" / "models--org--cached" / "snapshots" / ("0" * 40)
    save_tiny("llada", snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": f"http://127.0.0.1:{closed}", "DARE_DEBUG": "0"}
    env.update(HF_HUB_OFFLINE="0", TRANSFORMERS_OFFLINE="0")  # the probe decides, not the caller's setting
    said = []
    out = script("evaluate.py", "--model", "org/cached", "--prompt", "hi", "--gen-length", "8", env=env)
    said.append(out.stderr)
    assert out.returncode == 0 and "loading from the local cache only" in out.stderr, out.stderr[-800:]
    out = script("evaluate.py", "--model", "org/absent", "--prompt", "hi", env=env)
    said.append(out.stderr)
    assert out.returncode == 2 and out.stderr.splitlines()[1].startswith(
        "error: model org/absent: not in the local hub cache"), out.stderr[-800:]
    out = script("train_sft.py", "--model", "org/cached", "--data.path", "org/nodata", env=env)
    assert out.returncode == 2 and "error: dataset org/nodata: not in the local hub cache" in out.stderr, out.stderr
    said.append(out.stderr)
    assert not any("Retry" in text for text in said), "the hub libraries' retries (5 per file) never start"


def test_a_model_folder_without_tokenizer_files_is_one_line(tmp_path):
    """transformers' five-line message guessed at missing packages; the folder (like ../shared's config-only copies
    of the official models) simply has no tokenizer files."""
    save_tiny("llada", tmp_path)
    for f in tmp_path.iterdir():
        if f.name.startswith("tokenizer") and f.name != "tokenizer_config.json":
            f.unlink()
    out = script("evaluate.py", "--model", str(tmp_path), "--prompt", "hi", env={"DARE_DEBUG": "0"})
    assert out.returncode == 2 and out.stderr.startswith(f"error: {tmp_path}: its tokenizer cannot be loaded ("), \
        out.stderr[-600:]
    assert out.stderr.splitlines()[1].startswith("(traceback in "), "one line"


@pytest.mark.parametrize("flag, value, message", [
    ("max_steps", 0, r"--max-steps must be at least 1 \(or -1: train --num-train-epochs\), got 0"),
    ("max_steps", -5, "--max-steps must be at least 1 .+got -5"),
    ("gradient_accumulation_steps", 0, "--gradient-accumulation-steps must be at least 1, got 0"),
    ("dtype", "float64", "--dtype float64: DARE trains in float32 .+ or bfloat16"),
    ("dtype", "fp16", "--dtype fp16: fp16 weights overflow"),
    ("dtype", "half", r"--dtype 'half' is not one of \['bf16', 'bfloat16', 'float32', 'fp32'\]"),
    ("resume_must", True, "--resume-must says what --resume does .+add --resume"),
    ("attn_implementation", "flash_attention_2", "flash_attention_2 needs the flash-attn package"),
    ("report_to", "wandb", "--report-to wandb: the wandb package is not installed"),
    ("report_to", "mlflow", r"--report-to 'mlflow' is not one of \['none', 'tensorboard', 'wandb'\]"),
    ("learning_rate", -1e-4, "--learning-rate must be >= 0")])
def test_shared_training_flags_are_checked_before_anything_loads(weightless, data, tmp_path, flag, value, message):
    """Each was misread in silence (--max-steps 0 trained one step, -5 a whole epoch, --dtype float64 trained in
    float64, --resume-must alone trained from scratch) or ended in a traceback (an accumulation of 0, bf16, a backend
    not installed); now one error, in both training scripts, before the weights load (the folder has none)."""
    import importlib.util
    if flag == "attn_implementation" and importlib.util.find_spec("flash_attn") or \
            flag == "report_to" and value == "wandb" and importlib.util.find_spec("wandb"):
        pytest.skip(f"{value}'s package is installed here")
    args = train_sft.Args(model=weightless["llada"], output_dir=str(tmp_path / "sft"), max_steps=1)
    args.data.path = write_task("addition", str(tmp_path / "sft.jsonl"), 8)
    setattr(args, flag, value)
    with pytest.raises(ValueError, match=message):
        train_sft.main(args)
    if flag != "gradient_accumulation_steps":  # an SFT flag only
        with pytest.raises(ValueError, match=message):
            train_rl.main(rl_args(data, tmp_path / "rl", model=weightless["llada"], **{flag: value}))


@pytest.mark.parametrize("alias, dtype", [("bf16", "bfloat16"), ("FP32", "float32"), ("bfloat16", "bfloat16")])
def test_dtype_aliases_map_to_the_dtype(alias, dtype):
    from dare.trainers.flags import check_training_flags
    args = train_sft.Args(dtype=alias)
    check_training_flags(args)
    assert args.dtype == dtype
