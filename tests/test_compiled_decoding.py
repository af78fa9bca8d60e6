"""Compiled decoding, the hf engine's compile option (``--hf.compile``; ``evaluate.py --compile``): the same greedy
tokens and forward counts as eager decoding on every family it serves and every cache mode, one compilation per
micro-batch bucket, and a clear refusal where compiling changes the model."""

import pytest
import torch
from torch._dynamo.utils import counters

from dare.engines.hf import HFEngine, HFOptions
from dare.models import load_pretrained
from dare.sampling import SamplingConfig

PROMPTS = [[{"role": "user", "content": f"What is {i} + {2 * i}?"}] for i in range(5)]


def label(value) -> str:
    """A test id: the family's name, or the knobs as k=v (plain: none)."""
    return value if isinstance(value, str) else ",".join(f"{k}={x}" for k, x in value.items()) or "plain"


def peaked(name: str):
    """A tiny model whose output layer is scaled up: its confidences are far apart, so the 1e-7 rounding by which
    compiled and eager logits differ cannot flip which position a step commits (random tiny models are near ties)."""
    model, tokenizer, family = load_pretrained(f"tiny:{name}", dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(40.0)
    return model.eval(), tokenizer, family


@pytest.mark.parametrize("name, knobs", [
    ("llada", {}), ("llada", {"cache": "prefix", "block_length": 8}), ("llada", {"cache": "dual", "block_length": 8}),
    ("llada", {"threshold": 0.5, "block_length": 8}), ("dream", {}), ("dream", {"cache": "dual", "block_length": 8}),
    ("sdar", {}), ("sdar", {"cache": "none"}), ("llada2", {}), ("sdar_moe", {"threshold": 0.5})],
    ids=label)
def test_compiled_decoding_gives_the_eager_tokens_and_forward_counts(name, knobs):
    torch._dynamo.reset()
    model, tokenizer, family = peaked(name)
    config = SamplingConfig(gen_length=16, temperature=0.0, **knobs)
    eager = HFEngine(model, tokenizer, family, 8).generate(PROMPTS, 1, config, seed=0)
    graphs = counters["stats"]["unique_graphs"]
    fast = HFEngine(model, tokenizer, family, 8, HFOptions(compile=True)).generate(PROMPTS, 1, config, seed=0)
    assert counters["stats"]["unique_graphs"] > graphs  # the compiled path ran
    assert torch.equal(eager.completion_ids, fast.completion_ids) and eager.nfe == fast.nfe
    assert torch.equal(eager.step_map, fast.step_map) and eager.texts == fast.texts


def test_batches_inside_one_bucket_compile_once():
    """5, 6 and 7 rows decode as 8 (copies of the last row, dropped after), prompts of different lengths as 32
    tokens (left padding, dropped after): one set of graphs for all of them."""
    torch._dynamo.reset()
    model, tokenizer, family = peaked("llada")
    engine = HFEngine(model, tokenizer, family, 8, HFOptions(compile=True))
    config, graphs = SamplingConfig(gen_length=8, temperature=0.0), []
    for rows, prompt in ((5, "2 + 2?"), (6, "What is 12 + 30?"), (7, "What is 12 + 30 + 7, please?")):
        out = engine.generate([[{"role": "user", "content": prompt}]] * rows, 1, config, seed=0)
        assert out.completion_ids.shape[0] == rows
        assert out.prompt_ids.shape[1] == len(engine.encode([[{"role": "user", "content": prompt}]])[0])
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] > 0 and graphs[0] == graphs[1] == graphs[2], graphs
    assert engine.rows_for(5) == 8 and engine.rows_for(8) == 8 and engine.rows_for(1) == 1
    assert HFEngine(model, tokenizer, family, 6, HFOptions(compile=True)).rows_for(5) == 6  # never past the batch
    assert HFEngine(model, tokenizer, family, 8).rows_for(5) == 5  # eager: no padding
    assert engine.identity()["compiled"] == "default"  # an evaluation's fingerprint: sampled rows draw other noise
    assert "compiled" not in HFEngine(model, tokenizer, family).identity()


def test_uniform_noise_decodes_compiled_as_eager_without_padded_rows():
    """DiffusionGemma's sampler draws random canvases even greedily: the compiled engine does not pad its rows (more
    rows would draw other canvases), and decodes the eager tokens in as many forwards. The model is made confident
    (output layer x40, Gemma's logit softcap off, which would flatten it again) so that compiled kernels' rounding on
    any CPU cannot flip its entropy-based acceptance; padding the rows still changes its tokens (checked)."""
    torch._dynamo.reset()
    model, tokenizer, family = peaked("diffusion_gemma")
    model.config.get_text_config().final_logit_softcapping = None
    config = SamplingConfig(gen_length=16, temperature=0.0)
    engine = HFEngine(model, tokenizer, family, 8, HFOptions(compile=True))
    assert engine.rows_for(5) == 5
    eager = HFEngine(model, tokenizer, family, 8).generate(PROMPTS, 1, config, seed=0)
    graphs = counters["stats"]["unique_graphs"]
    fast = engine.generate(PROMPTS, 1, config, seed=0)
    assert counters["stats"]["unique_graphs"] > graphs  # the compiled path ran
    assert torch.equal(eager.completion_ids, fast.completion_ids) and eager.nfe == fast.nfe


