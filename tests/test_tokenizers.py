"""Tests for dare.models.tokenizers: tiny per-family tokenizers vs. the official configs."""

import json
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from dare.models import tokenizers as T

SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
OFFICIAL = {  # model folder -> family
    "LLaDA-8B-Instruct": "llada", "Dream-v0-Instruct-7B": "dream",
    "SDAR-8B-Chat": "sdar", "SDAR-30B-A3B-Chat": "sdar",
    "LLaDA2.0-mini": "llada2", "LLaDA2.1-mini": "llada2",
}
EXPECTED = {  # family -> (bos, eos/pad, mask_token attr, other specials)
    "llada": ("<|startoftext|>", "<|endoftext|>", None,
              ["<|mdm_mask|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<role>", "</role>"]),
    "dream": ("<|beginoftext|>", "<|endoftext|>", "<|mask|>", ["<|im_start|>", "<|im_end|>"]),
    "sdar": (None, "<|endoftext|>", "<|MASK|>", ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]),
    "llada2": ("<|startoftext|>", "<|endoftext|>", "<|mask|>", ["<role>", "</role>", "<|role_end|>"]),
    "diffusion_gemma": ("<bos>", "<eos>", None, ["<unk>", "<|turn>", "<turn|>"]),  # uniform noise: no mask
    "nemotron_diffusion": ("<s>", "<|im_end|>", None, ["<SPECIAL_100>", "<|im_start|>", "<think>", "</think>"]),
    # LLaDA's, with MMaDA's task and picture tokens (reserved tokens of the real one) named
    "mmada": ("<|startoftext|>", "<|endoftext|>", None,
              ["<|mdm_mask|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<role>", "</role>",
               "<|soi|>", "<|eoi|>", "<|t2i|>", "<|mmu|>"]),
}
PAD = {"diffusion_gemma": "<pad>"}  # Gemma's own pad token at id 0 (eos 1, bos 2); the others pad with EOS
SINGLE_TURN = {  # user "Q?" + add_generation_prompt=True, from the spec
    "llada": "<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nQ?<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "dream": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n"
             "<|im_start|>assistant\n",
    "sdar": "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n",
    "llada2": "<role>SYSTEM</role>detailed thinking off<|role_end|><role>HUMAN</role>Q?<|role_end|>"
              "<role>ASSISTANT</role>",
    # Google's DiffusionGemma fine-tuning prompts (google-deepmind/gemma, hackable_diffusion_adapter/data)
    "diffusion_gemma": "<bos><|turn>user\nQ?<turn|>\n<|turn>model\n",
    # NVIDIA's TensorRT parity tests (nemotron_labs_diffusion chat_templates), thinking off by default
    "nemotron_diffusion": "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
                          "<think></think>",
}
SINGLE_TURN["mmada"] = SINGLE_TURN["llada"]  # LLaDA's tokenizer and template


def U(c): return {"role": "user", "content": c}
def A(c, **kw): return {"role": "assistant", "content": c, **kw}
def S(c): return {"role": "system", "content": c}


CONVERSATIONS = [
    [U("Q?")],
    [S("Be brief."), U("What is 2 + 3?")],
    [U("What is 2 + 3?"), A("5"), U("And times 4?")],
    [S("You are a math tutor."), U("  hi \n"), A(" The answer is 42. "), U("#### 18")],
    [U("hi"), A("hello")],  # ends with an assistant turn
    [U("hi"), A("<think>r1</think>a"), U("hi"), A("<think>\nadd them\n</think>\n\n\\boxed{5}")],  # repeated user
    [U("x?"), A("<think>old reasoning</think>old answer"), U("y?"), A("new", reasoning_content="why\n")],
    [U("a"), S("mid-conversation system"), U("b"), A("c", reasoning_content=None)],
]


def official_templates():
    """(model, family, template source, template) for every official template found."""
    if not SHARED_MODELS.is_dir():
        pytest.skip(f"official model folders not found at {SHARED_MODELS}")
    out = []
    for model, family in OFFICIAL.items():
        d = SHARED_MODELS / model
        cfg = d / "tokenizer_config.json"
        if cfg.is_file() and json.loads(cfg.read_text()).get("chat_template"):
            out.append((model, family, "tokenizer_config.json", json.loads(cfg.read_text())["chat_template"]))
        if (d / "chat_template.jinja").is_file():
            out.append((model, family, "chat_template.jinja", (d / "chat_template.jinja").read_text()))
    assert {m for m, *_ in out} == set(OFFICIAL), "some official model folder has no chat template"
    return out


