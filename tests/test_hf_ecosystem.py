"""Saved folders leave DARE: a tiny model (save_tiny), a train_sft.py output and its Trainer checkpoint, a LoRA
adapter and its merged export load with plain transformers / PEFT in a fresh interpreter -- with DARE installed after
only ``import dare`` (no trust_remote_code), and with DARE not importable at all (the code shipped in the folder,
trust_remote_code=True) -- and give the logits of the model DARE saved (computed here, passed through a file)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import FAMILIES
from safetensors import safe_open

import train_sft
from dare.models import load_pretrained, save_tiny, tiny

TRAINED = ("llada", "sdar")  # families also run through train_sft.py (full and LoRA)

# The child: a fresh interpreter (-I: no cwd / PYTHONPATH on sys.path) that loads each folder the way the ecosystem
# does and compares its logits with the expected ones. mode "dare": `import dare` and nothing more of DARE;
# "remote": DARE blocked from import, the folder's own code; "peft": `import dare`, PEFT's Auto class on adapters.
CHILD = r"""
import json, sys
mode, cases = sys.argv[1], sys.argv[2]
if mode == "remote":
    class NoDare:
        def find_spec(self, name, path=None, target=None):
            if name == "dare" or name.startswith("dare."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, NoDare())
    try:
        import dare
        raise SystemExit("dare is importable")
    except ModuleNotFoundError:
        pass
else:
    import dare
    assert "dare.models" not in sys.modules, "import dare must stay cheap (dare.models loads with transformers' Auto)"
import torch
from transformers import AutoModelForCausalLM
data = torch.load(cases)
out = {}
for folder, expected in data["logits"].items():
    if mode == "peft":
        from peft import AutoPeftModelForCausalLM
        model = AutoPeftModelForCausalLM.from_pretrained(folder)
        base = model.get_base_model()
    else:
        model = base = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=mode == "remote")
    with torch.no_grad():
        logits = model.eval()(input_ids=data["ids"]).logits
    out[folder] = {"class": f"{type(base).__module__}.{type(base).__name__}", "dtype": str(logits.dtype),
                   "max_diff": (logits.float() - expected).abs().max().item()}
json.dump(out, open(sys.argv[3], "w"))
"""


def run_child(mode: str, expected: dict, tmp_path: Path) -> dict:
    ids = torch.randint(20, 500, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.save({"ids": ids, "logits": {k: logits_of(model, ids) for k, model in expected.items()}},
               tmp_path / "cases.pt")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "hf_modules"), OMP_NUM_THREADS="1",
               TRANSFORMERS_VERBOSITY="error")
    result = subprocess.run([sys.executable, "-I", "-c", CHILD, mode, str(tmp_path / "cases.pt"),
                             str(tmp_path / "result.json")], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text())


def logits_of(model, ids):
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits.float()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``{kind: {folder: in-process model whose logits the folder must reproduce}}``."""
    root = tmp_path_factory.mktemp("hf")
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"q": f"{a}+{b}=?", "a": f"{a}+{b}={a + b}"}) + "\n"
                            for a in range(10) for b in range(4)))
    out = {"full": {}, "adapter": {}}
    for family in FAMILIES:
        out["full"][save_tiny(family, root / "tiny" / family)] = tiny(family)[0]
    for family in TRAINED:
        sft, lora = root / "sft" / family, root / "lora" / family
        train_sft.main(sft_args(data, sft, model=f"tiny:{family}"))
        train_sft.main(sft_args(data, lora, model=str(root / "tiny" / family), lora_rank=4))
        for folder in (sft, sft / "checkpoint-1", lora / "merged"):
            out["full"][str(folder)] = load_pretrained(str(folder), dtype=torch.float32)[0]
        from peft import PeftModel
        for folder in (lora, lora / "checkpoint-1"):
            base = load_pretrained(str(root / "tiny" / family), dtype=torch.float32)[0]
            out["adapter"][str(folder)] = PeftModel.from_pretrained(base, str(folder))
    return out