def test_the_compiled_decoder_follows_weights_changed_in_place():
    """RL steps the policy in place between rollouts: the compiled graphs read the current weights, not a copy."""
    torch._dynamo.reset()
    model, tokenizer, family = peaked("llada")
    config = SamplingConfig(gen_length=8, temperature=0.0)
    before = HFEngine(model, tokenizer, family, 8, HFOptions(compile=True)).generate(PROMPTS, 1, config, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    eager = HFEngine(model, tokenizer, family, 8).generate(PROMPTS, 1, config, seed=0)
    after = HFEngine(model, tokenizer, family, 8, HFOptions(compile=True)).generate(PROMPTS, 1, config, seed=0)
    assert not torch.equal(before.completion_ids, eager.completion_ids)  # the change matters
    assert torch.equal(after.completion_ids, eager.completion_ids)


@pytest.mark.parametrize("name", ["llada2", "sdar_moe"])
def test_a_mixture_of_experts_compiles_to_one_graph_with_the_loops_values(name):
    """The experts' loop breaks the graph where the routing decides shapes (``unique``, ``where``: 11 graphs for
    tiny LLaDA2, nothing a GPU can capture whole); compiled, every expert runs on every token at its routing weight
    (0 where unchosen): one graph, the loop's values."""
    from dare.models.common import SparseMoE
    torch._dynamo.reset()
    model, _, _ = load_pretrained(f"tiny:{name}", dtype=torch.float32)
    moe = next(m for m in model.modules() if isinstance(m, SparseMoE))
    h = torch.randn(40, model.config.hidden_size)
    with torch.no_grad():
        weights, indices = moe.route(h)
        loop = SparseMoE.forward(moe, h)  # the routed experts only (LLaDA2 adds its shared expert after)
        assert torch.allclose(moe.every_expert(h, weights, indices), loop, atol=1e-6, rtol=1e-5)
        ids = torch.randint(10, 500, (4, 40))
        explained = torch._dynamo.explain(model)(input_ids=ids, attention_mask=torch.ones_like(ids))
        compiled = torch.compile(model, dynamic=False)(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        eager = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    print(f"{name}: {explained.graph_count} graph(s), compiled vs eager logits {(compiled - eager).abs().max():.1e}")
    assert explained.graph_count == 1 and explained.graph_break_count == 0
    assert torch.allclose(compiled, eager, atol=1e-5)


@pytest.mark.parametrize("name, knobs", [("sdar", {}), ("sdar", {"threshold": 0.5}), ("llada2", {}),
                                         ("llada2", {"editing_threshold": 0.9, "threshold": 0.5})],
                         ids=label)
def test_the_fixed_size_block_cache_decodes_the_growing_caches_tokens(name, knobs):
    """Compiled decoding's block cache (``FixedBlocks``: as wide as the canvas, unfilled columns masked, finished rows
    kept) against the growing one, eager: the same tokens, steps and forwards, with rows of different prompt lengths
    (padding) and rows that stop after their second or fourth block (a stop token given in the canvas)."""
    from dare.sampling import generate
    model, tokenizer, family = peaked(name)
    block = family.block_size
    ids = torch.randint(10, 500, (6, 2 * block + 5))
    mask = torch.ones_like(ids)
    for row, pad in enumerate((9, 3, 0, 1, 5, 0)):
        mask[row, :pad] = 0
    canvas = torch.full((6, 6 * block), family.mask_id)
    canvas[0, block + 1] = canvas[3, block] = canvas[4, 3 * block + 2] = family.stop_ids[0]
    config = SamplingConfig(gen_length=6 * block, temperature=0.0, **knobs)
    growing = generate(model, family, ids, mask, config, canvas=canvas)
    fixed = generate(model, family, ids, mask, config, canvas=canvas, fixed_shapes=True)
    decoded = (growing.step_map >= 0).sum(-1)
    print(f"{name} {knobs}: tokens decoded a row {decoded.tolist()}, {growing.nfe} forwards")
    assert torch.equal(growing.sequences, fixed.sequences) and torch.equal(growing.step_map, fixed.step_map)
    assert growing.nfe == fixed.nfe
    assert decoded.min() < decoded.max()  # rows left the growing cache early; the fixed one kept them


def test_compiled_block_decoding_traces_a_few_graphs_whatever_the_number_of_blocks():
    """A growing cache gives each block a new key length, so a compiled model traces two graphs a block (and falls
    back to eager past the recompile limit); the fixed-size one traces three for the whole decoding: the prompt
    blocks, one block, and one block with the block before it."""
    torch._dynamo.reset()
    model, tokenizer, family = peaked("sdar")
    engine = HFEngine(model, tokenizer, family, 8, HFOptions(compile=True))
    config = SamplingConfig(gen_length=8 * family.block_size, temperature=0.0, stop_at_eos=False)
    before = counters["stats"]["unique_graphs"]
    compiled = engine.generate(PROMPTS, 1, config, seed=0)
    graphs = counters["stats"]["unique_graphs"] - before
    eager = HFEngine(model, tokenizer, family, 8).generate(PROMPTS, 1, config, seed=0)
    print(f"sdar, {config.gen_length // family.block_size} blocks: {graphs} graphs compiled")
    assert torch.equal(compiled.completion_ids, eager.completion_ids) and compiled.nfe == eager.nfe
    assert graphs <= 3
