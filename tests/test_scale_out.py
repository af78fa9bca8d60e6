"""Scale-out on 2 CPU processes (gloo), launched as a user launches it: DDP, FSDP2 (fsdp.yaml), DeepSpeed ZeRO-2 and
ZeRO-3 (zero2/3.yaml) and two "machines" on 127.0.0.1, the README's lines run as written (a tiny model).

- tests/shard_check.py under each strategy: 2 processes equal 1 process on the same global batch (SFT and RL
  losses, every family, 1e-5), with the parameters really sharded (FSDP2: DTensor shards; ZeRO-3: flat partitions);
- train_sft.py and train_rl.py under FSDP2 / ZeRO: the same final weights as under DDP within 1e-5 (each process draws
  the same noise whatever the strategy), complete sharded checkpoints, a whole final model;
- the LoRA merged export gathered from FSDP2 / ZeRO-3 shards equals DDP's.
"""

import json
import math
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text() + (ROOT / "docs" / "scale-out.md").read_text()  # and the docs page
STRATEGIES = {"ddp": [], "fsdp": ["--config_file", "accelerate_configs/fsdp.yaml"],
              "zero2": ["--config_file", "accelerate_configs/zero2.yaml"],
              "zero3": ["--config_file", "accelerate_configs/zero3.yaml"]}
TOLERANCE = 1e-5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment(extra: dict | None = None) -> dict:
    """The launch's environment: no CPU flag inherited (DeepSpeed needs it off; FSDP and DDP set it themselves),
    this folder importable for the test reward."""
    env = {k: v for k, v in os.environ.items() if k != "ACCELERATE_USE_CPU"}
    return {**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")]), **(extra or {})}


def launch(strategy: str, script: list[str], timeout: int = 300) -> str:
    if strategy.startswith("zero"):
        pytest.importorskip("deepspeed")
    extra = {"ACCELERATE_USE_CPU": "1"} if strategy == "ddp" else {}
    flags = ["--multi_gpu"] if strategy == "ddp" else STRATEGIES[strategy]
    command = [sys.executable, "-m", "accelerate.commands.launch", *flags, "--num_processes", "2",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), *script]
    result = subprocess.run(command, cwd=ROOT, env=environment(extra), capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result.stdout + result.stderr


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_two_processes_equal_one_on_the_same_global_batch(strategy):
    out = launch(strategy, ["tests/shard_check.py"])
    results = re.findall(r"shard_check (\w+) (\w+): (\w+) local \(([\d, ]+)\) of \(([\d, ]+)\).* -> (OK|FAIL)", out)
    print("\n".join(line for line in out.splitlines() if line.startswith("shard_check")))
    assert len(results) == 12 and all(r[-1] == "OK" for r in results), out[-4000:]
    kinds = {r[2] for r in results}
    local, full = (math.prod(int(x) for x in shape.split(",") if x.strip()) for shape in results[0][3:5])
    if strategy == "fsdp":  # each process holds half of every weight, as a DTensor shard
        assert kinds == {"DTensor"} and 2 * local == full
    elif strategy == "zero3":  # a flat partition: half of every weight
        assert 2 * local == full
    else:  # DDP and ZeRO-2 replicate the parameters (ZeRO-2 splits gradients and optimizer state)
        assert local == full


def readme_line(strategy: str) -> list[str]:
    line = next(ln for ln in README.splitlines() if ln.startswith(("accelerate", "ACCELERATE")) and "tiny:" in ln
                and f"--output-dir outputs/scale-{strategy}" in ln)
    argv = shlex.split(line)
    return argv[argv.index("train_sft.py"):]


@pytest.fixture(scope="module")
def sft_runs(tmp_path_factory):
    """The README's scale-out lines (full fine-tuning), each strategy once; and a LoRA variant under DDP, FSDP2 and
    ZeRO-3. Output folders by name."""
    root = tmp_path_factory.mktemp("scale-sft")
    runs = {}

    def run(strategy, lora=False):
        name = f"{strategy}{'-lora' if lora else ''}"
        if name not in runs:
            script = readme_line(strategy)
            script[script.index("--output-dir") + 1] = str(root / name)
            script += ["--learning-rate", "1e-2"] + (["--lora.rank", "4"] if lora else [])
            launch(strategy, script)
            runs[name] = root / name
        return runs[name]
    return run


def max_gap(a, b) -> float:
    first, second = (load_file(x) if isinstance(x, (str, Path)) else x for x in (a, b))
    assert set(first) == set(second)
    return max((first[k] - second[k]).abs().max().item() for k in first)


@pytest.mark.parametrize("strategy", ["fsdp", "zero2", "zero3"])
def test_sft_script_under_each_strategy_ends_where_ddp_does(strategy, sft_runs):
    out, ddp = sft_runs(strategy), sft_runs("ddp")
    gap = max_gap(out / "model.safetensors", ddp / "model.safetensors")
    print(f"{strategy}: max |weight - DDP's| {gap:.1e}")
    assert gap < TOLERANCE
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "COMPLETE").exists() and (checkpoint / "rng_state_1.pth").exists()
    sharded = {"fsdp": "pytorch_model_fsdp_0", "zero2": "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt",
               "zero3": "global_step2/zero_pp_rank_1_mp_rank_00_model_states.pt"}[strategy]
    assert (checkpoint / sharded).exists(), sorted(p.name for p in checkpoint.rglob("*"))
    assert json.loads((out / "config.json").read_text())["model_type"] == "llada"