def sft_args(data, out, model, lora_rank=0):
    args = train_sft.Args(model=model, output_dir=str(out), max_steps=1, save_steps=1, logging_steps=1,
                          per_device_train_batch_size=4, learning_rate=1e-2, warmup_steps=0.0)
    args.data.path, args.data.prompt_key, args.data.response_key = str(data), "q", "a"
    args.data.max_length, args.data.pad_to = 32, "longest"
    args.lora.rank, args.lora.alpha = lora_rank, 8
    return args


def test_saved_folders_ship_their_code(folders, tmp_path):
    """config.json names the shipped code; the official model_type and state-dict keys are kept; saving leaves the
    in-memory config as it was."""
    model, _ = tiny("sdar")
    model.save_pretrained(tmp_path)
    assert "auto_map" in json.loads((tmp_path / "config.json").read_text()) and not hasattr(model.config, "auto_map")
    for folder, model in folders["full"].items():
        config = json.loads((Path(folder) / "config.json").read_text())
        assert config["model_type"] == type(model.config).model_type
        auto_map = config["auto_map"]
        assert set(auto_map) == {"AutoConfig", "AutoModel", "AutoModelForCausalLM"}
        for ref in auto_map.values():
            module, _, name = ref.rpartition(".")
            assert module.startswith("modeling_") and f"class {name}(" in (Path(folder) / f"{module}.py").read_text()
        assert {"common.py", "masks.py"} <= {p.name for p in Path(folder).glob("*.py")}
        with safe_open(str(Path(folder) / "model.safetensors"), "pt") as f:
            assert set(f.keys()) == set(model.state_dict())
        # DARE's own loader still never runs a folder's code (official folders: tests/test_models.py)
        loaded = load_pretrained(folder, dtype=torch.float32)[0]
        assert type(loaded) is type(model) and not hasattr(loaded.config, "auto_map")


def test_with_dare_installed_import_dare_is_enough(folders, tmp_path):
    results = run_child("dare", folders["full"], tmp_path)
    for folder, model in folders["full"].items():
        assert results[folder]["class"] == f"{type(model).__module__}.{type(model).__name__}", folder
        assert results[folder]["max_diff"] < 1e-5, (folder, results[folder])


def test_without_dare_the_shipped_code_loads(folders, tmp_path):
    results = run_child("remote", folders["full"], tmp_path)
    for folder, model in folders["full"].items():
        module = f"modeling_{type(model).__module__.rpartition('.')[2]}"
        assert results[folder]["class"].startswith("transformers_modules."), folder
        assert results[folder]["class"].endswith(f".{module}.{type(model).__name__}"), folder
        assert results[folder]["max_diff"] < 1e-5, (folder, results[folder])


def test_lora_adapter_loads_with_peft_auto_class(folders, tmp_path):
    results = run_child("peft", folders["adapter"], tmp_path)
    for folder, model in folders["adapter"].items():
        base = model.get_base_model()
        assert results[folder]["class"] == f"{type(base).__module__}.{type(base).__name__}", folder
        assert results[folder]["max_diff"] < 1e-5, (folder, results[folder])
        config = json.loads((Path(folder) / "adapter_config.json").read_text())
        assert config["task_type"] == "CAUSAL_LM" and not config.get("auto_mapping")
    # the adapter moved the logits (a base model loaded without it would be caught), and its merged export agrees
    ids = torch.randint(20, 500, (2, 16), generator=torch.Generator().manual_seed(1))
    for model in folders["adapter"].values():
        with model.disable_adapter():
            base = logits_of(model, ids)
        assert (logits_of(model, ids) - base).abs().max() > 1e-3
    for family in TRAINED:
        adapter = next(m for f, m in folders["adapter"].items() if f.endswith(f"lora/{family}"))
        merged = next(m for f, m in folders["full"].items() if f.endswith(f"lora/{family}/merged"))
        assert torch.allclose(logits_of(adapter, ids), logits_of(merged, ids), atol=1e-5)
