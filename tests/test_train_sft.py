"""train_sft.py end to end on tiny models: loss goes down, resume is exact, checkpoints are crash-safe, LoRA
trains adapters only and exports a merged model under the official key names."""

import json
import random
import re
import shutil

import pytest
import torch

import train_sft
from dare.lora import apply_lora
from dare.models import load_pretrained, save_tiny, tiny
from dare.trainers import COMPLETE, latest_complete_checkpoint


@pytest.fixture(scope="module")
def arithmetic(tmp_path_factory):
    """A small learnable task: single-digit sums with a fixed answer format."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("data") / "arith.jsonl"
    with path.open("w") as f:
        for _ in range(256):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            f.write(json.dumps({"q": f"{a}+{b}=?", "a": f"{a}+{b}={a + b}"}) + "\n")
    return str(path)


def args_for(data, out, **kw):
    args = train_sft.Args(model=kw.pop("model", "tiny:llada"), output_dir=str(out), logging_steps=1,
                          per_device_train_batch_size=8, learning_rate=3e-3, warmup_steps=0.0, save_steps=1000)
    args.data.path, args.data.prompt_key, args.data.response_key = data, "q", "a"
    args.data.max_length, args.data.pad_to = 64, "longest"
    for key, value in kw.items():
        setattr(args, key, value)
    return args


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "sdar_moe", "llada2", "diffusion_gemma"])
def test_loss_goes_down(family, arithmetic, tmp_path):
    args = args_for(arithmetic, tmp_path, model=f"tiny:{family}", max_steps=200, save_steps=200,
                    group_by_length=True)
    train_sft.main(args)
    history = json.loads((tmp_path / "checkpoint-200" / "trainer_state.json").read_text())["log_history"]
    curve = [h["loss"] for h in history if "loss" in h]
    first, last = sum(curve[:10]) / 10, sum(curve[-10:]) / 10
    assert last < 0.6 * first, f"{family}: loss {first:.3f} -> {last:.3f}"


@pytest.mark.parametrize("model", ["tiny:llada", "tiny:diffusion_gemma"])
def test_resume_is_exact(arithmetic, tmp_path, model):
    straight = args_for(arithmetic, tmp_path / "straight", max_steps=8, save_steps=4, model=model)
    train_sft.main(straight)
    interrupted = args_for(arithmetic, tmp_path / "resumed", max_steps=8, save_steps=4, model=model)
    train_sft.main(interrupted)
    # simulate a crash after step 4: drop everything written later, then resume
    shutil.rmtree(tmp_path / "resumed" / "checkpoint-8")
    (tmp_path / "resumed" / "model.safetensors").unlink()
    train_sft.main(args_for(arithmetic, tmp_path / "resumed", max_steps=8, save_steps=4, resume=True, model=model))
    a = load_pretrained(str(tmp_path / "straight"), dtype=torch.float32)[0].state_dict()
    b = load_pretrained(str(tmp_path / "resumed"), dtype=torch.float32)[0].state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    logs = [json.loads((tmp_path / d / "checkpoint-8" / "trainer_state.json").read_text())["log_history"]
            for d in ("straight", "resumed")]
    assert [h["loss"] for h in logs[0] if "loss" in h][4:] == [h["loss"] for h in logs[1] if "loss" in h][4:]
    # resuming the finished run trains nothing: the last checkpoint is exported again, weights unchanged
    (tmp_path / "straight" / "model.safetensors").unlink()
    train_sft.main(args_for(arithmetic, tmp_path / "straight", max_steps=8, save_steps=4, resume=True, model=model))
    again = load_pretrained(str(tmp_path / "straight"), dtype=torch.float32)[0].state_dict()
    assert all(torch.equal(a[k], again[k]) for k in a)
    assert sorted(p.name for p in (tmp_path / "straight").glob("checkpoint-*")) == ["checkpoint-4", "checkpoint-8"]


def test_stop_at_loss_ends_at_the_first_logged_loss_below_it(arithmetic, tmp_path):
    """--stop-at-loss T: the run is the uninterrupted run up to the first logged loss below T, where it stops and
    saves its final model; off (0), the run goes to max_steps."""
    straight = train_sft.main(args_for(arithmetic, tmp_path / "straight", max_steps=30))
    losses = [h["loss"] for h in straight.state.log_history if "loss" in h]
    target = sorted(losses[5:])[len(losses[5:]) // 2]  # a loss the run first goes below somewhere after step 5
    first = next(i for i, loss in enumerate(losses) if loss < target) + 1
    stopped = train_sft.main(args_for(arithmetic, tmp_path / "stopped", max_steps=30, stop_at_loss=target))
    assert stopped.state.global_step == first < 30
    assert [h["loss"] for h in stopped.state.log_history if "loss" in h] == losses[:first]
    assert (tmp_path / "stopped" / "model.safetensors").exists() and straight.state.global_step == 30


def test_incomplete_checkpoints_are_never_resumed(tmp_path):
    for step, complete in ((4, True), (8, True), (12, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"partial")
        if complete:
            (folder / COMPLETE).write_text("ok\n")
    assert latest_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-8")
    assert latest_complete_checkpoint(str(tmp_path / "missing")) is None


def test_lora_trains_adapters_and_exports_merged(arithmetic, tmp_path):
    args = args_for(arithmetic, tmp_path, model="tiny:sdar", max_steps=10)
    args.lora.rank, args.lora.alpha = 4, 8
    model = apply_lora(tiny("sdar")[0], args.lora)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    train_sft.main(args)
    base, _ = tiny("sdar")
    merged, _, _ = load_pretrained(str(tmp_path / "merged"), dtype=torch.float32)
    assert set(merged.state_dict()) == set(base.state_dict())  # official key names, no lora_ leftovers
    changed = [k for k in base.state_dict() if not torch.equal(base.state_dict()[k], merged.state_dict()[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed), changed  # only adapted linears moved
    from peft import PeftModel
    adapted = PeftModel.from_pretrained(tiny("sdar")[0], str(tmp_path)).eval()
    x = torch.randint(20, 500, (2, 16))
    with torch.no_grad():
        assert torch.allclose(adapted(x).logits, merged.eval()(x).logits, atol=1e-5)



def test_an_adapter_folder_is_a_model_everywhere(arithmetic, tmp_path, monkeypatch):
    """``--model OUT`` after a LoRA run (transformers: "Unrecognized model in OUT") is the base with the adapters
    merged: the same logits as ``OUT/merged``, in evaluate.py and as train_rl.py's start; a local base is recorded
    as an absolute path; an adapter naming no base says where the merged model is."""
    import subprocess
    import sys

    from conftest import ROOT

    from dare.models.loading import looks_local
    base = tmp_path / "base"
    save_tiny("llada", base, seed=3)
    monkeypatch.chdir(tmp_path)
    args = args_for(arithmetic, tmp_path / "out", model="base", max_steps=4, learning_rate=1e-2)
    args.lora.rank = 4
    train_sft.main(args)
    recorded = json.loads((tmp_path / "out" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str(base)
    x = torch.randint(20, 500, (2, 16))
    with torch.no_grad():
        adapter, merged, start = (load_pretrained(str(p), dtype=torch.float32)[0].eval()(x).logits
                                  for p in (tmp_path / "out", tmp_path / "out" / "merged", base))
    assert torch.equal(adapter, merged) and not torch.allclose(adapter, start)
    out = subprocess.run([sys.executable, str(ROOT / "evaluate.py"), "--model", str(tmp_path / "out"), "--prompt",
                          "hi", "--gen-length", "8"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "forward passes" in out.stderr, out.stderr[-2000:]
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    (tmp_path / "out" / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    with pytest.raises(ValueError, match=r"do not name their base model .+out/merged is the merged model"):
        load_pretrained(str(tmp_path / "out"))
    assert looks_local("out/merged") and not looks_local("GSAI-ML/LLaDA-8B-Instruct")  # a folder here, a hub name

def test_config_file_and_overrides(tmp_path, arithmetic):
    from dare.config import parse
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: tiny:dream\nlearning_rate: 0.002\ndata:\n  path: {arithmetic}\n  max_length: 40\n"
                      "lora:\n  rank: 8\n")
    args = parse(train_sft.Args, ["--config", str(recipe), "--learning-rate", "0.001"])
    assert (args.model, args.learning_rate, args.data.path, args.data.max_length, args.lora.rank) == \
        ("tiny:dream", 0.001, arithmetic, 40, 8)
    recipe.write_text("modle: tiny:dream\n")
    with pytest.raises(ValueError, match="unknown key 'modle'"):
        parse(train_sft.Args, ["--config", str(recipe)])


def test_unknown_family_is_refused(tmp_path, arithmetic):
    from transformers import LlamaConfig, LlamaForCausalLM
    LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                 vocab_size=64)).save_pretrained(tmp_path / "llama")
    with pytest.raises(ValueError, match="eval_generate needs held-out prompts: set data.eval_path and eval_steps"):
        train_sft.main(args_for(arithmetic, tmp_path / "out", max_steps=1, eval_generate=4))
    with pytest.raises(ValueError, match="Unknown model family 'llama'"):
        train_sft.main(args_for(arithmetic, tmp_path / "out", model=str(tmp_path / "llama"), max_steps=1))


def test_held_out_loss_is_logged_with_fixed_masks_and_leaves_training_unchanged(tmp_path):
    """With data.eval_path, eval_loss is logged every eval_steps on held-out questions (task:addition's test split),
    falls as the model learns, uses the same masks every time (evaluating one model twice gives the same number) and
    does not touch the training run (the weights equal those of a run without evaluation), nor does --eval-generate."""
    def sft(out, eval_path=None, **kw):
        args = args_for("task:addition", out, max_steps=60, save_steps=60, per_device_train_batch_size=16, **kw)
        args.data.prompt_key, args.data.response_key = "prompt", "extra_info.solution"
        args.data.eval_path, args.data.eval_limit = eval_path, 32
        return args, train_sft.main(args)

    from dare.engines import HFEngine
    from dare.rewards.routing import RewardRouter
    from dare.sampling import SamplingConfig
    greedy = SamplingConfig(gen_length=16, temperature=0.0)
    args, trainer = sft(tmp_path / "eval", "task:addition", eval_steps=20, eval_generate=8, eval_sampling=greedy)
    evals = [(h["step"], h["eval_loss"]) for h in trainer.state.log_history if "eval_loss" in h]
    assert [s for s, _ in evals] == [20, 40, 60] and evals[-1][1] < evals[0][1], evals
    assert trainer.evaluate()["eval_loss"] == pytest.approx(trainer.evaluate()["eval_loss"], abs=0)
    # --eval-generate: the first 8 held-out prompts decoded at each evaluation, scored by their reward; the last
    # one is what the final weights answer when decoded on their own
    generated = [h for h in trainer.state.log_history if "eval_acc" in h]
    assert [h["step"] for h in generated] == [20, 40, 60, 60, 60]  # + the two direct evaluate() calls above
    assert all(h["eval_acc/addition"] == h["eval_acc"] and 0 < h["eval_completion_length"] <= 16 for h in generated)
    rows = trainer.generation[0]
    assert len(rows) == 8 and rows[0]["prompt"][-1]["content"] == "What is 4 + 9? Put the final answer in \\boxed{}."
    alone = HFEngine(trainer.model.eval(), trainer.processing_class, trainer.family).generate(
        [r["prompt"] for r in rows], 1, greedy, seed=args.seed)
    accuracy = sum(r.acc for r in RewardRouter(["auto"]).score(alone.texts, rows)) / 8
    length = alone.completion_mask.sum(-1).float().mean().item()
    print(f"eval_acc at steps 20/40/60: {[h['eval_acc'] for h in generated[:3]]}, completion length "
          f"{[h['eval_completion_length'] for h in generated[:3]]}; decoded alone: {accuracy}, {length}")
    assert (generated[-1]["eval_acc"], generated[-1]["eval_completion_length"]) == (accuracy, pytest.approx(length))
    _, plain = sft(tmp_path / "plain")
    for (name, a), b in zip(trainer.model.state_dict().items(), plain.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("data", ["task:sum4", "messages"])
def test_sft_runs_on_a_task_and_on_conversations_with_no_key_flags(data, tmp_path):
    """The first command a user tries: ``train_sft.py --data.path task:sum4`` (and a multi-turn messages file)."""
    if data == "messages":
        path = tmp_path / "chats.jsonl"
        turns = [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"},
                 {"role": "user", "content": "and 2+2?"}, {"role": "assistant", "content": "4"}]
        path.write_text("".join(json.dumps({"messages": turns}) + "\n" for _ in range(4)))
        data = str(path)
    args = args_for(data, tmp_path / "out", max_steps=2, save_steps=2)
    args.data.prompt_key = args.data.response_key = None
    args.data.limit = 8
    train_sft.main(args)
    assert latest_complete_checkpoint(str(tmp_path / "out")).endswith("checkpoint-2")


def test_a_joint_loss_logs_its_two_terms(arithmetic, tmp_path, capsys):
    """Nemotron-Labs-Diffusion's SFT loss is 0.3 x diffusion + causal: each logged step shows both terms (on the
    console too), summed over its micro-batches as the loss is."""
    args = args_for(arithmetic, tmp_path, model="tiny:nemotron_diffusion", max_steps=3, save_steps=3,
                    per_device_train_batch_size=4, gradient_accumulation_steps=2)
    train_sft.main(args)
    console = capsys.readouterr().out
    assert len(re.findall(r"^step \d/3  loss \S+  diffusion \S+  causal \S+  gnorm", console, re.M)) == 3
    history = json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())["log_history"]
    logged = [h for h in history if "loss" in h]
    assert len(logged) == 3
    for h in logged:
        assert h["diffusion_loss"] > 0 and h["causal_loss"] > 0
        assert abs(h["loss"] - (0.3 * h["diffusion_loss"] + h["causal_loss"])) < 1e-3, h