PROBE = """import os, runpy, sys
import dare.models.loading as loading
load = loading.load_weights
def probed(*args, **kwargs):
    model = load(*args, **kwargs)
    first = next(model.parameters())
    with open(os.path.join(os.path.dirname(__file__), "rank-" + os.environ["RANK"]), "w") as f:
        f.write(("partitioned " if hasattr(first, "ds_id") else "whole ") + str(first.numel()))
    return model
loading.load_weights = probed
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_zero3_loads_a_checkpoint_partitioned(sft_runs, tmp_path):
    """zero3.yaml's `zero3_init_flag`: a checkpoint folder is loaded straight into ZeRO-3 partitions (no process holds
    the whole model; the arguments are built before the weights load), and trains to DDP's weights."""
    from dare.models.tiny import save_tiny
    script = readme_line("zero3")
    script[script.index("--model") + 1] = save_tiny("llada", tmp_path / "llada")  # tiny:llada's weights, as a folder
    script[script.index("--output-dir") + 1] = str(tmp_path / "out")
    (tmp_path / "probe.py").write_text(PROBE)
    launch("zero3", [str(tmp_path / "probe.py"), *script, "--learning-rate", "1e-2"])
    # files: launched processes' output interleaves
    loaded = [(tmp_path / f"rank-{rank}").read_text() for rank in (0, 1)]
    gap = max_gap(tmp_path / "out" / "model.safetensors", sft_runs("ddp") / "model.safetensors")
    print(f"zero3 from a folder: first weight as loaded {loaded}; max |weight - DDP's| {gap:.1e}")
    assert loaded == ["partitioned 0", "partitioned 0"] and gap < TOLERANCE


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_lora_merged_export_is_gathered_from_the_shards(strategy, sft_runs):
    out, ddp = sft_runs(strategy, lora=True), sft_runs("ddp", lora=True)
    gap = max_gap(out / "merged" / "model.safetensors", ddp / "merged" / "model.safetensors")
    from dare.models import tiny
    moved = max_gap(ddp / "merged" / "model.safetensors", tiny("llada")[0].state_dict())
    print(f"{strategy} LoRA: max |merged - DDP's merged| {gap:.1e}")
    assert gap < TOLERANCE and moved > 1e-4


