"""The hf engine (batched, seeded, prompt-major rollouts) and evaluate.py's generate/chat mode."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dare.engines import HFEngine
from dare.models import load_pretrained
from dare.sampling import SamplingConfig

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[{"role": "user", "content": "What is 2+3?"}], [{"role": "user", "content": "Name a prime number."}],
           "raw text prompt"]


@pytest.fixture(scope="module", params=["llada", "sdar"])
def engine(request):
    return HFEngine(*load_pretrained(f"tiny:{request.param}"), max_batch_size=8)


def test_prompt_major_rows_and_micro_batch_invariance(engine):
    cfg = SamplingConfig(gen_length=16)
    big = engine.generate(PROMPTS, n=2, config=cfg)
    assert big.completion_ids.shape == (6, 16)
    for i in range(3):  # temperature 0: both samples of a prompt are identical
        assert torch.equal(big.completion_ids[2 * i], big.completion_ids[2 * i + 1])
    engine.max_batch_size = 1
    try:
        small = engine.generate(PROMPTS, n=2, config=cfg)
    finally:
        engine.max_batch_size = 8
    assert torch.equal(small.completion_ids, big.completion_ids) and small.texts == big.texts
    chat = engine.tokenizer.apply_chat_template(PROMPTS[0], add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"]
    row = big.prompt_ids[0][big.prompt_mask[0].bool()].tolist()
    assert row == chat, "chat prompts go through the family's chat template"


def test_seeded_sampling_is_reproducible(engine):
    cfg = SamplingConfig(gen_length=16, temperature=1.0)
    a = engine.generate(PROMPTS[:1], n=4, config=cfg, seed=7)
    b = engine.generate(PROMPTS[:1], n=4, config=cfg, seed=7)
    c = engine.generate(PROMPTS[:1], n=4, config=cfg, seed=8)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    assert len({tuple(r.tolist()) for r in a.completion_ids}) > 1, "samples of one prompt should differ at T=1"


def test_completion_mask_stops_after_first_stop_token(engine):
    fam = engine.family

    def eos_at_the_end(module, args, out):  # EOS wins on the last 4 positions of every forward
        out[:, -4:, fam.eos_id] += 100.0
        return out

    hook = engine.model.get_output_embeddings().register_forward_hook(eos_at_the_end)
    try:
        r = engine.generate(PROMPTS, config=SamplingConfig(gen_length=16))
    finally:
        hook.remove()
    is_stop = torch.isin(r.completion_ids, torch.tensor(fam.stop_ids))
    assert is_stop.any(-1).all()
    for ids, mask in zip(r.completion_ids, r.completion_mask, strict=True):
        first = int(torch.isin(ids, torch.tensor(fam.stop_ids)).nonzero()[0])
        assert mask[: first + 1].all() and not mask[first + 1:].any()
    assert r.num_tokens == int(r.completion_mask.sum())


def test_empty_input_errors(engine):
    with pytest.raises(ValueError, match="No prompts"):
        engine.generate([])
    with pytest.raises(ValueError, match="Empty prompt"):
        engine.generate([""])


def run_cli(*args, stdin=None):
    return subprocess.run([sys.executable, str(ROOT / "evaluate.py"), *args], input=stdin, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_evaluate_generate_mode():
    res = run_cli("--model", "tiny:sdar", "--prompt", "What is 2+3?", "--gen-length", "16", "--show-order")
    assert res.returncode == 0, res.stderr
    assert "tokens/s" in res.stderr and "forward passes" in res.stderr and "decoding step per token" in res.stderr
    assert res.stdout.strip()


def test_evaluate_chat_mode_and_bad_flag():
    res = run_cli("--model", "tiny:dream", "--gen-length", "8", stdin="hello\nand again\n\n")
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("tokens/s") == 2
    bad = run_cli("--model", "tiny:llada", "--prompt", "x", "--remasking", "nope", "--gen-length", "8")
    assert bad.returncode != 0 and "Unknown remasking 'nope'" in bad.stderr
