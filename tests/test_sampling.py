"""Generation for every family (dare.sampling): greedy batch invariance, the transfer schedules, parallel decoding,
cache exactness (and the measured error of the Fast-dLLM approximations), trajectory records, errors, early stop
and the shared primitives.

The tiny random models are built with ``initializer_range=0.2``: at the default init their next-token
distributions are almost uniform (max probability ~0.003 over 512 tokens), every confidence ties with every other
one to ~1e-5 and every position proposes the same token. Sharper logits (max probability ~0.03-0.3) make the
confidence ordering and the thresholds meaningful, and let a wrong token or a wrong order show.
"""

import dataclasses
import functools
import math

import pytest
import torch
from conftest import BLOCK_FAMILIES, FAMILIES

from dare.models import Family, tiny
from dare.sampling import Generation, SamplingConfig, generate
from dare.sampling import primitives as P

MASKED_FAMILIES = ("llada", "dream")
REMASKING = ("low_confidence", "entropy", "margin", "maskgit_plus")
SHARP = dict(initializer_range=0.2)


@functools.cache
def load(name: str):
    """Shared read-only ``(model, tokenizer, family)``; tests that modify a model build their own."""
    model, tok = tiny(name, **SHARP)
    return model, tok, Family.from_pretrained(model.config, tok)


def prompts(fam: Family, lengths, seed=0):
    """Left-padded batch of random ordinary tokens (no special ids) of the given lengths."""
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), fam.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, n in enumerate(lengths):
        ids[r, width - n:] = torch.randint(16, fam.vocab_size, (n,), generator=g)
        mask[r, width - n:] = 1
    return ids, mask


def chat_prompts(tok, texts):
    """Left-padded chat prompts. (transformers 5.24 silently ignores ``padding_side=`` passed directly to
    ``apply_chat_template`` and pads on the tokenizer's side, right: it must go through ``tokenizer_kwargs``.)"""
    convs = [[{"role": "user", "content": t}] for t in texts]
    enc = tok.apply_chat_template(convs, add_generation_prompt=True, return_tensors="pt", return_dict=True,
                                  padding=True, tokenizer_kwargs={"padding_side": "left"})
    assert enc["attention_mask"][:, -1].all() and not enc["attention_mask"][:, 0].all()
    return enc["input_ids"], enc["attention_mask"]


def unpadded(ids, mask, r):
    return ids[r][mask[r].bool()][None]


def order(step_map_row):
    """Dense rank of the steps: equal iff two rows fixed their tokens in the same order (with the same ties)."""
    return torch.unique(step_map_row, return_inverse=True)[1]


def same_row(a: Generation, ra: int, b: Generation, rb: int, exact_steps: bool):
    assert torch.equal(a.sequences[ra], b.sequences[rb]), (a.sequences[ra].tolist(), b.sequences[rb].tolist())
    assert torch.equal(a.block_step[ra], b.block_step[rb])
    if exact_steps:
        assert torch.equal(a.step_map[ra], b.step_map[rb])
    else:  # a block runs while ANY row has masks in it (threshold, or uneven mask counts): global numbers shift
        assert torch.equal(order(a.step_map[ra]), order(b.step_map[rb]))


def assert_batch_invariant(model, fam, ids, mask, cfg, exact_steps=True):
    batch = generate(model, fam, ids, mask, cfg)
    assert not (batch.sequences == fam.mask_id).any()
    for r in range(ids.shape[0]):
        alone = generate(model, fam, unpadded(ids, mask, r), None, cfg)
        same_row(batch, r, alone, 0, exact_steps)
    return batch


# ---------------------------------------------------------------- 1. greedy decoding is batch-invariant


@pytest.mark.parametrize("threshold", [None, 0.05])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("remasking", REMASKING)
@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_masked_greedy_batch_invariant(name, remasking, cache, threshold):
    """Temperature 0: each prompt decodes to the same tokens and step maps alone and inside a left-padded batch of
    prompts of other lengths (2 blocks of 4, 2 steps per block, so the caches run refinement steps)."""
    model, _, fam = load(name)
    ids, mask = prompts(fam, [3, 11, 6], seed=1)
    cfg = SamplingConfig(gen_length=8, block_length=4, steps=4, remasking=remasking, cache=cache,
                         threshold=threshold)
    out = assert_batch_invariant(model, fam, ids, mask, cfg, exact_steps=threshold is None)
    if threshold is None:
        assert out.nfe == 4
    else:  # a threshold fills each block in as many steps as it needs, at least one, at most its 4 masks
        assert 2 <= out.nfe <= 8


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_masked_dream_schedule_batch_invariant(name, cache):
    model, tok, fam = load(name)
    ids, mask = chat_prompts(tok, ["hi", "what is two plus two, in words?", "count to three"])
    assert len(set(mask.sum(-1).tolist())) == 3
    cfg = SamplingConfig(gen_length=16, block_length=8, steps=8, schedule="dream", remasking="entropy", cache=cache)
    assert_batch_invariant(model, fam, ids, mask, cfg)


def test_masked_cfg_batch_invariant_and_two_forwards_per_step():
    model, _, fam = load("llada")
    ids, mask = prompts(fam, [4, 9], seed=2)
    cfg = SamplingConfig(gen_length=8, block_length=4, steps=4, cfg_scale=1.0)
    out = assert_batch_invariant(model, fam, ids, mask, cfg)
    assert out.nfe == 2 * 4
    plain = generate(model, fam, ids, mask, dataclasses.replace(cfg, cfg_scale=0.0))
    assert plain.nfe == 4
    assert not torch.equal(out.sequences, plain.sequences)  # guidance changes the logits that decide


@pytest.mark.parametrize("name", FAMILIES)
def test_batch_invariance_check_sees_padding(name):
    """Control for the batch-invariance tests: if the left padding were visible (mask of ones), the padded row
    would decode differently, so those tests would catch a padding leak."""
    model, _, fam = load(name)
    ids, mask = prompts(fam, [3, 11, 6], seed=1)
    cfg = SamplingConfig(gen_length=8, block_length=4 if name in MASKED_FAMILIES else None, steps=4,
                         stop_at_eos=False)
    leaky = generate(model, fam, ids, torch.ones_like(mask), cfg)
    alone = generate(model, fam, unpadded(ids, mask, 0), None, cfg)
    assert not torch.equal(leaky.sequences[0], alone.sequences[0])