@pytest.mark.parametrize("family", T.FAMILIES)
def test_build_and_special_tokens(family):
    T._CACHE.pop(family, None)  # measure a real first build
    t0 = time.perf_counter()
    tok = T.tiny_tokenizer(family)
    assert time.perf_counter() - t0 < 2.0
    bos, eos, mask, extra = EXPECTED[family]
    pad = PAD.get(family, eos)
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.mask_token) == (bos, eos, pad, mask)
    specials = ([pad, eos, bos] if family in PAD else [t for t in (bos, eos, mask) if t]) + extra
    assert tok.convert_tokens_to_ids(specials) == list(range(len(specials)))  # stable ids 0..k-1
    for s in specials:  # never split, even inside text
        assert tok.encode(f"x{s}y").count(tok.convert_tokens_to_ids(s)) == 1
        assert s not in tok.decode(tok.encode(f"x{s}y"), skip_special_tokens=True)
    assert T.TURN_END[family] in specials
    assert 400 <= len(tok) <= 600
    assert tok.encode("The answer is 42") == tok("The answer is 42")["input_ids"]  # no auto bos/eos
    assert not tok.add_bos_token and tok("hi")["input_ids"][0] != tok.bos_token_id
    assert tok is not T.tiny_tokenizer(family)  # fresh object each call


def test_llada_mask_token_not_declared_but_in_vocab():
    tok = T.tiny_tokenizer("llada")
    assert tok.mask_token is None and tok.mask_token_id is None
    assert tok.convert_tokens_to_ids("<|mdm_mask|>") == 2


@pytest.mark.parametrize("family", T.FAMILIES)
def test_single_turn_render(family):
    tok = T.tiny_tokenizer(family)
    out = tok.apply_chat_template([U("Q?")], tokenize=False, add_generation_prompt=True)
    assert out == SINGLE_TURN[family]


def test_chat_templates_match_official():
    checked = 0
    for model, family, src, official in official_templates():
        ours, ref = T.tiny_tokenizer(family), T.tiny_tokenizer(family)
        ref.chat_template = official
        thinking = [{}, {"enable_thinking": False}, {"enable_thinking": True}] if family == "sdar" else [{}]
        for conv in CONVERSATIONS:
            for gen in (True, False):
                for kw in thinking:
                    a = ours.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen, **kw)
                    b = ref.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen, **kw)
                    assert a == b, f"{model} ({src}) gen={gen} {kw} {conv}"
                    checked += 1
    assert checked >= 6 * len(CONVERSATIONS) * 2


def test_official_special_tokens_agree():
    official_templates()  # skips without the shared folder
    for model, family in OFFICIAL.items():
        cfg = json.loads((SHARED_MODELS / model / "tokenizer_config.json").read_text())
        bos, eos, mask, extra = EXPECTED[family]
        assert (cfg.get("bos_token"), cfg.get("eos_token"), cfg.get("pad_token"), cfg.get("mask_token")) == (
            bos, eos, eos, mask), model
        real = {v["content"] for v in cfg.get("added_tokens_decoder", {}).values()}
        if real:  # LLaDA2 ships its added tokens only in tokenizer.json
            assert set(extra) <= real, model


@pytest.mark.parametrize("family", T.FAMILIES)
def test_save_reload_round_trip(family, tmp_path):
    tok = T.tiny_tokenizer(family)
    tok.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path)
    text = f"Question: 2 + 3?{T.TURN_END[family]} The answer is \\boxed{{5}}.\n#### 5"
    assert back(text)["input_ids"] == tok(text)["input_ids"]
    conv = [S("sys"), U("Q?"), A("A."), U("again")]
    assert back.apply_chat_template(conv, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "mask_token", "mask_token_id"):
        assert getattr(back, attr) == getattr(tok, attr), attr
    assert back.all_special_ids == tok.all_special_ids and len(back) == len(tok)


@pytest.mark.parametrize("family", T.FAMILIES)
def test_text_round_trip(family):
    tok = T.tiny_tokenizer(family)
    for text in ["naïve 😀", "line1\nline2\n\n  indented\ttab ", "def f(x): return x+1", "日本語 ∑ x² = 0",
                 "", " leading space", f"a{T.TURN_END[family]}b<|endoftext|>"]:
        assert tok.decode(tok.encode(text)) == text


def test_unknown_family():
    with pytest.raises(ValueError) as err:
        T.tiny_tokenizer("gpt2")
    msg = str(err.value)
    assert "gpt2" in msg and all(f in msg for f in T.FAMILIES)


def test_sdar_moe_alias():
    assert T.tiny_tokenizer("sdar_moe").get_vocab() == T.tiny_tokenizer("sdar").get_vocab()