def test_rl_script_under_fsdp_and_zero3_ends_where_ddp_does(tmp_path):
    from dare.data.tasks import write_task
    train = write_task("addition", str(tmp_path / "train.jsonl"), 64, 0, "train")
    script = ["train_rl.py", "--algo", "d1", "--model", "tiny:llada2", "--data.path", train, "--max-steps", "2",
              "--save-steps", "2", "--prompts-per-step", "4", "--num-generations", "2", "--micro-batch-size", "2",
              "--rollout.gen-length", "8", "--rewards", "dare_test_rewards.length", "--optim", "sgd",
              "--learning-rate", "0.5"]  # SGD: Adam's normalisation would amplify rounding differences
    runs = {s: tmp_path / s for s in ("ddp", "fsdp", "zero3")}
    for strategy, out in runs.items():
        launch(strategy, [*script, "--output-dir", str(out)])
    history = lambda out: json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    losses = {s: [h["loss"] for h in history(out) if "loss" in h] for s, out in runs.items()}
    from dare.models import tiny
    assert max_gap(runs["ddp"] / "model.safetensors", tiny("llada2")[0].state_dict()) > 1e-4  # it did train
    for strategy in ("fsdp", "zero3"):
        gap = max_gap(runs[strategy] / "model.safetensors", runs["ddp"] / "model.safetensors")
        print(f"RL (d1, llada2 MoE) {strategy}: losses {losses[strategy]} vs DDP {losses['ddp']}; "
              f"max |weight| gap {gap:.1e}")
        assert gap < TOLERANCE and losses[strategy] == pytest.approx(losses["ddp"], abs=TOLERANCE)


