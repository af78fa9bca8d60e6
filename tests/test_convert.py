"""``python -m dare.convert``: a causal LM becomes a ``dream`` (masked-diffusion) model that reproduces the source's
logits under a causal mask (its weights and layers are the source's), attends both ways without one, and which DARE
loads, decodes and fine-tunes."""

import subprocess
import sys

import pytest
import torch
from conftest import ROOT
from transformers import LlamaConfig

from dare.convert import convert, tiny_causal
from dare.models import load_pretrained, masks


def causal_folder(tmp_path, kind: str, tie: bool = False, mask: bool = True):
    """A random tiny causal LM of ``kind`` saved with a Qwen-format tokenizer (``mask=False``: none declared)."""
    model, tok = tiny_causal(kind, tie=tie, mask_token=mask)
    path = tmp_path / f"causal-{kind}"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, model, tok


@pytest.mark.parametrize("kind,tie,to", [("qwen2", False, "dream"), ("qwen2", True, "dream"),
                                        ("llama", False, "dream"), ("qwen3", True, "sdar")])
@torch.no_grad()
def test_under_a_causal_mask_the_logits_are_the_sources_and_without_one_attention_opens(tmp_path, kind, tie, to):
    path, causal, tok = causal_folder(tmp_path, kind, tie)
    convert(str(path), str(tmp_path / to), to=to)
    model, tokenizer, family = load_pretrained(str(tmp_path / to))
    assert family.name == to and family.mask_id == tokenizer.convert_tokens_to_ids("<|mask|>")
    ids = torch.randint(20, len(tok) - 8, (2, 12), generator=torch.Generator().manual_seed(1))
    want = causal(ids).logits
    lower = torch.ones(2, 12, 12, dtype=torch.bool).tril()
    got = model(ids, attention_mask=masks.additive(lower, torch.float32), position_ids=torch.arange(12)[None]).logits
    assert (got - want).abs().max() < 1e-5, f"{(got - want).abs().max():.2e}"
    assert (model(ids[:, :1]).logits - want[:, :1]).abs().max() < 1e-5  # one token: attention cannot differ
    opened = model(ids).logits  # dream: both ways; sdar: block-causal, so position 0 sees its block's tokens 1-3
    assert (opened[:, 0] - want[:, 0]).abs().max() > 1e-3, "unmasked, earlier positions see later tokens"
    if tie:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_a_mask_token_is_added_where_the_tokenizer_has_none(tmp_path):
    path, _, tok = causal_folder(tmp_path, "qwen2", mask=False)
    model, tokenizer = convert(str(path), str(tmp_path / "dream"), mask_token="<|new_mask|>")
    assert tokenizer.mask_token == "<|new_mask|>" and tokenizer.mask_token_id == len(tok)
    assert model.config.vocab_size == len(tok) + 1 == model.lm_head.weight.shape[0]
    assert load_pretrained(str(tmp_path / "dream"))[2].mask_id == len(tok)


def test_what_the_dream_decoder_cannot_carry_is_refused_before_the_weights_load(tmp_path):
    path, _, _ = causal_folder(tmp_path, "llama")
    config = LlamaConfig.from_pretrained(path)
    config.attention_bias = True
    config.save_pretrained(path)
    res = subprocess.run([sys.executable, "-m", "dare.convert", str(path), str(tmp_path / "out")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and res.stderr.strip().startswith("error: llama: biases on the attention or the MLP")
    assert not (tmp_path / "out").exists()
    res = subprocess.run([sys.executable, "-m", "dare.convert", str(tmp_path / "nowhere"), str(tmp_path / "out")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and res.stderr.strip() == f"error: causal LM folder {tmp_path / 'nowhere'} does not " \
        "exist (a hub name is 'org/name')"


def test_the_converted_model_decodes_and_fine_tunes(tmp_path):
    """The A2D step the module's docstring shows: SFT on the converted folder runs (two steps), then it decodes."""
    res = subprocess.run([sys.executable, "-m", "dare.convert", "tiny:qwen2", str(tmp_path / "a2d")], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "a dream model" in res.stdout, res.stderr[-2000:]
    res = subprocess.run([sys.executable, "train_sft.py", "--model", str(tmp_path / "a2d"), "--data.path", "task:sum4",
                          "--data.max-length", "96", "--max-steps", "2", "--output-dir", str(tmp_path / "sft")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    res = subprocess.run([sys.executable, "evaluate.py", "--model", str(tmp_path / "sft"), "--prompt", "1+2=",
                          "--gen-length", "8"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


def test_the_a2d_bench_runs_and_writes_its_table(tmp_path):
    """``bench/bench_a2d.py`` end to end at a toy size: convert, two SFT steps, the paired held-out measure."""
    res = subprocess.run([sys.executable, "bench/bench_a2d.py", "--sources", "tiny:qwen2", "--steps", "2",
                          "--questions", "4", "--gen-length", "8", "--output-dir", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    table = (tmp_path / "a2d.md").read_text()
    assert "| tiny:qwen2 | dream |" in table and (tmp_path / "qwen2-sft" / "model.safetensors").exists()