@pytest.mark.parametrize("offsets", ["aligned", "mixed"])
@pytest.mark.parametrize("threshold", [None, 0.05])
@pytest.mark.parametrize("cache", ["block", "none"])
@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_greedy_batch_invariant(name, cache, threshold, offsets):
    """Prompts with 0/1/2 full prompt blocks. "aligned": the same offset inside their last prompt block, so every
    row has as many masks per block and a static schedule numbers the steps identically. "mixed": offsets differ,
    the batch runs a block until its fullest row is done (a solo row may need fewer steps), so the global step
    numbers can shift; the tokens, the steps inside each block and the order of the steps may not."""
    model, _, fam = load(name)
    b = fam.block_size
    lengths = [5, b + 5, 2 * b + 5] if offsets == "aligned" else [5, b + 6, 2 * b + 3]
    ids, mask = prompts(fam, lengths, seed=3)
    length, steps = (12, 4) if b == 4 else (40, 8)
    cfg = SamplingConfig(gen_length=length, steps=steps, cache=cache, threshold=threshold, stop_at_eos=False)
    out = assert_batch_invariant(model, fam, ids, mask, cfg, exact_steps=threshold is None and offsets == "aligned")
    assert (out.step_map >= 0).all()
    assert not (out.sequences == fam.mask_id).any()


class StopsAfter17(torch.nn.Module):
    """The model, but a row whose input to this forward holds token 17 gets EOS's logit raised everywhere: with the
    block grid the same alone and in a batch, a row whose last (partial-block) prompt token is 17 stops in its first
    decoded block, alone or batched. Records how many rows each forward was fed."""

    def __init__(self, model, eos_id):
        super().__init__()
        self.model, self.eos_id, self.rows_fed = model, eos_id, []

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.model, name)

    def forward(self, input_ids, **kwargs):
        self.rows_fed.append(input_ids.shape[0])
        out = self.model(input_ids=input_ids, **kwargs)
        out.logits[(input_ids == 17).any(-1), :, self.eos_id] += 50.0
        return out


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_masked_rows_done_with_their_block_sit_out(name, cache):
    """Threshold decoding (rule "one") finishes a block's rows at different steps: a row with no masks left in the
    block is not fed again until the next block's full pass, and every row still decodes as it does alone."""
    model, _, fam = load(name)
    ids, mask = prompts(fam, [3, 6, 9], seed=8)
    ids[ids == 17] = 18  # StopsAfter17 only counts rows here
    cfg = SamplingConfig(gen_length=16, block_length=8, steps=16, threshold=0.05, threshold_rule="one", cache=cache)
    counter = StopsAfter17(model, fam.eos_id)
    out = generate(counter, fam, ids, mask, cfg)
    assert min(counter.rows_fed) < 3 and max(counter.rows_fed) == 3, counter.rows_fed
    assert not (out.sequences == fam.mask_id).any()
    for r in range(3):
        same_row(out, r, generate(model, fam, unpadded(ids, mask, r), None, cfg), 0, exact_steps=False)


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_masked_full_pass_feeds_each_distinct_canvas_once(name, cache, monkeypatch):
    """A full pass feeds each distinct row once: a GRPO group's completions share one canvas until their first
    commit (greedy ones all along). Sampled, the completions, steps and forwards are those of feeding every row, and
    a group's rows still diverge; greedy, every row decodes as it does alone."""
    model, _, fam = load(name)
    ids, mask = prompts(fam, [3, 6], seed=8)
    ids[ids == 17] = 18  # StopsAfter17 only counts rows here
    order = torch.tensor([1, 0, 1, 1, 0, 0])  # interleaved groups: the distinct rows come back sorted
    ids, mask = ids[order], mask[order]
    cfg = SamplingConfig(gen_length=16, block_length=8, steps=16, temperature=1.0, threshold=0.05, cache=cache)
    counter = StopsAfter17(model, fam.eos_id)
    shared = generate(counter, fam, ids, mask, cfg, torch.Generator().manual_seed(5))
    assert counter.rows_fed[0] == 2 and max(counter.rows_fed) == 6, counter.rows_fed
    with monkeypatch.context() as m:  # every row distinct: the full passes feed the whole batch
        m.setattr(torch, "unique", lambda rows, **_: (rows, torch.arange(len(rows))))
        counter.rows_fed.clear()
        every = generate(counter, fam, ids, mask, cfg, torch.Generator().manual_seed(5))
        assert counter.rows_fed[0] == 6
    assert torch.equal(shared.sequences, every.sequences) and torch.equal(shared.step_map, every.step_map)
    assert shared.nfe == every.nfe
    assert len({tuple(row.tolist()) for row in shared.sequences[order == 1]}) > 1

    greedy = dataclasses.replace(cfg, temperature=0.0)
    counter.rows_fed.clear()
    out = generate(counter, fam, ids, mask, greedy)
    if cache == "none":  # every forward is a full pass
        assert max(counter.rows_fed) == 2, counter.rows_fed
    for r in (0, 1):
        same_row(out, r, generate(model, fam, unpadded(ids, mask, r), None, greedy), 0, exact_steps=False)


@pytest.mark.parametrize("short", [False, True])
@pytest.mark.parametrize("threshold", [None, 0.05])
@pytest.mark.parametrize("cache", ["block", "none"])
@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_finished_rows_leave_the_batch(name, cache, threshold, short):
    """A row that holds a stop token after a block is no longer fed to the model (nor kept in its cache), and every
    row, the stopped one and those decoding on, equals its solo run. ``short``: no prompt fills a block, so the
    cache is empty (cropped to no positions) when the row leaves."""
    model, _, fam = load(name)
    b = fam.block_size
    ids, mask = prompts(fam, [b - 2, b - 1, b - 1] if short else [b + 2, b + 3, 2 * b + 1], seed=5)
    ids[ids == 17] = 18
    ids[0, -1] = 17
    cfg = SamplingConfig(gen_length=4 * b, steps=2 if b == 4 else 4, cache=cache, threshold=threshold)
    stopper = StopsAfter17(model, fam.eos_id)
    batch = generate(stopper, fam, ids, mask, cfg)
    stopped = torch.isin(batch.sequences, torch.tensor(fam.stop_ids)).any(-1)
    assert stopped[0] and not stopped.all(), batch.sequences
    assert stopper.rows_fed[0] == 3 and stopper.rows_fed[-1] < 3, stopper.rows_fed
    for r in range(3):
        same_row(batch, r, generate(stopper, fam, unpadded(ids, mask, r), None, cfg), 0, exact_steps=False)


@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_group_prefills_its_prompt_once(name):
    """The completions of one prompt share its full prompt blocks: the prefill is fed each distinct prompt once, and
    every row decodes greedily as it does alone; sampling, the rows of a group share K/V, not draws."""
    model, _, fam = load(name)
    b = fam.block_size
    ids, mask = prompts(fam, [2 * b + 1, 3 * b + 2], seed=6)
    ids[ids == 17] = 18  # StopsAfter17 only counts rows here
    group = ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0)
    stopper = StopsAfter17(model, fam.eos_id)
    for temperature in (0.0, 1.0):
        cfg = SamplingConfig(gen_length=2 * b, steps=2 if b == 4 else 4, cache="block", temperature=temperature,
                             stop_at_eos=False)
        stopper.rows_fed.clear()
        shared = generate(stopper, fam, *group, cfg, torch.Generator().manual_seed(3))
        assert stopper.rows_fed[0] == 2 and set(stopper.rows_fed[1:]) == {6}, stopper.rows_fed
    for r in range(6):
        greedy = SamplingConfig(gen_length=2 * b, steps=2 if b == 4 else 4, cache="block", stop_at_eos=False)
        same_row(generate(model, fam, *group, greedy), r, generate(model, fam, unpadded(*group, r), None, greedy), 0,
                 exact_steps=False)
    assert len({tuple(row.tolist()) for row in shared.sequences[:3]}) > 1  # the last run sampled


