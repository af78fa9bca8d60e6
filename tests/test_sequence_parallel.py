"""Ulysses sequence parallelism (dare/parallel.py): a real 2-process CPU run (gloo) of tests/sp_check.py checks the
logits and gradients of every family and layout (packed rows and packed RL scoring too) against the 1-process
forward, with a negative control; the in-process tests cover the errors (indivisible heads, lengths) and that
unsharded calls are plain sdpa."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dare import parallel
from dare.models import Family, tiny
from dare.parallel import SequenceParallel

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_process_ulysses_matches_full_attention():
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(_free_port()), "tests/sp_check.py"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = result.stdout + result.stderr
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    for rank in (0, 1):
        assert f"sp_check rank={rank} OK" in out, out[-3000:]
    for family in ("llada", "dream", "sdar", "llada2"):
        assert f"sp_check rank=0 {family}" in out, out[-3000:]
    assert "sp_check rank=0 sdar doubled" in out and "sp_check rank=0 llada2{'block_size': 4} doubled" in out
    assert "sp_check rank=0 dream plain packed" in out and "sp_check rank=0 sdar rl packed" in out


def test_indivisible_heads_are_refused_before_any_exchange(monkeypatch):
    sp = SequenceParallel()  # one process
    sp.size = 2
    with pytest.raises(ValueError, match="sequence length 15 is not divisible by the sequence-parallel size 2"):
        sp.chunk(15)
    monkeypatch.setattr(parallel, "_size", lambda group: 2)  # an SP group of 2, without starting one
    model, _ = tiny("llada", d_model=48, n_heads=3, n_kv_heads=3)
    model.set_attn_implementation("ulysses_sdpa")
    ids = torch.randint(10, 100, (1, 16))
    local = dict(input_ids=ids[:, :8], position_ids=torch.arange(8)[None], attention_mask=torch.zeros(1, 1, 1, 16))
    with pytest.raises(ValueError, match=r"LLaDABlock has 3 attention heads \(3 KV heads\), not divisible by the "
                                         r"sequence-parallel size 2"):
        model(**local)
    # a mask that covers neither the local keys nor sp x the local keys (e.g. a KV cache in a sharded call)
    with pytest.raises(ValueError, match=r"covers 24 keys.*expected 2 x 8"):
        model(**{**local, "attention_mask": torch.zeros(1, 1, 1, 24)})


@pytest.mark.parametrize("name", ["llada", "sdar"])
def test_unsharded_calls_are_plain_sdpa(name):
    """With the mask covering the keys it is given (one process, rollouts, KV-cached decoding), ulysses_sdpa is
    transformers' sdpa: the same model serves sharded training passes and unsharded generation."""
    model, tok = tiny(name)
    family = Family.from_pretrained(model.config, tok)
    ids = torch.randint(10, 100, (2, 12))
    attention = torch.ones_like(ids)
    attention[1, 9:] = 0
    clean = ids if family.is_block_diffusion else None
    ref = family.logits(model, ids, attention, clean_ids=clean)
    model.set_attn_implementation("ulysses_sdpa")
    assert torch.equal(family.logits(model, ids, attention, clean_ids=clean), ref)
    sp = SequenceParallel()  # one process: SP of size 1 is the plain forward
    assert sp.size == 1 and torch.equal(sp.logits(family, model, ids, attention, clean_ids=clean), ref)
    model.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="call model.set_attn_implementation"):
        sp.inputs(model, ids, attention)
