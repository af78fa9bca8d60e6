"""lm-evaluation-harness runs DARE's models: lm-eval's own command line and task definitions (its gsm8k.yaml and
arc_easy.yaml, pointed at local data files) on a tiny model, and the exact log-likelihood of a one-token answer."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from dare.eval.lm_harness import DARELM, cut  # noqa: E402

DATA = Path(__file__).parent / "data" / "lm_eval"
TASKS = Path(lm_eval.__file__).parent / "tasks"


def local_task(folder: Path, name: str, include: Path, data: Path, **splits) -> None:
    files = {split: str(data) for split in splits.values()}
    lines = [f"include: {include}", f"task: {name}", "tag: []", "dataset_path: json", "dataset_name: null",
             f"dataset_kwargs:\n  data_files: {json.dumps(files)}"]
    lines += [f"{key}: {value}" for key, value in splits.items()]
    (folder / f"{name}.yaml").write_text("\n".join(lines) + "\n")


def test_lm_eval_cli_runs_a_generation_and_a_multiple_choice_task(tmp_path):
    local_task(tmp_path, "dare_gsm8k", TASKS / "gsm8k" / "gsm8k.yaml", DATA / "gsm8k.jsonl",
               training_split="train", fewshot_split="train", test_split="train")
    local_task(tmp_path, "dare_arc", TASKS / "arc" / "arc_easy.yaml", DATA / "arc.jsonl",
               training_split="train", validation_split="train", test_split="train")
    out = tmp_path / "results"
    cmd = [sys.executable, "-m", "dare.eval.lm_harness", "--model", "dare", "--model_args",
           "pretrained=tiny:llada,gen_length=16,steps=8,mc_num=4", "--batch_size", "2",
           "--tasks", "dare_gsm8k,dare_arc",
           "--include_path", str(tmp_path), "--num_fewshot", "1", "--limit", "3", "--output_path", str(out),
           "--log_samples"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    assert {"exact_match,strict-match", "exact_match,flexible-extract"} <= set(results["dare_gsm8k"])
    assert {"acc,none", "acc_norm,none"} <= set(results["dare_arc"])
    samples = [json.loads(line) for line in next(out.rglob("samples_dare_arc_*.jsonl")).read_text().splitlines()]
    assert len(samples) == 3 and all(len(s["resps"]) == 4 for s in samples)  # one ELBO per choice


@pytest.fixture(scope="module")
def lm():
    return DARELM(pretrained="tiny:llada", gen_length="16", steps="8", mc_num="8", batch_size="4")


def test_one_token_loglikelihood_is_exact(lm):
    context, answer = "Question: 2+2?\nAnswer:", " 4"
    [(value, greedy)] = lm.loglikelihood([Instance("loglikelihood", {}, (context, answer), 0)], disable_tqdm=True)
    ctx, tok = lm._ids(context), lm._ids(answer)
    assert len(tok) == 1
    ids = torch.tensor([ctx + [lm.family.mask_id]])
    with torch.no_grad():
        exact = torch.log_softmax(lm.family.logits(lm.model, ids)[0, -1].double(), -1)[tok[0]]
    assert value == pytest.approx(float(exact), abs=1e-4)
    assert greedy == (int(lm.family.logits(lm.model, ids)[0, -1].argmax()) == tok[0])


def test_longer_continuations_are_seeded_monte_carlo_estimates(lm):
    request = [Instance("loglikelihood", {}, ("The sky is", " blue and wide"), 0)]
    first, again = lm.loglikelihood(request, True), lm.loglikelihood(request, True)
    assert first == again and first[0][0] < 0 and first[0][1] is False


def test_generation_stops_at_the_first_stop_string(lm):
    assert cut("18\nQuestion: next", ["Question:", "</s>"]) == "18\n"
    assert cut("no stop here", ["Question:"]) == "no stop here"
    texts = lm.generate_until([Instance("generate_until", {}, ("Hi", {"until": ["\n"]}), i) for i in range(3)], True)
    assert len(texts) == 3 and all("\n" not in t for t in texts)


def test_unknown_model_arguments_fail_with_the_list():
    with pytest.raises(ValueError, match="unknown model argument"):
        DARELM(pretrained="tiny:llada", gen_lenght="16")
    with pytest.raises(NotImplementedError, match="loglikelihood_rolling"):
        DARELM.loglikelihood_rolling(None, [])


def test_the_engine_options_are_model_arguments_refused_before_the_weights_load(monkeypatch):
    """``compile=true`` reaches the hf engine (compiled decoding, every family); the unknown-argument message lists
    the engine's options, before any weights load."""
    for name in ("llada", "diffusion_gemma"):
        lm = DARELM(pretrained=f"tiny:{name}", compile="true", compile_mode="default", gen_length="16")
        assert lm.engine.settings.compile and lm.engine.decoder is not lm.engine.model
    import dare.eval.lm_harness as harness
    monkeypatch.setattr(harness, "load_weights", lambda *a, **k: pytest.fail("weights loaded before the refusal"))
    with pytest.raises(ValueError, match="the hf engine's options \\['compile', 'compile_mode'\\]"):
        DARELM(pretrained="tiny:llada", compiled="true")


def test_the_reproduction_commands_model_args_build_on_tiny_stand_ins():
    """Every lm-eval command of bench/reproduce.py names only knobs that exist and that its family accepts."""
    import importlib.util
    import shlex
    spec = importlib.util.spec_from_file_location("reproduce", Path(__file__).parents[1] / "bench" / "reproduce.py")
    reproduce = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reproduce)
    commands = [row.command for row in reproduce.ROWS if "dare.eval.lm_harness" in row.command]
    assert commands
    for command in commands:
        argv = shlex.split(command)
        args = dict(kv.split("=", 1) for kv in argv[argv.index("--model_args") + 1].split(","))
        family = "dream" if "Dream" in args["pretrained"] else "llada"
        args.update(pretrained=f"tiny:{family}", gen_length="16", steps="16", block_length="16")
        DARELM(**args)