@pytest.mark.parametrize("cache", ["none", "block"])
@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_rows_ending_in_different_blocks(name, cache):
    """Prompts of b and b-1 tokens, gen_length b-1: row 0 generates b..2b-2 and ends inside block 1, row 1
    generates 2b-1..3b-3, so the batch still decodes block 2 (b-2 masks, 2 steps) where row 0 is only padding."""
    model, _, fam = load(name)
    b = fam.block_size
    ids, mask = prompts(fam, [b, b - 1], seed=17)
    cfg = SamplingConfig(gen_length=b - 1, steps=2, cache=cache, stop_at_eos=False)
    assert_batch_invariant(model, fam, ids, mask, cfg, exact_steps=False)


# ---------------------------------------------------------------- random choices are reproducible


@pytest.mark.parametrize("kind", ["random", "origin", "temperature"])
@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_masked_random_decoding_reproducible_with_seed(name, kind):
    model, _, fam = load(name)
    ids, mask = prompts(fam, [3, 7], seed=4)
    cfg = {"random": SamplingConfig(gen_length=16, steps=8, remasking="random"),
           "origin": SamplingConfig(gen_length=16, steps=8, remasking="origin", schedule="dream"),
           "temperature": SamplingConfig(gen_length=16, steps=8, temperature=1.0)}[kind]
    runs = [generate(model, fam, ids, mask, cfg, torch.Generator().manual_seed(s)) for s in (7, 7, 8)]
    for out in runs:
        assert not (out.sequences == fam.mask_id).any()
        assert ((out.step_map >= 0) & (out.step_map < 8)).all()
    assert torch.equal(runs[0].sequences, runs[1].sequences) and torch.equal(runs[0].step_map, runs[1].step_map)
    assert not (torch.equal(runs[0].sequences, runs[2].sequences) and torch.equal(runs[0].step_map, runs[2].step_map))


@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_sampling_reproducible_with_seed(name):
    model, _, fam = load(name)
    ids, mask = prompts(fam, [5, 9], seed=4)
    cfg = SamplingConfig(gen_length=8, steps=4, temperature=1.0, top_k=50, stop_at_eos=False)
    runs = [generate(model, fam, ids, mask, cfg, torch.Generator().manual_seed(s)) for s in (7, 7, 8)]
    assert torch.equal(runs[0].sequences, runs[1].sequences) and torch.equal(runs[0].step_map, runs[1].step_map)
    assert not torch.equal(runs[0].sequences, runs[2].sequences)


# ---------------------------------------------------------------- 3. schedules


@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_linear_schedule_counts_one_block(name):
    model, _, fam = load(name)
    ids, mask = prompts(fam, [4, 8], seed=5)
    out = generate(model, fam, ids, mask, SamplingConfig(gen_length=12, block_length=12, steps=5, schedule="linear"))
    for r in range(2):
        assert torch.bincount(out.step_map[r], minlength=5).tolist() == [3, 3, 2, 2, 2]
    assert torch.equal(out.block_step, out.step_map)
    assert out.nfe == 5


@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_linear_schedule_semi_autoregressive_blocks_in_order(name):
    """15 tokens, 3 blocks of 5, 6 steps: 2 steps per block commit 3 then 2; block b is finished before b+1."""
    model, _, fam = load(name)
    ids, mask = prompts(fam, [4, 8], seed=5)
    out = generate(model, fam, ids, mask, SamplingConfig(gen_length=15, block_length=5, steps=6, schedule="linear"))
    for r in range(2):
        assert torch.bincount(out.step_map[r], minlength=6).tolist() == [3, 2, 3, 2, 3, 2]
        blocks = out.step_map[r].view(3, 5)
        assert (blocks.max(-1).values[:-1] < blocks.min(-1).values[1:]).all()
        assert torch.equal(out.block_step[r].view(3, 5), blocks - 2 * torch.arange(3)[:, None])


def test_family_default_schedule_and_remasking():
    """Unset knobs take the family's own rule: Dream's linspace schedule with entropy, LLaDA's even split."""
    model, _, fam = load("dream")
    ids, mask = prompts(fam, [4], seed=5)
    default = generate(model, fam, ids, mask, SamplingConfig(gen_length=12, steps=5))
    explicit = generate(model, fam, ids, mask, SamplingConfig(gen_length=12, steps=5, schedule="dream",
                                                              remasking="entropy"))
    assert torch.equal(default.step_map, explicit.step_map)
    assert torch.bincount(default.step_map[0], minlength=5).tolist() == dream_counts(12, 5)
    llada, _, lfam = load("llada")
    assert (lfam.schedule, lfam.remasking, fam.schedule, fam.remasking) == ("linear", "low_confidence", "dream",
                                                                            "entropy")


def dream_counts(masked: int, steps: int, eps: float = 1e-3) -> list[int]:
    """Dream's schedule computed independently: floor(left * (1 - s/t)) over linspace(1, eps, steps + 1), the last
    step takes all that is left."""
    ts = [1 + (eps - 1) * i / steps for i in range(steps + 1)]
    counts, left = [], masked
    for j in range(steps):
        n = left if j == steps - 1 else math.floor(left * (1 - ts[j + 1] / ts[j]))
        counts.append(n)
        left -= n
    return counts


def test_dream_counts_helper_matches_hand_values():
    assert dream_counts(16, 8) == [1, 2, 2, 2, 2, 2, 2, 3]


@pytest.mark.parametrize("gen_length,block_length,steps", [(16, 16, 8), (16, 8, 8), (12, 12, 12)])
@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_dream_schedule_counts(name, gen_length, block_length, steps):
    model, _, fam = load(name)
    ids, mask = prompts(fam, [4, 8], seed=6)
    cfg = SamplingConfig(gen_length=gen_length, block_length=block_length, steps=steps, schedule="dream",
                         remasking="entropy")
    out = generate(model, fam, ids, mask, cfg)
    n_blocks = gen_length // block_length
    per_block = steps // n_blocks
    expected = dream_counts(block_length, per_block) * n_blocks
    assert 0 in dream_counts(12, 12)  # the (12, 12, 12) case has steps that commit nothing
    for r in range(2):
        assert torch.bincount(out.step_map[r], minlength=steps).tolist() == expected
    assert not (out.sequences == fam.mask_id).any()


