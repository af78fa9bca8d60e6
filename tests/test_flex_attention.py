"""FlexAttention (``attn_implementation="flex_attention"``): the same logits as sdpa on every family and layout.

The model gets a ``BlockMask`` of the rule in ``dare.models.masks`` (``for_attention``) wherever sdpa gets the additive
float mask. torch has no FlexAttention backward on CPU (it raises), so these compare no-grad logits (scoring and
decoding); training through it needs a GPU (``bench/bench_flex.py`` measures both where they run).
"""

import copy
from pathlib import Path

import pytest
import torch
from conftest import BLOCK_FAMILIES, FAMILIES, load_script
from transformers.cache_utils import DynamicCache

from dare.models import Family, masks, tiny

TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def fresh_compiles():
    """Each test compiles FlexAttention afresh: after dynamo's recompile limit flex runs eagerly, which hid a kernel
    that does not compile (the flex path of diffusion_gemma on CPU passed only after other tests ran first)."""
    torch._dynamo.reset()


def pair(family: str):
    model, tok = tiny(family)
    flex = copy.deepcopy(model)
    flex.set_attn_implementation(masks.FLEX)
    return model, flex, Family.from_pretrained(model.config, tok), tok


def ids(tok, batch, length, seed=0):
    return torch.randint(20, len(tok), (batch, length), generator=torch.Generator().manual_seed(seed))


def assert_same(a, b, where):
    assert a.shape == b.shape, where
    err = (a - b).abs().max().item()
    assert err < TOLERANCE, f"{where}: flex differs from sdpa by {err:.2e}"


@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_flex_logits_equal_sdpa_in_the_plain_and_packed_layouts(family):
    sdpa, flex, fam, tok = pair(family)
    x = ids(tok, 2, 40)
    padding = torch.ones_like(x)
    padding[1, :7] = 0
    real = padding.bool()
    assert_same(fam.logits(flex, x, padding)[real], fam.logits(sdpa, x, padding)[real], "padded")
    assert_same(fam.logits(flex, x, padding, keep=9), fam.logits(sdpa, x, padding, keep=9), "keep")
    segments = torch.tensor([[0] * 13 + [1] * 20 + [2] * 7, [0] * 30 + [-1] * 10])
    assert_same(fam.logits(flex, x, segment_ids=segments), fam.logits(sdpa, x, segment_ids=segments), "packed")
    assert isinstance(masks.for_attention(torch.ones(1, 4, 4, dtype=torch.bool), torch.float32, masks.FLEX),
                      masks.BlockMask)


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
@torch.no_grad()
def test_flex_logits_equal_sdpa_in_the_doubled_layout_and_the_block_cache(family):
    sdpa, flex, fam, tok = pair(family)
    bs = fam.block_size
    x0, xt = ids(tok, 2, 4 * bs), ids(tok, 2, 4 * bs, seed=1)
    padding = torch.ones_like(x0)
    padding[0, :bs] = 0
    for keep in (None, 2 * bs):  # keep: the noisy prompt blocks are left out of the call
        a = fam.logits(flex, xt, padding, clean_ids=x0, keep=keep)
        b = fam.logits(sdpa, xt, padding, clean_ids=x0, keep=keep)
        assert_same(a[:, -bs:], b[:, -bs:], f"doubled keep={keep}")
    segments = torch.tensor([[0] * (2 * bs) + [1] * (2 * bs), [0] * (3 * bs) + [-1] * bs])
    assert_same(fam.logits(flex, xt, clean_ids=x0, segment_ids=segments),
                fam.logits(sdpa, xt, clean_ids=x0, segment_ids=segments), "doubled packed")
    prefix, steps = 3 * bs, []
    for model in (flex, sdpa):  # whole blocks cached, the next block against them
        cache = DynamicCache()
        model(x0[:, :prefix], attention_mask=padding[:, :prefix], cache=cache)
        steps.append(fam.logits(model, x0[:, prefix:], padding, cache=cache))
    assert_same(*steps, "block cache")


@pytest.mark.parametrize("family", ["llada", "dream"])
@torch.no_grad()
def test_flex_logits_equal_sdpa_with_a_prefix_cache(family):
    sdpa, flex, _, tok = pair(family)
    x, suffixes = ids(tok, 2, 24), []
    for model in (flex, sdpa):
        cache = DynamicCache()
        model(x, cache=cache)
        cache.crop(-8)
        suffixes.append(model(x[:, 16:], cache=cache).logits)
    assert_same(*suffixes, "prefix cache")


@torch.no_grad()
def test_flex_logits_equal_sdpa_on_diffusion_gemma():
    sdpa, flex, fam, _ = pair("diffusion_gemma")
    canvas, g = fam.block_size, torch.Generator().manual_seed(0)
    clean = torch.randint(8, 512, (2, 11 + 3 * canvas), generator=g)
    noisy = clean.clone()
    noisy[:, 11:] = torch.randint(8, 512, (2, 3 * canvas), generator=g)
    padding = torch.ones_like(clean)
    padding[1, -canvas:] = 0
    start = torch.tensor([11, 5])
    got = [fam.logits(m, noisy, padding, clean_ids=clean, start=start) for m in (flex, sdpa)]
    assert_same(got[0][0, 11:], got[1][0, 11:], "training layout, row 0")
    assert_same(got[0][1, 5:-canvas], got[1][1, 5:-canvas], "training layout, row 1")
    decoded = []
    for model in (flex, sdpa):  # the decoding loop: the encoder caches the prompt, the decoder reads a canvas
        cache = DynamicCache(config=model.config.get_text_config())
        model.model.encoder(input_ids=clean[:, :11], cache=cache)
        decoded.append(fam.logits(model, noisy[:, 11:11 + canvas], cache=cache))
    assert_same(*decoded, "decoding")


def test_flex_has_no_backward_on_cpu_and_says_so():
    """If a torch release adds the CPU backward, this fails: then train with flex on CPU and bench it here too."""
    _, flex, fam, tok = pair("llada")
    flex.train()
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        fam.logits(flex, ids(tok, 1, 16)).sum().backward()


def test_bench_flex_rows_agree_with_sdpa():
    bench = load_script(Path(__file__).resolve().parents[1] / "bench" / "bench_flex.py", "dare_bench_flex")
    rows = bench.main(["--hidden", "64", "--layers", "2", "--lengths", "256", "--repeats", "1"])
    assert [(r["layout"], r["path"]) for r in rows] == [("packed", "sdpa"), ("packed", "flex"), ("doubled", "sdpa"),
                                                         ("doubled", "flex")]
    assert all(r["diff"] < TOLERANCE and r["tokens_per_s"] > 0 for r in rows)