def test_two_machines_on_one_host(tmp_path):
    """The README's two multi-node lines, started together: one process per "machine", synchronised."""
    lines = [ln for ln in README.splitlines() if "--machine_rank" in ln and "tiny:" in ln]
    assert len(lines) == 2
    port, processes = str(free_port()), []
    for line in lines:
        argv = shlex.split(line)
        env = dict(a.split("=", 1) for a in argv[:argv.index("accelerate")])
        argv = argv[argv.index("accelerate") + 2:]
        argv[argv.index("--main_process_port") + 1] = port
        argv[argv.index("--output-dir") + 1] = str(tmp_path / "out")
        processes.append(subprocess.Popen([sys.executable, "-m", "accelerate.commands.launch", *argv], cwd=ROOT,
                                          env=environment(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
    outputs = [p.communicate(timeout=300)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    checkpoint = tmp_path / "out" / "checkpoint-2"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["epoch"] == pytest.approx(2 * 4 / 64)  # 2 steps of 2 machines x 2 rows of the 64
    assert (checkpoint / "rng_state_0.pth").exists() and (checkpoint / "rng_state_1.pth").exists()


# Dream (the logit shift across a rank boundary) and LLaDA2 (block-causal, [x_t ‖ x_0], MoE); the exchange itself is
# checked on every family and layout by tests/sp_check.py
@pytest.mark.parametrize("family", ["dream", "llada2"])
def test_sequence_parallel_sft_equals_one_process(family, tmp_path):
    """The README's `--sequence-parallel 2` line (2 processes share each row; Ulysses attention) ends with the
    weights of the plain 1-process run of the same command, every family (both layouts, MoE, Dream's shift)."""
    script = readme_line("sp")
    script[script.index("--model") + 1] = f"tiny:{family}"
    script[script.index("--data.max-length") + 1] = "96"  # LLaDA2's tiny tokenizer spells the prompts longer
    script += ["--learning-rate", "1e-2", "--logging-steps", "1"]
    flag = script.index("--sequence-parallel")
    alone = script[:flag] + script[flag + 2:]
    runs = {"alone": tmp_path / "alone", "sp": tmp_path / "sp"}
    alone[alone.index("--output-dir") + 1] = str(runs["alone"])
    script[script.index("--output-dir") + 1] = str(runs["sp"])
    result = subprocess.run([sys.executable, *alone], cwd=ROOT, env=environment(), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    launch("ddp", script)
    history = lambda out: json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    losses = {k: [h["loss"] for h in history(out) if "loss" in h] for k, out in runs.items()}
    gap = max_gap(runs["sp"] / "model.safetensors", runs["alone"] / "model.safetensors")
    print(f"{family}: losses {losses['sp']} (SP=2) vs {losses['alone']} (1 process); max |weight| gap {gap:.1e}")
    assert gap < TOLERANCE and losses["sp"] == pytest.approx(losses["alone"], abs=TOLERANCE)


def one_step_alone_and_split(script: list[str], tmp_path) -> tuple[dict, float]:
    """One optimiser step of ``script`` in 1 process and with `--sequence-parallel 2` on 2: each run's step log and
    the largest weight gap between them."""
    runs = {"alone": tmp_path / "alone", "sp": tmp_path / "sp"}
    result = subprocess.run([sys.executable, *script, "--output-dir", str(runs["alone"])], cwd=ROOT, env=environment(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    launch("ddp", [*script, "--sequence-parallel", "2", "--output-dir", str(runs["sp"])])
    logs = {k: next(h for h in json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())["log_history"]
                    if "loss" in h) for k, out in runs.items()}
    return logs, max_gap(runs["sp"] / "model.safetensors", runs["alone"] / "model.safetensors")


@pytest.mark.parametrize("family", ["dream", "llada2"])
def test_sequence_parallel_rl_step_equals_one_process(family, tmp_path):
    """One d1 step with `--sequence-parallel 2` (rollouts whole on both processes, the scoring passes split along the
    sequence and gathered) equals the 1-process step: the same rollout, loss, gradient norm and weights (SGD, so a
    wrong gradient scale cannot hide behind Adam's normalisation)."""
    from dare.data.tasks import write_task
    train = write_task("addition", str(tmp_path / "train.jsonl"), 64, 0, "train")
    script = ["train_rl.py", "--algo", "d1", "--model", f"tiny:{family}", "--data.path", train, "--max-steps", "1",
              "--save-steps", "1", "--prompts-per-step", "4", "--num-generations", "2", "--micro-batch-size", "2",
              "--rollout.gen-length", "8", "--rewards", "dare_test_rewards.length", "--optim", "sgd",
              "--learning-rate", "0.5"]
    logs, gap = one_step_alone_and_split(script, tmp_path)
    print(f"{family} d1: grad norm {logs['sp']['grad_norm']:.6f} (SP=2) vs {logs['alone']['grad_norm']:.6f}; "
          f"reward {logs['sp']['reward']} vs {logs['alone']['reward']}; max |weight| gap {gap:.1e}")
    assert logs["sp"]["reward"] == logs["alone"]["reward"] and logs["alone"]["grad_norm"] > 1e-3
    assert logs["sp"]["grad_norm"] == pytest.approx(logs["alone"]["grad_norm"], rel=1e-5) and gap < TOLERANCE


def test_sequence_parallel_vrpo_step_equals_one_process(tmp_path):
    """The offline trainer under `--sequence-parallel 2`: one VRPO step's ELBOs (policy and frozen reference, the
    [x_t ‖ x_0] layout, recomputed in backward) split along the sequence equal the 1-process step (SGD)."""
    script = ["train_rl.py", "--algo", "vrpo", "--model", "tiny:sdar", "--preference.path", "task:addition",
              "--max-steps", "1", "--save-steps", "1", "--prompts-per-step", "4", "--micro-batch-size", "4",
              "--optim", "sgd", "--learning-rate", "0.5"]
    logs, gap = one_step_alone_and_split(script, tmp_path)
    print(f"vrpo: loss {logs['sp']['loss']} (SP=2) vs {logs['alone']['loss']}; grad norm {logs['sp']['grad_norm']:.6f} "
          f"vs {logs['alone']['grad_norm']:.6f}; max |weight| gap {gap:.1e}")
    assert logs["alone"]["grad_norm"] > 1e-3 and gap < TOLERANCE
    assert logs["sp"]["grad_norm"] == pytest.approx(logs["alone"]["grad_norm"], rel=1e-5)


def test_rl_with_a_value_model_under_ddp(tmp_path):
    """TraceRL's value model on 2 DDP processes: it trains (gradients averaged by hand across the processes), is
    saved beside the policy, and the logged value loss is the processes' mean."""
    from dare.data.tasks import write_task
    train = write_task("addition", str(tmp_path / "train.jsonl"), 64, 0, "train")
    out = tmp_path / "ddp"
    launch("ddp", ["train_rl.py", "--algo", "tracerl", "--model", "tiny:sdar", "--data.path", train, "--max-steps",
                   "2", "--save-steps", "2", "--prompts-per-step", "4", "--num-generations", "2",
                   "--micro-batch-size", "2", "--rollout.gen-length", "8", "--rewards", "dare_test_rewards.length",
                   "--algo-config.value.model", "policy", "--algo-config.value.learning-rate", "1e-2",
                   "--output-dir", str(out)])
    history = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    assert all(h["value/loss"] > 0 for h in history if "loss" in h)
    head = load_file(str(out / "value" / "model.safetensors"))["lm_head.weight"]
    assert head.shape[0] == 1 and head.abs().max() > 0