def official_block_counts(masks: int, block: int, steps: int) -> list[int]:
    """SDAR generate.py / LLaDA2 generate: ``get_num_transfer_tokens(block_length, steps)`` (the even split of the
    BLOCK SIZE, remainder first), each step committing ``min(n_j, masks left)`` (LLaDA2's cap)."""
    quota = [block // steps + (1 if j < block % steps else 0) for j in range(steps)]
    counts, left = [], masks
    for q in quota:
        counts.append(min(q, left))
        left -= counts[-1]
    return counts


@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_schedule_and_block_order(name):
    """M1 + M3 from the official rule: the canvas runs to the end of the block holding the last generated token and
    that block is decoded whole (the replay view shows it; the output is cut to gen_length); each block's step j
    commits ``min(n_j, left)`` with ``n_j`` the split of the block SIZE (a prompt that fills part of the first block
    does not change the counts); blocks strictly in order, block_step in 0..steps-1, nominal global steps."""
    model, _, fam = load(name)
    b = fam.block_size
    lengths = [5, b + 2, 2 * b]
    ids, mask = prompts(fam, lengths, seed=7)
    steps = 3
    gen_length = 2 * b + 3
    out = generate(model, fam, ids, mask, SamplingConfig(gen_length=gen_length, steps=steps, stop_at_eos=False))
    assert ((out.block_step >= 0) & (out.block_step < steps)).all()
    for r, p_len in enumerate(lengths):
        end = -(-(p_len + gen_length) // b) * b
        decoded = out.replay_step[r] >= 0
        assert int(decoded.sum()) == end - p_len and decoded[:end - p_len].all()  # whole last block decoded
        assert torch.equal(out.replay_ids[r, :gen_length], out.sequences[r])
        block_of = (p_len + torch.arange(decoded.shape[0]))[decoded] // b
        local = out.replay_step[r][decoded]
        for blk in block_of.unique().tolist():
            sel = block_of == blk
            assert torch.bincount(local[sel], minlength=steps).tolist() == official_block_counts(int(sel.sum()), b,
                                                                                                 steps)
        first_block = (p_len + torch.arange(gen_length)) // b - p_len // b  # k-th decoded block owns k*steps..
        assert torch.equal(out.step_map[r], first_block * steps + out.block_step[r])


# ---------------------------------------------------------------- 4. parallel decoding


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_masked_threshold_above_one_equals_sequential(name, cache):
    """threshold 1.01: nothing passes, only the forced top-1 commits, i.e. one token per step = steps=gen_length."""
    model, _, fam = load(name)
    ids, mask = prompts(fam, [3, 9], seed=8)
    llada_style = dict(schedule="linear", remasking="low_confidence")
    par = generate(model, fam, ids, mask, SamplingConfig(gen_length=8, block_length=4, steps=2, cache=cache,
                                                         threshold=1.01, **llada_style))
    seq = generate(model, fam, ids, mask, SamplingConfig(gen_length=8, block_length=4, steps=8, cache=cache,
                                                         **llada_style))
    assert torch.equal(par.sequences, seq.sequences)
    assert torch.equal(par.step_map, seq.step_map) and torch.equal(par.block_step, seq.block_step)
    assert par.nfe == seq.nfe == 8
    assert (torch.sort(par.step_map, -1).values == torch.arange(8)).all()


@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_masked_low_threshold_commits_blocks_in_parallel(name):
    model, _, fam = load(name)
    ids, mask = prompts(fam, [3, 9], seed=8)
    lc = dict(remasking="low_confidence", threshold_rule="one")
    everything = generate(model, fam, ids, mask, SamplingConfig(gen_length=8, block_length=4, threshold=0.0, **lc))
    assert everything.nfe == 2 and everything.step_map.view(2, 2, 4).tolist() == [[[0] * 4, [1] * 4]] * 2
    some = generate(model, fam, ids, mask, SamplingConfig(gen_length=8, block_length=4, threshold=0.03, **lc))
    assert 2 < some.nfe < 8  # the sharp tiny models have confidences on both sides of 0.03


@pytest.mark.parametrize("cache", ["block", "none"])
@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_threshold_above_one_equals_static_one_per_step(name, cache):
    model, _, fam = load(name)
    ids, mask = prompts(fam, [5, 10], seed=9)
    length = 8 if fam.block_size == 4 else 36
    common = dict(gen_length=length, cache=cache, stop_at_eos=False)
    par = generate(model, fam, ids, mask, SamplingConfig(steps=2, threshold=1.01, threshold_rule="one", **common))
    seq = generate(model, fam, ids, mask, SamplingConfig(steps=fam.block_size, **common))
    assert torch.equal(par.sequences, seq.sequences)
    assert torch.equal(par.step_map, seq.step_map) and torch.equal(par.block_step, seq.block_step)
    for r in range(2):
        assert torch.bincount(par.step_map[r]).max() == 1


@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_threshold_rule_schedule(name):
    """threshold_rule='schedule' (SDAR dynamic, the block families' default): a step commits all above the threshold if
    at least the scheduled count passes, else the top scheduled count: a threshold nothing reaches is the static
    schedule, one everything reaches fills each block in one step."""
    model, _, fam = load(name)
    ids, mask = prompts(fam, [5, 10], seed=9)
    common = dict(gen_length=8 if fam.block_size == 4 else 36, steps=4, stop_at_eos=False)
    static = generate(model, fam, ids, mask, SamplingConfig(**common))
    never = generate(model, fam, ids, mask, SamplingConfig(threshold=1.01, threshold_rule="schedule", **common))
    same_row(static, 0, never, 0, False)  # same tokens and block steps (global step slots: steps vs block size)
    same_row(static, 1, never, 1, False)
    always = generate(model, fam, ids, mask, SamplingConfig(threshold=0.0, threshold_rule="schedule", **common))
    assert (always.block_step == 0).all()


# ---------------------------------------------------------------- 5. caches


@pytest.mark.parametrize("threshold", [None, 0.05])
@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_cache_is_exact(name, threshold):
    model, _, fam = load(name)
    b = fam.block_size
    ids, mask = prompts(fam, [b + 3, 2, 2 * b + 1], seed=10)
    cfg = SamplingConfig(gen_length=12 if b == 4 else 40, steps=4, threshold=threshold, stop_at_eos=False)
    cached = generate(model, fam, ids, mask, dataclasses.replace(cfg, cache="block"))
    plain = generate(model, fam, ids, mask, dataclasses.replace(cfg, cache="none"))
    assert torch.equal(cached.sequences, plain.sequences)
    assert torch.equal(cached.step_map, plain.step_map) and torch.equal(cached.block_step, plain.block_step)
    assert cached.nfe == plain.nfe + 1  # the full prompt blocks are prefilled once; the denoising steps agree


def block_causal_as_masked():
    """The tiny SDAR model (block-causal attention, block 4) driven by the masked-diffusion sampler: with prompts
    of 4k tokens and blocks of 4k, a position's K/V never depend on later tokens, so the Fast-dLLM caches are exact
    on this model and any difference from cache='none' is a bug in the cache mechanics."""
    model, _, fam = load("sdar")
    return model, dataclasses.replace(fam, block_size=None)


def block_aligned_prompts(fam):
    return prompts(fam, [4, 12, 8], seed=11)


CACHE_CASES = [(16, 8, 8, None), (16, 4, 8, None), (16, 8, 4, None), (16, 16, 8, None), (16, 8, 2, 0.05)]


@pytest.mark.parametrize("cache,gen_length,block_length,steps,threshold", [
    *[("prefix", *case) for case in CACHE_CASES],
    *[("dual", *case) for case in CACHE_CASES],
    *[("dual+vicinity", *case) for case in CACHE_CASES]])
def test_masked_caches_exact_on_block_causal_model(cache, gen_length, block_length, steps, threshold):
    model, fam = block_causal_as_masked()
    ids, mask = block_aligned_prompts(fam)
    cfg = SamplingConfig(gen_length=gen_length, block_length=block_length, steps=steps, threshold=threshold)
    plain = generate(model, fam, ids, mask, cfg)
    cache, vicinity = (cache.split("+")[0], 3) if "+" in cache else (cache, 0)
    cached = generate(model, fam, ids, mask, dataclasses.replace(cfg, cache=cache, vicinity=vicinity))
    assert torch.equal(cached.sequences, plain.sequences)
    assert torch.equal(cached.step_map, plain.step_map) and torch.equal(cached.block_step, plain.block_step)
    assert cached.nfe == plain.nfe


class CacheProbe:
    """Wraps a model for the masked sampler. At the first cached call after block k's full pass it rebuilds the
    current canvas (the block's full-pass input with the fed chunk written at the block's start, one position
    earlier for a shifted family), runs an exact full forward and records, per row, ``err`` = max |cached - exact|
    and ``moved`` = max |block-start - exact| over the block's logits: how far the exact logits moved since the
    cache was filled, i.e. the error of not refreshing anything."""

    def __init__(self, model, fam, gen_length, block):
        self.model, self.shift, self.gen_length, self.block = model, int(fam.shift), gen_length, block
        self.err, self.moved, self.blocks_seen, self.fresh = [], [], 0, False

    def __call__(self, input_ids, attention_mask=None, position_ids=None, cache=None, key_position_ids=None,
                 logits_to_keep=0):
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                         key_position_ids=key_position_ids)
        whole, out.logits = out.logits, out.logits[:, logits_to_keep] if torch.is_tensor(logits_to_keep) else out.logits
        self.probe(input_ids, attention_mask, cache, whole)
        return out

    def probe(self, input_ids, attention_mask, cache, logits):
        if cache is None or cache.get_seq_length() == input_ids.shape[1]:  # a block's full pass
            self.canvas, self.attn, self.start_logits = input_ids, attention_mask, logits
            self.fresh, self.blocks_seen = True, self.blocks_seen + 1
            return
        if not self.fresh:
            return
        self.fresh = False
        first = self.canvas.shape[1] - self.gen_length + (self.blocks_seen - 1) * self.block - self.shift
        canvas = self.canvas.clone()
        canvas[:, first:first + input_ids.shape[1]] = input_ids
        exact = self.model(input_ids=canvas, attention_mask=self.attn).logits[:, first:first + self.block]
        self.err += (logits[:, :self.block] - exact).abs().amax((1, 2)).tolist()
        self.moved += (self.start_logits[:, first:first + self.block] - exact).abs().amax((1, 2)).tolist()


@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_cache_logits_exact_on_block_causal_model(cache):
    """Logit level, one block of 16 (so no later block for the dual cache's position issue): every row's first
    refinement step through the cache equals a full forward of the current canvas, although the canvas moved."""
    model, fam = block_causal_as_masked()
    ids, mask = block_aligned_prompts(fam)
    probe = CacheProbe(model, fam, 16, 16)
    generate(probe, fam, ids, mask, SamplingConfig(gen_length=16, steps=8, cache=cache))
    assert len(probe.err) == 3 and max(probe.moved) > 0.1
    assert max(probe.err) < 1e-5


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_masked_cache_approximation_is_bounded(name, cache):
    """For the bidirectional LLaDA / Dream the Fast-dLLM caches are APPROXIMATIONS: the cached K/V (the prefix's,
    and for dual also the later masked blocks') were computed before the current block changed, so they are not
    exact. Bound the error of each block's first refinement step relative to how far the exact logits moved since
    the cache was filled (the error of reusing the block-start logits).

    Measured ratio err/moved over 4 rows x 4 blocks (gen 32, blocks of 8, 2 steps per block), these sharp models:
    mean 0.19 / max 0.34 (llada prefix), 0.28 / 0.61 (llada dual), 0.18 / 0.32 (dream prefix), 0.20 / 0.54
    (dream dual); over prompt seeds 12-14 the means stay within 0.17-0.28. Deliberately broken dual caches give
    means of 0.33-0.46 (stale block rows left visible) and 0.51-0.63 (query positions off by one). (Default-init
    tiny models: means 0.06 prefix / 0.10 dual, maxima <= 0.17, but they cannot see an off-by-one position.)"""
    model, _, fam = load(name)
    ids, mask = prompts(fam, [5, 9, 13, 17], seed=12)
    probe = CacheProbe(model, fam, 32, 8)
    out = generate(probe, fam, ids, mask, SamplingConfig(gen_length=32, block_length=8, steps=8, cache=cache))
    assert not (out.sequences == fam.mask_id).any()
    assert len(probe.err) == 4 * 4
    ratios = [e / m for e, m in zip(probe.err, probe.moved, strict=True)]
    mean = sum(ratios) / len(ratios)
    assert 0.05 < mean < 0.3, mean  # really an approximation, and a good one
    assert max(ratios) < 0.7, max(ratios)


@pytest.mark.parametrize("threshold", [None, 0.05])
@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_a_vicinity_covering_the_canvas_is_plain_decoding(name, threshold):
    """dInfer's vicinity refresh recomputes W positions on each side of the block at every dual-cache step: with W
    as wide as the canvas every step recomputes everything, so the tokens, steps and forwards are plain decoding's,
    which the dual cache alone (W = 0) does not give on these bidirectional models."""
    model, _, fam = load(name)
    ids, mask = prompts(fam, [5, 9, 13], seed=12)
    cfg = SamplingConfig(gen_length=32, block_length=8, steps=16, threshold=threshold)
    plain = generate(model, fam, ids, mask, cfg)
    wide = generate(model, fam, ids, mask, dataclasses.replace(cfg, cache="dual", vicinity=13 + 32))
    dual = generate(model, fam, ids, mask, dataclasses.replace(cfg, cache="dual"))
    assert torch.equal(wide.sequences, plain.sequences) and torch.equal(wide.step_map, plain.step_map)
    assert wide.nfe == plain.nfe
    assert not torch.equal(dual.sequences, plain.sequences)


# ---------------------------------------------------------------- 6. trajectories


@pytest.mark.parametrize("threshold", [None, 0.05])
@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("name", MASKED_FAMILIES)
def test_masked_states_replay_step_map(name, cache, threshold):
    model, _, fam = load(name)
    ids, mask = prompts(fam, [3, 8], seed=13)
    cfg = SamplingConfig(gen_length=8, block_length=4, steps=4, cache=cache, threshold=threshold,
                         record_states=True)
    out = generate(model, fam, ids, mask, cfg)
    n_steps = int(out.step_map.max()) + 1
    assert len(out.states) == n_steps == out.nfe
    if threshold is None:
        assert n_steps == 4
    for g, state in enumerate(out.states):
        expected = torch.where(out.step_map <= g, out.sequences, fam.mask_id)
        assert torch.equal(state, expected), g
    assert torch.equal(out.states[-1], out.sequences)


def eos_biased(name, bias, token=None):
    """A fresh sharp tiny model whose LM head adds ``bias`` to one token's logit (EOS by default)."""
    model, tok = tiny(name, **SHARP)
    fam = Family.from_pretrained(model.config, tok)
    token = fam.eos_id if token is None else token
    add = torch.zeros(fam.vocab_size)
    add[token] = bias
    model.get_output_embeddings().register_forward_hook(lambda module, args, out: out + add)
    return model, fam


STOP_BIAS = {"sdar": 4.0, "sdar_moe": 5.0, "llada2": 5.0}


@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_states_replay_step_map(name):
    model, fam = eos_biased(name, STOP_BIAS[name])
    b = fam.block_size
    ids, mask = prompts(fam, [5, b + 2, 2], seed=14)
    out = generate(model, fam, ids, mask, SamplingConfig(gen_length=4 * b, steps=2, record_states=True))
    assert (out.step_map == -1).any()  # some padding after an early stop
    assert len(out.states) == out.nfe - 1  # one forward per step plus the prefill of the full prompt blocks
    blank = torch.where(out.step_map < 0, fam.pad_id, fam.mask_id)
    for g, state in enumerate(out.states):
        expected = torch.where((out.step_map >= 0) & (out.step_map <= g), out.sequences, blank)
        assert torch.equal(state, expected), g
    assert torch.equal(out.states[-1], out.sequences)


# ---------------------------------------------------------------- 8. early stop (block families)


def first_stop(row, stop_ids):
    hits = torch.isin(row, torch.tensor(stop_ids)).nonzero()
    return int(hits[0]) if len(hits) else None


@pytest.mark.parametrize("which", ["eos", "turn_end"])
@pytest.mark.parametrize("name", BLOCK_FAMILIES)
def test_block_stop_at_eos(name, which):
    fam = load(name)[2]
    token = fam.eos_id if which == "eos" else fam.stop_ids[1]
    model, fam = eos_biased(name, STOP_BIAS[name], token)
    b = fam.block_size
    ids, mask = prompts(fam, [5, b + 2, 3], seed=15)
    length = (6 if b == 4 else 3) * b
    cfg = SamplingConfig(gen_length=length, steps=b // 2)
    stop = generate(model, fam, ids, mask, cfg)
    full = generate(model, fam, ids, mask, dataclasses.replace(cfg, stop_at_eos=False))
    assert stop.nfe < full.nfe
    assert not (full.step_map < 0).any()
    for r in range(3):
        k = first_stop(stop.sequences[r], fam.stop_ids)
        assert k is not None and k < length - b, k  # stopped before the last block
        assert stop.lengths[r] == k + 1
        assert (stop.sequences[r, k + 1:] == fam.pad_id).all() and (stop.step_map[r, k + 1:] == -1).all()
        assert (stop.block_step[r, k + 1:] == -1).all() and (stop.step_map[r, :k + 1] >= 0).all()
        assert not (stop.sequences[r] == fam.mask_id).any()
        # the stop only truncates: up to the stop token the decoding is the one without stopping
        assert torch.equal(stop.sequences[r, :k + 1], full.sequences[r, :k + 1])
        assert torch.equal(stop.step_map[r, :k + 1], full.step_map[r, :k + 1])
        assert first_stop(full.sequences[r], fam.stop_ids) == k
    assert (stop.sequences == token).any()


def test_suppress_eos_never_proposes_eos():
    model, fam = eos_biased("llada", 6.0)
    ids, mask = prompts(fam, [3, 6], seed=16)
    cfg = SamplingConfig(gen_length=8, steps=4)
    assert (generate(model, fam, ids, mask, cfg).sequences == fam.eos_id).any()
    assert not (generate(model, fam, ids, mask, dataclasses.replace(cfg, suppress_eos=True)).sequences
                == fam.eos_id).any()


@pytest.mark.parametrize("name", FAMILIES)
def test_mask_token_is_never_committed(name):
    """A model that puts most of its mass on the mask token: a committed mask id would stay in the output (masked
    families track masked positions separately) or turn into a hole with step -1 (block families)."""
    fam = load(name)[2]
    model, fam = eos_biased(name, 8.0, token=fam.mask_id)
    ids, mask = prompts(fam, [3, 6], seed=18)
    b = fam.block_size or 4
    steps = 4 if fam.causal_block else 2  # Nemotron: a block's first token takes a step of its own
    out = generate(model, fam, ids, mask, SamplingConfig(gen_length=2 * b, block_length=None if fam.block_size else b,
                                                         steps=steps, stop_at_eos=False))
    assert not (out.sequences == fam.mask_id).any()
    assert (out.step_map >= 0).all() and (out.lengths == 2 * b).all()


# ---------------------------------------------------------------- 7. errors


@pytest.mark.parametrize("name,cfg,words", [
    ("llada", dict(gen_length=10, block_length=4), ["gen_length", "10", "block_length", "4"]),
    ("dream", dict(gen_length=8, steps=9), ["steps", "9", "8"]),
    ("llada", dict(gen_length=8, block_length=4, steps=3), ["steps", "3", "multiple", "2"]),
    ("sdar", dict(gen_length=8, steps=5), ["steps", "5", "block size", "4"]),
    ("llada2", dict(gen_length=8, steps=33), ["steps", "33", "32"]),
    ("sdar", dict(gen_length=8, block_length=8), ["block_length", "8", "4"]),
    ("llada", dict(gen_length=8, cfg_scale=1.0, cache="prefix"), ["guidance", "cache"]),
    ("dream", dict(gen_length=8, cfg_scale=1.0, cache="dual"), ["guidance", "cache"]),
    ("llada", dict(gen_length=8, cache="block"), ["cache", "prefix", "dual"]),
    ("sdar", dict(gen_length=8, cache="prefix"), ["cache", "block", "none"]),
    ("llada", dict(gen_length=8, cache="prefix", vicinity=4), ["vicinity", "dual"]),
    ("sdar", dict(gen_length=8, vicinity=4), ["vicinity", "block cache"]),
    ("llada", dict(gen_length=8, cache="dual", vicinity=-1), ["vicinity", ">= 0", "-1"]),
    ("llada", dict(gen_length=8, remasking="lowest_confidence"),
     ["lowest_confidence", "low_confidence", "entropy", "margin", "random"]),
    ("sdar", dict(gen_length=8, cache="paged"), ["paged", "prefix", "dual", "block"]),
    ("llada", dict(gen_length=8, schedule="cosine"), ["cosine", "linear", "dream"]),
    ("llada", dict(gen_length=8, remasking="origin"), ["origin", "dream"]),
    ("llada", dict(gen_length=8, threshold=0.9, factor=1.0), ["threshold", "factor"]),
])
def test_clear_errors(name, cfg, words):
    model, _, fam = load(name)
    ids, mask = prompts(fam, [3], seed=0)
    with pytest.raises(ValueError) as err:
        generate(model, fam, ids, mask, SamplingConfig(**cfg))
    for word in words:
        assert word in str(err.value), (word, str(err.value))


# ---------------------------------------------------------------- 9. primitives


def test_filter_logits_top_k_and_top_p():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    inf = float("-inf")
    assert P.filter_logits(logits, top_k=2).tolist() == [[inf, 3.0, 2.0, inf]]
    assert torch.equal(P.filter_logits(logits, top_k=4), logits)
    # probabilities 0.05 / 0.5 / 0.3 / 0.15 in shuffled order: sorted 0.5, 0.3, 0.15, 0.05
    probs = torch.tensor([[0.05, 0.5, 0.3, 0.15]])
    lp = probs.log()
    kept = lambda p: torch.isfinite(P.filter_logits(lp, top_p=p))[0].tolist()
    assert kept(0.1) == [False, True, False, False]  # the first token alone exceeds p: kept on its own
    assert kept(0.5 - 1e-3) == [False, True, False, False]
    assert kept(0.6) == [False, True, True, False]  # 0.5 < 0.6 < 0.8
    assert kept(0.9) == [False, True, True, True]  # 0.8 < 0.9 < 0.95
    assert kept(0.97) == [True, True, True, True]
    assert kept(1.0) == [True, True, True, True]
    assert kept(1e-9) == [False, True, False, False]  # the most likely token always stays
    both = P.filter_logits(lp, top_k=2, top_p=0.97)
    assert torch.isfinite(both)[0].tolist() == [False, True, True, False]
    assert torch.equal(P.filter_logits(lp, top_p=0.6)[0, 1:3], lp[0, 1:3])  # kept entries are unchanged


def test_propose_greedy_and_gumbel_frequencies():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, 11, generator=g)
    assert torch.equal(P.propose(logits, 0.0), logits.argmax(-1))
    assert torch.equal(P.propose(logits, 0.0, top_k=3, top_p=0.5), logits.argmax(-1))
    draws = 20000
    base = torch.tensor([1.0, 0.0, -1.0])
    for temperature, top_k in [(1.0, None), (0.5, None), (2.0, None), (1.0, 2)]:
        tokens = P.propose(base.expand(draws, 3), temperature, top_k=top_k, generator=g)
        freq = torch.bincount(tokens, minlength=3).double() / draws
        target = P.filter_logits(base, top_k=top_k).double().div(temperature).softmax(-1)
        assert (freq - target).abs().max() < 0.015, (temperature, top_k, freq.tolist(), target.tolist())
    # float64 noise: a 1e-9 probability token is (almost) never drawn, a 0.5 one half the time
    tokens = P.propose(torch.tensor([0.0, 0.0, -20.7]).expand(draws, 3), 1.0, generator=g)
    assert (tokens == 2).sum() <= 1 and abs((tokens == 0).double().mean() - 0.5) < 0.015
    first = P.propose(base.expand(100, 3), 1.0, generator=torch.Generator().manual_seed(3))
    again = P.propose(base.expand(100, 3), 1.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(first, again)


def test_confidence_functions_hand_example():
    p = torch.tensor([[0.6, 0.3, 0.1]])
    logits = p.log() + 2.0  # a constant shift changes nothing
    x0 = torch.tensor([1])
    close = lambda a, b: abs(float(a) - b) < 1e-6
    assert close(P.score("low_confidence", logits, x0)[0], 0.3)
    assert close(P.score("low_confidence", logits, x0, temperature=0.5)[0], 0.3)  # untempered
    assert close(P.score("entropy", logits, x0)[0], sum(q * math.log(q) for q in (0.6, 0.3, 0.1)))
    assert close(P.score("margin", logits, x0)[0], 0.3)
    assert close(P.score("maskgit_plus", logits, x0)[0], 0.3)
    assert close(P.score("maskgit_plus", logits, x0, temperature=0.5)[0], 0.09 / (0.36 + 0.09 + 0.01))
    assert close(P.score("maskgit_plus", logits, x0, top_k=2)[0], 0.3 / 0.9)
    r1 = P.score("random", logits.expand(1000, 3), x0.expand(1000), generator=torch.Generator().manual_seed(0))
    r2 = P.score("random", logits.expand(1000, 3), x0.expand(1000), generator=torch.Generator().manual_seed(0))
    assert torch.equal(r1, r2) and 0 <= r1.min() and r1.max() < 1 and abs(r1.mean() - 0.5) < 0.05
    with pytest.raises(ValueError, match="low_confidence"):
        P.score("nope", logits, x0)


def test_linear_schedule_and_dream_count():
    assert P.linear_schedule(torch.tensor([12, 5, 3, 0]), 5).tolist() == [
        [3, 3, 2, 2, 2], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]
    assert P.linear_schedule(torch.tensor([32]), 32).tolist() == [[1] * 32]
    assert P.dream_count(torch.tensor([16]), 1.0, 0.875125, last=False).tolist() == [1]
    assert P.dream_count(torch.tensor([16, 7]), 0.5, 0.25, last=False).tolist() == [8, 3]
    assert P.dream_count(torch.tensor([16, 7]), 0.5, 0.25, last=True).tolist() == [16, 7]


def test_top_n_picks_exactly_n_finite_entries():
    inf = float("-inf")
    conf = torch.tensor([[0.1, 0.9, inf, 0.5, 0.7], [inf, 0.2, inf, inf, 0.3], [0.4, 0.4, 0.4, 0.4, 0.4]])
    chosen = P.top_n(conf, torch.tensor([2, 5, 3]))
    assert chosen.tolist() == [[False, True, False, False, True], [False, True, False, False, True],
                               [True, True, True, False, False]]  # ties: stable, left-most first
    assert P.top_n(conf, torch.tensor([0, 0, 0])).sum() == 0
    assert P.top_n(torch.full((1, 4), inf), torch.tensor([2])).sum() == 0


def test_factor_rule_example():
    inf = float("-inf")
    # thresholds 1 - 1/(n+1): n=1 forced, n=2: 0.667, n=3: 0.75, n=4: 0.8
    conf = torch.tensor([[0.6, 0.9, 0.8, 0.55, inf],  # 0.9, 0.8 pass; 0.6 < 0.75 stops
                         [0.95, 0.5, 0.9, 0.85, inf],  # only the last (0.5 < 0.8) fails: 3, not 4
                         [0.99, 0.98, 0.97, 0.96, 0.1],  # 4 pass, 0.1 < 1 - 1/6 stops
                         [0.1, 0.2, inf, inf, inf],  # the first always commits
                         [inf, inf, inf, inf, inf]])  # nothing to commit
    assert P.factor_rule(conf, 1.0).tolist() == [
        [False, True, True, False, False], [True, False, True, True, False], [True, True, True, True, False],
        [False, True, False, False, False], [False] * 5]
    # factor 2: n=2 needs 1/3 (0.8 passes), n=3 needs 0.5 (0.6 passes), n=4 needs 0.6 (0.55 fails) -> 3
    assert P.factor_rule(conf[:1], 2.0).tolist() == [[True, True, True, False, False]]


def test_select_threshold_rules():
    inf = float("-inf")
    conf = torch.tensor([[0.2, 0.9, 0.4, inf], [0.1, 0.2, 0.3, 0.05]])
    n = torch.tensor([2, 2])
    cfg = SamplingConfig(threshold=0.35, threshold_rule="one")
    assert P.select(conf, n, cfg).tolist() == [[False, True, True, False], [False, False, True, False]]
    cfg = SamplingConfig(threshold=0.35, threshold_rule="schedule")
    assert P.select(conf, n, cfg).tolist() == [[False, True, True, False], [False, True, True, False]]
    one = dict(threshold_rule="one")
    at = P.select(conf, n, SamplingConfig(threshold=0.4, **one)).tolist()  # confidence == threshold commits (>=)
    assert at == [[False, True, True, False], [False, False, True, False]]
    # SDAR/LLaDA2 count strictly greater: at 0.4 only one passes in row 0, fewer than n = 2, so the top 2
    at = P.select(conf, n, SamplingConfig(threshold=0.4, threshold_rule="schedule")).tolist()
    assert at == [[False, True, True, False], [False, True, True, False]]
    assert P.select(conf, n, SamplingConfig(threshold=0.2, **one)).tolist()[1] == [False, True, True, False]
    assert P.select(conf, torch.tensor([1, 1]), SamplingConfig(threshold=1.01, **one)).sum(-1).tolist() == [1, 1]
    # quota (Dream): among the top n candidates the first always, the rest only at or above the threshold
    quota = dict(threshold_rule="quota")
    wide = torch.tensor([[0.95, 0.92, 0.91, 0.5, 0.97]])
    assert P.select(wide, torch.tensor([3]), SamplingConfig(threshold=0.9, **quota)).tolist() == [
        [True, True, False, False, True]]  # 0.91 passes but is not among the top 3
    assert P.select(wide, torch.tensor([2]), SamplingConfig(threshold=0.99, **quota)).tolist() == [
        [False, False, False, False, True]]
    assert P.select(conf, n, SamplingConfig()).tolist() == [[False, True, True, False], [False, True, True, False]]


# ---------------------------------------------------------------- LLaDA2.1 editing


@pytest.mark.parametrize("cache", ["block", "none"])
def test_editing_that_never_fires_only_adds_one_post_step_per_block(cache):
    """editing_threshold above 1 can never edit: same tokens and step maps as plain threshold decoding, plus exactly
    one refinement step per block (the step that finds nothing to fill or edit ends the block)."""
    model, _, fam = load("llada2")
    ids, mask = prompts(fam, [5, 40], seed=21)
    common = dict(gen_length=40, threshold=0.5, cache=cache, stop_at_eos=False)
    plain = generate(model, fam, ids, mask, SamplingConfig(**common))
    never = generate(model, fam, ids, mask, SamplingConfig(editing_threshold=1.01, **common))
    assert torch.equal(plain.sequences, never.sequences) and torch.equal(plain.block_step, never.block_step)
    # (global steps shift by the post step of each earlier block)
    # prompts of 5 and 40 tokens on a grid of 32: generation fills canvas blocks [32, 64) and [64, 96) = 2 blocks
    assert never.nfe - plain.nfe == 2, (plain.nfe, never.nfe)


def test_editing_rewrites_tokens_and_respects_post_step_budget():
    model, _, fam = load("llada2")
    ids, mask = prompts(fam, [5, 40], seed=21)
    common = dict(gen_length=40, threshold=0.5, stop_at_eos=False)
    plain = generate(model, fam, ids, mask, SamplingConfig(**common))
    edits = generate(model, fam, ids, mask, SamplingConfig(editing_threshold=0.0, max_post_steps=3, **common))
    assert not torch.equal(plain.sequences, edits.sequences), "editing at threshold 0 should change something"
    assert (edits.sequences != fam.mask_id).all() and (edits.step_map >= 0).all()
    n_blocks = 2  # see above: two decoded blocks; each gets at most max_post_steps refinement steps
    assert plain.nfe < edits.nfe <= plain.nfe + n_blocks * 3 + 4  # mask filling may also take a few more steps
    prompt_tokens = [unpadded(ids, mask, r) for r in range(2)]
    assert all(len(p) for p in prompt_tokens)  # edits never touch the prompt: the output holds only generation


def test_editing_rejected_for_masked_families():
    model, _, fam = load("llada")
    ids, mask = prompts(fam, [4], seed=1)
    with pytest.raises(ValueError, match="block-diffusion families only"):
        generate(model, fam, ids, mask, SamplingConfig(gen_length=8, editing_threshold=0.5))


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_generate_refuses_a_canvas_longer_than_the_model_positions(family):
    """Prompt + generated region (whole blocks for block families) past max_position_embeddings is refused before
    any forward, naming both numbers; one that fits decodes."""
    model, tok = tiny(family)
    fam = Family.from_pretrained(model.config, tok)
    prompt = torch.full((1, 1000), 5)
    with pytest.raises(ValueError, match=r"sampling: a 1000-token prompt \+ gen_length 30 needs 10(30|32) positions, "
                                         r"more than the model's 1024"):
        generate(model, fam, prompt, config=SamplingConfig(gen_length=30, steps=30 if family == "llada" else None))
    assert generate(model, fam, prompt[:, :990], config=SamplingConfig(gen_length=4)).sequences.shape == (1, 4)
