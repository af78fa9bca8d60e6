"""VRPO (algorithms.md §3.3): the DPO-on-ELBO loss and its estimator (antithetic masks, stratified counts, K = 1 by
hand, unbiasedness on a context-free model, R normalisation), the preference data (files, conversations, generated
pairs, clear errors), and train_rl.py --algo vrpo end to end: every family, checkpoints and exact resume, the LoRA
reference, micro-batch and 2-process invariance, and a held-out margin that rises."""

import copy
import itertools
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from test_train_rl import history, set_fields, weights

import train_rl
from dare.algos import get_algorithm, matrix
from dare.config import parse
from dare.data.chat import encode
from dare.data.preference import PreferenceCollator, PreferenceDataConfig, make_pairs, pair_rows
from dare.models import Family, tiny
from dare.trainers import COMPLETE

ROOT = Path(__file__).resolve().parents[1]
LN2 = math.log(2.0)


def setup(family_name="llada", pairs=3, seed=0, **algo):
    """A float64 tiny policy, a perturbed copy as reference, and a collated batch of generated addition pairs."""
    model, tok = tiny(family_name)
    model = model.double()
    fam = Family.from_pretrained(model.config, tok)
    config = PreferenceDataConfig(max_response_length=64)
    batch = PreferenceCollator(tok, fam, config)(pair_rows("task:addition", "train", config, pairs))
    vrpo = get_algorithm("vrpo")(**algo).validate(fam)
    return model, fam, batch, vrpo


def draw(vrpo, fam, batch, seed=0):
    generators = [torch.Generator().manual_seed(seed * 1000 + int(i)) for i in batch["index"]]
    return vrpo.corrupt(fam, batch, generators + generators)


def perturbed(model, scale=0.05, seed=1):
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return other


def test_identical_chosen_and_rejected_give_ln2_and_zero_gradient():
    """The loss sees chosen and rejected only through their difference: the same response under the same masks
    gives exactly ln 2 and no gradient, whatever the policy and the reference."""
    model, fam, batch, vrpo = setup()
    m = len(batch["index"])
    for key in ("completion_ids", "completion_mask", "loss_mask", "attention_mask"):
        batch[key][m:] = batch[key][:m]
    noise = draw(vrpo, fam, batch)
    noise = {k: torch.cat([v[:m], v[:m]]) for k, v in noise.items()}
    ref = perturbed(model)
    with torch.no_grad():
        baseline = vrpo.elbo(ref, fam, batch, noise)
    policy = vrpo.elbo(model, fam, batch, noise)
    assert not torch.equal(policy, baseline)
    losses, stats = vrpo.loss(policy, baseline)
    assert torch.equal(losses, torch.full_like(losses, LN2)) and torch.equal(stats["margin"], torch.zeros(m).double())
    losses.mean().backward()
    assert max(p.grad.abs().max().item() for p in model.parameters() if p.grad is not None) < 1e-12


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2"])
def test_margin_is_exactly_zero_at_the_reference_for_every_mask_seed(family):
    """Antithetic sampling: policy and reference score each response under the same masks, so at theta = ref the
    margin is exactly 0 (zero variance over mask seeds) and the loss is ln 2 — float32, as trained."""
    model, fam, batch, vrpo = setup(family)
    model = model.float()
    ref = copy.deepcopy(model).requires_grad_(False)
    for seed in range(3):
        noise = draw(vrpo, fam, batch, seed)
        policy = vrpo.elbo(model, fam, batch, noise)
        with torch.no_grad():
            baseline = vrpo.elbo(ref, fam, batch, noise)
        losses, stats = vrpo.loss(policy, baseline)
        assert torch.equal(stats["margin"], torch.zeros_like(stats["margin"]))
        assert torch.allclose(losses, torch.full_like(losses, LN2), rtol=0, atol=1e-7)
        assert stats["accuracy"].sum() == 0 and (policy < 0).all()


def test_one_sample_reduces_to_dpo_on_the_one_sample_elbo():
    """K = 1: B = (L / x) sum_masked log p, computed here from a plain forward; the loss is textbook DPO on it."""
    model, fam, batch, vrpo = setup(samples=1, beta=0.3)
    ref = perturbed(model)
    noise = draw(vrpo, fam, batch)

    def by_hand(net):
        masked = noise["masks"][:, 0]
        completion = batch["completion_ids"].masked_fill(masked | ~batch["loss_mask"].bool(), fam.mask_id)
        logits = fam.logits(net, torch.cat([batch["prompt_ids"], completion], 1), batch["attention_mask"])
        logp = logits[:, batch["prompt_ids"].shape[1]:].log_softmax(-1)
        logp = logp.gather(-1, batch["completion_ids"][..., None])[..., 0]
        length, count = batch["loss_mask"].sum(-1), masked.sum(-1)
        return length.double() / count * (logp * masked).sum(-1)

    with torch.no_grad():
        policy, baseline = by_hand(model), by_hand(ref)
        m = len(batch["index"])
        expected = -F.logsigmoid(0.3 * ((policy[:m] - baseline[:m]) - (policy[m:] - baseline[m:])))
        losses, _ = vrpo.loss(vrpo.elbo(model, fam, batch, noise), vrpo.elbo(ref, fam, batch, noise))
    assert torch.allclose(losses, expected, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(losses, torch.full_like(losses, LN2))


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2"])
def test_policy_and_reference_see_identical_masks(family, monkeypatch, tmp_path):
    """Through the trainer: every noisy input the reference scores is one the policy scored, in the same order."""
    calls = []
    logits = Family.logits

    def spy(self, model, input_ids, *args, **kwargs):
        calls.append((torch.is_grad_enabled(), input_ids.clone()))
        return logits(self, model, input_ids, *args, **kwargs)

    monkeypatch.setattr(Family, "logits", spy)
    train_rl.main(vrpo_args(tmp_path, model=f"tiny:{family}", max_steps=1, save_steps=1, preference__eval_path=None))
    # per micro-batch: the reference's K draws, the policy's K draws, then each draw recomputed in backward (stream)
    assert [grad for grad, _ in calls] == ([False] * 4 + [True] * 8) * 2
    for m in range(2):
        reference, policy, again = (calls[12 * m + 4 * k: 12 * m + 4 * k + 4] for k in range(3))
        assert all(torch.equal(a[1], b[1]) for a, b in zip(policy, reference, strict=True))
        assert sorted(int(ids.sum()) for _, ids in again) == sorted(int(ids.sum()) for _, ids in policy)
    policy = [ids for grad, ids in calls if grad]
    model, tok = tiny(family)
    mask_id = Family.from_pretrained(model.config, tok).mask_id
    assert len({int((ids == mask_id).sum()) for ids in policy}) > 1  # the draws differ from each other


def saved_bytes(fn, *args):
    """``fn(*args)`` and the bytes of the tensors autograd keeps for backward while it runs (what grows with the
    graph)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return out, total[0]


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_streamed_draws_give_the_same_gradient_and_keep_no_graph_per_draw(family):
    """stream=True: each draw is recomputed in backward, so the graph kept after the forward does not grow with K
    (it grows linearly without streaming); the loss and the gradient are those of the unstreamed ELBO."""
    kept = {}
    for samples in (2, 8):
        grads = {}
        for stream in (False, True):
            model, fam, batch, vrpo = setup(family, samples=samples, stream=stream)
            noise = draw(vrpo, fam, batch)
            with torch.no_grad():
                reference = vrpo.elbo(perturbed(model), fam, batch, noise)
            policy, kept[samples, stream] = saved_bytes(vrpo.elbo, model, fam, batch, noise)
            losses, _ = vrpo.loss(policy, reference)
            losses.mean().backward()
            grads[stream] = (losses.detach(), [p.grad.clone() for p in model.parameters()])
        torch.testing.assert_close(grads[True][0], grads[False][0], atol=1e-12, rtol=0)
        for a, b in zip(grads[True][1], grads[False][1], strict=True):
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)
    assert kept[8, False] > 3.5 * kept[2, False]  # unstreamed: one graph per draw
    assert kept[8, True] == kept[2, True] < kept[2, False] / 10  # streamed: flat, and tiny


def test_stratified_counts_cover_one_to_l():
    """K counts per response, one mask each: all in [1, L], cyclic gaps floor(L/K) or ceil(L/K), p = x / L, the
    masks inside the valid response, chosen and rejected drawn independently."""
    model, fam, batch, vrpo = setup(pairs=4, samples=4)
    valid = batch["loss_mask"].bool()
    for seed in range(20):
        noise = draw(vrpo, fam, batch, seed)
        counts = noise["masks"].sum(-1)
        lengths = valid.sum(-1, keepdim=True)
        assert (counts >= 1).all() and (counts <= lengths).all()
        assert torch.equal(noise["p"], counts.double() / lengths)
        assert not (noise["masks"] & ~valid[:, None]).any()
        for row, length in zip(counts.tolist(), lengths[:, 0].tolist(), strict=True):
            ordered = sorted(row)
            gaps = [b - a for a, b in itertools.pairwise(ordered)] + [ordered[0] + length - ordered[-1]]
            assert set(gaps) <= {length // 4, -(-length // 4)}, (row, length)
    m = len(batch["index"])
    assert not torch.equal(noise["masks"][:m], noise["masks"][m:])


class ContextFree(torch.nn.Module):
    """log p(y_k | z) depends on the position only: the ELBO's expectation is exactly sum_k log p_k."""

    def __init__(self, width, vocab):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(width, vocab, dtype=torch.float64,
                                                    generator=torch.Generator().manual_seed(0)))

    def forward(self, input_ids, logits_to_keep=None, **_):
        logits = self.table[:input_ids.shape[1]].expand(len(input_ids), -1, -1)
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def test_unbiased_on_a_context_free_model():
    """Exactly, by enumerating every (count, subset) with its probability (x uniform on 1..L, subsets uniform),
    and by Monte Carlo over the sampler's own draws."""
    _, fam, batch, _ = setup(pairs=1)
    row = {k: v[:1] for k, v in batch.items() if k not in ("index", "truncated")}
    length = int(row["loss_mask"].sum())
    toy = ContextFree(row["attention_mask"].shape[1], fam.vocab_size).requires_grad_(False)
    logp = toy.table[row["prompt_ids"].shape[1]:].log_softmax(-1).gather(-1, row["completion_ids"][0, :, None])
    target = float(logp[:length].sum().detach())
    one = get_algorithm("vrpo")(samples=1)
    exact = 0.0
    for count in range(1, length + 1):
        subsets = list(itertools.combinations(range(length), count))
        for subset in subsets:
            mask = torch.zeros(1, 1, row["completion_ids"].shape[1], dtype=torch.bool)
            mask[0, 0, list(subset)] = True
            value = one.elbo(toy, fam, row, {"masks": mask, "p": torch.tensor([[count / length]], dtype=torch.float64)})
            exact += float(value) / length / len(subsets)
    assert exact == pytest.approx(target, rel=1e-10)
    vrpo = get_algorithm("vrpo")(samples=4)
    values = [float(vrpo.elbo(toy, fam, row, vrpo.corrupt(fam, row, [torch.Generator().manual_seed(s)])))
              for s in range(400)]
    mean, sd = sum(values) / len(values), torch.tensor(values).std().item()
    assert abs(mean - target) < 4 * sd / math.sqrt(len(values)) and sd > 0


def test_padded_length_normalisation_divides_by_r():
    """normalise="padded_length" (DARE, finding 8) divides each ELBO by R = max_response_length, whatever the
    batch's actual padding; "none" is the paper's ELBO."""
    model, fam, batch, vrpo = setup()
    noise = draw(vrpo, fam, batch)
    dare = get_algorithm("vrpo")(normalise="padded_length").validate(fam)
    with torch.no_grad():
        plain, scaled = vrpo.elbo(model, fam, batch, noise), dare.elbo(model, fam, batch, noise)
    assert batch["completion_ids"].shape[1] < 64 and torch.equal(batch["padded_length"], torch.full((6,), 64.0))
    assert torch.allclose(scaled, plain / 64, rtol=1e-14)


def test_masks_and_elbos_do_not_depend_on_the_batch():
    """A pair's masks come from its own generator on its own valid tokens: alone or batched with a much longer pair
    (more padding, longer prompts), the same masks and the same ELBOs (padding is never attended)."""
    model, fam, _, vrpo = setup()
    config = PreferenceDataConfig(max_response_length=64)
    collate = PreferenceCollator(tiny("llada")[1], fam, config)
    rows = pair_rows("task:addition", "train", config, 2)
    longer = {"prompt": [{"role": "user", "content": "Add 3 and 4, then explain the sum in many words."}],
              "chosen": "Three plus four is seven, " * 4, "rejected": "No.", "index": 9}
    alone, together = collate(rows[1:]), collate(rows + [longer])
    assert together["completion_ids"].shape[1] > alone["completion_ids"].shape[1] + 10
    assert together["prompt_ids"].shape[1] > alone["prompt_ids"].shape[1]
    single, batched = draw(vrpo, fam, alone), draw(vrpo, fam, together)
    width = alone["completion_ids"].shape[1]
    for row, other in ((1, 0), (4, 1)):
        assert torch.equal(batched["masks"][row, :, :width], single["masks"][other])
        assert not batched["masks"][row, :, width:].any()
    with torch.no_grad():
        a, b = vrpo.elbo(model, fam, together, batched), vrpo.elbo(model, fam, alone, single)
    assert torch.allclose(a[[1, 4]], b, rtol=1e-9)


# -------------------------------------------------------------------------------------------------------- data

def test_conversation_rows_split_into_prompt_and_answer(tmp_path):
    """UltraFeedback-binarized rows: chosen/rejected are [user, assistant] conversations; the prompt is the
    conversation before the answer. Plain-text rows use prompt_key."""
    user = {"role": "user", "content": "hi?"}
    rows = [{"prompt": "hi?", "chosen": [user, {"role": "assistant", "content": "Hello!"}],
             "rejected": [user, {"role": "assistant", "content": "Go away."}]},
            {"q": "2+2?", "good": "4", "bad": "5"}]
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n")
    (pair,) = pair_rows(str(path), "train", PreferenceDataConfig())
    assert pair == {"prompt": [{"role": "user", "content": "hi?"}], "chosen": "Hello!", "rejected": "Go away.",
                    "index": 0}
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps(rows[1]) + "\n")
    config = PreferenceDataConfig(prompt_key="q", chosen_key="good", rejected_key="bad", system_prompt="Be brief.")
    (pair,) = pair_rows(str(text), "train", config)
    assert pair["prompt"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert (pair["chosen"], pair["rejected"]) == ("4", "5")


def test_generated_pairs_hold_out_their_questions():
    train, test = make_pairs("addition", 300, "train"), make_pairs("addition", 100, "test")
    questions = [{p["prompt"][-1]["content"] for p in rows} for rows in (train, test)]
    assert questions[0] and questions[1] and not questions[0] & questions[1]
    for p in train + test:
        a, b = (int(t) for t in p["prompt"][-1]["content"][8:].split("?")[0].split(" + "))
        assert p["chosen"] == f"The answer is \\boxed{{{a + b}}}." and p["rejected"] != p["chosen"]
        assert p["rejected"].startswith("The answer is \\boxed{")
    assert make_pairs("arithmetic", 3) == make_pairs("arithmetic", 3)  # deterministic
    grid = make_pairs("sudoku", 1)[0]
    assert sum(a != b for a, b in zip(grid["chosen"], grid["rejected"], strict=True)) == 1


def test_truncation_keeps_the_prompt_end_and_the_response_start():
    model, tok = tiny("llada")
    fam = Family.from_pretrained(model.config, tok)
    config = PreferenceDataConfig(max_prompt_length=5, max_response_length=3)
    batch = PreferenceCollator(tok, fam, config)([{"prompt": [{"role": "user", "content": "What is 1 + 2?"}],
                                                  "chosen": "The answer is 3.", "rejected": "No", "index": 7}])
    full = encode(tok, [[{"role": "user", "content": "What is 1 + 2?"}]])[0]
    assert batch["prompt_ids"][0].tolist() == full[-5:] and batch["completion_mask"].sum(-1).tolist() == [3, 3]
    assert batch["completion_ids"][0].tolist() == tok("The answer is 3.", add_special_tokens=False)["input_ids"][:3]
    assert batch["truncated"].tolist() == [1.0] and batch["index"].tolist() == [7]


def test_clear_errors(tmp_path):
    path = tmp_path / "prefs.jsonl"
    path.write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n" +
                    json.dumps({"prompt": "a", "chosen": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"prefs.jsonl, row 1: no response in column 'rejected'"):
        pair_rows(str(path), "train", PreferenceDataConfig())
    with pytest.raises(ValueError, match=r"prefs.jsonl, row 0: Column 'worse': 'worse' not found in the row"):
        pair_rows(str(path), "train", PreferenceDataConfig(rejected_key="worse"))
    path.write_text(json.dumps({"chosen": [{"role": "user", "content": "a"}], "rejected": "c"}) + "\n")
    with pytest.raises(ValueError, match="row 0: column 'chosen': the conversation must end with the assistant"):
        pair_rows(str(path), "train", PreferenceDataConfig())
    turn = [{"role": "assistant", "content": "x"}]
    path.write_text(json.dumps({"chosen": [{"role": "user", "content": "a"}] + turn,
                                "rejected": [{"role": "user", "content": "b"}] + turn}) + "\n")
    with pytest.raises(ValueError, match="continue different conversations"):
        pair_rows(str(path), "train", PreferenceDataConfig())
    with pytest.raises(ValueError, match="No generated preference pairs for task 'countdown'"):
        make_pairs("countdown", 2)
    fam = Family.from_pretrained(tiny("llada")[0].config, tiny("llada")[1])
    with pytest.raises(ValueError, match=r"Unknown normalise 'length'; known: \['none', 'padded_length'\]"):
        get_algorithm("vrpo")(normalise="length").validate(fam)
    with pytest.raises(ValueError, match="beta must be > 0"):
        get_algorithm("vrpo")(beta=0.0).validate(fam)
    with pytest.raises(ValueError, match="micro_batch_size=3 must be even"):
        train_rl.main(vrpo_args(tmp_path, micro_batch_size=3))
    with pytest.raises(ValueError, match="Column 'nope': 'nope' not found"):
        train_rl.main(vrpo_args(tmp_path, preference__path=str(tmp_path / "prefs.jsonl"),
                                preference__chosen_key="nope"))


# ---------------------------------------------------------------------------------------------- train_rl.py

def vrpo_args(out, **kw):
    args = train_rl.args_class("vrpo")(model=kw.pop("model", "tiny:llada"), output_dir=str(out), max_steps=2,
                                       prompts_per_step=4, micro_batch_size=4, save_steps=2, learning_rate=1e-3)
    p = args.preference
    p.path, p.eval_path, p.eval_split, p.limit, p.eval_limit = "task:addition", "task:addition", "test", 32, 8
    return set_fields(args, **kw)


@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "llada2"])
def test_train_rl_vrpo_runs_on_every_family(family, tmp_path):
    trainer = train_rl.main(vrpo_args(tmp_path, model=f"tiny:{family}", eval_steps=2, eval_on_start=True))
    assert (tmp_path / "checkpoint-2" / COMPLETE).exists()
    logs = history(tmp_path, 2)
    first, second = [h for h in logs if "loss" in h]
    for key in ("margin", "accuracy", "rewards/chosen", "rewards/rejected", "elbo/chosen", "elbo/rejected",
                "truncated", "grad_norm"):
        assert key in first, key
    assert first["margin"] == 0.0 and first["accuracy"] == 0.0 and first["loss"] == pytest.approx(LN2, abs=1e-4)
    assert first["grad_norm"] > 0 and second["margin"] != 0.0
    evals = [h for h in logs if "eval_margin" in h]
    assert evals[0]["eval_margin"] == 0.0 and evals[0]["eval_loss"] == pytest.approx(LN2, abs=1e-6)
    assert evals[-1]["eval_margin"] != 0.0 and "eval_accuracy" in evals[-1]
    assert type(trainer).__name__ == "PreferenceTrainer"
    before, after = weights(f"tiny:{family}"), weights(tmp_path)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_resume_is_exact(tmp_path):
    kw = dict(max_steps=4)
    train_rl.main(vrpo_args(tmp_path / "straight", **kw))
    train_rl.main(vrpo_args(tmp_path / "resumed", **kw))
    shutil.rmtree(tmp_path / "resumed" / "checkpoint-4")
    (tmp_path / "resumed" / "model.safetensors").unlink()
    train_rl.main(vrpo_args(tmp_path / "resumed", resume=True, **kw))
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)

    def after_resume(out):
        return [(h["loss"], h["grad_norm"], h["margin"]) for h in history(out, 4) if "loss" in h][2:]
    assert after_resume(tmp_path / "straight") == after_resume(tmp_path / "resumed")


def test_lora_reference_is_the_disabled_adapter(tmp_path):
    train_rl.main(vrpo_args(tmp_path, model="tiny:sdar", max_steps=2, learning_rate=3e-2, lora__rank=4,
                            lora__alpha=8))
    first, second = [h for h in history(tmp_path, 2) if "loss" in h]
    assert first["margin"] == 0.0 and second["margin"] != 0.0
    assert set(weights(tmp_path / "merged")) == set(weights("tiny:sdar"))


def test_step_does_not_depend_on_the_micro_batch_size(tmp_path):
    """Two rows or eight per micro-batch: the same masks, the same mean over pairs, the same SGD step."""
    for name, size in (("one", 8), ("four", 2)):
        train_rl.main(vrpo_args(tmp_path / name, max_steps=1, save_steps=1, micro_batch_size=size, optim="sgd",
                                learning_rate=1.0))
    a, b, start = weights(tmp_path / "one"), weights(tmp_path / "four"), weights("tiny:llada")
    assert any((a[k] - start[k]).abs().max() > 1e-4 for k in a)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6


def test_help_lists_the_vrpo_knobs_and_the_matrix_has_a_row():
    result = subprocess.run([sys.executable, "train_rl.py", "--algo", "vrpo", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0
    for flag in ("--algo-config.beta", "--algo-config.samples", "--algo-config.normalise", "--preference.path",
                 "--preference.chosen-key", "--preference.max-response-length"):
        assert flag in result.stdout, flag
    assert "--algo-config.num-iterations" not in result.stdout and "--algo-config.eps-low" not in result.stdout
    assert "| vrpo | yes | yes | yes | yes | yes | — | yes | yes | yes | MCElbo | dpo | all |" in matrix()


def test_vrpo_raises_the_held_out_margin_and_swapped_pairs_lower_it(tmp_path, margin):
    """120 steps of 8 generated near-miss pairs (the answer off by one or by ten) from a random tiny LLaDA: the held-out
    margin (questions never trained on) starts at exactly 0 (theta = ref), rises by at least 3 standard errors over the
    pairs, and falls by as much when chosen and rejected are swapped (the negative control); the margin is exactly the
    change of the ELBO gap. Learning from an SFT start,
    measured on held-out rewards, is tests/test_rl_learns.py's."""
    runs = {}
    for swap in (False, True):
        out = tmp_path / f"swap-{swap}"
        train_rl.main(vrpo_args(out, max_steps=120, prompts_per_step=8, micro_batch_size=16, learning_rate=2e-3,
                                eval_steps=120, eval_on_start=True, save_steps=120, logging_steps=10,
                                preference__limit=256, preference__eval_limit=512, preference__swap=swap))
        runs[swap] = [h for h in history(out, 120) if "eval_margin" in h]
    (before, after), (_, swapped) = runs[False], runs[True]
    z, z_swapped = after["eval_margin"] / after["eval_margin_se"], swapped["eval_margin"] / swapped["eval_margin_se"]
    margin(f"vrpo: held-out pair margin 0 -> {after['eval_margin']:.3f} ± {after['eval_margin_se']:.3f} ({z:+.1f} "
           f"SE, margin {z - 3:+.1f} SE over 3; accuracy {after['eval_accuracy']:.3f}); swapped pairs -> "
           f"{swapped['eval_margin']:.3f} ({z_swapped:+.1f} SE, margin {-z_swapped - 3:+.1f} SE)")
    assert before["eval_margin"] == 0.0 and before["eval_accuracy"] == 0.0
    assert z >= 3 and z_swapped <= -3
    assert after["eval_accuracy"] > 0.5 > swapped["eval_accuracy"]

    def gap(h):
        return h["eval_elbo/chosen"] - h["eval_elbo/rejected"]
    # the held-out noise is the same at every evaluation, so the margin is exactly the change of the ELBO gap
    assert gap(after) - gap(before) == pytest.approx(after["eval_margin"], abs=1e-5)


def test_two_processes_take_the_same_step_as_one(tmp_path):
    """Masks are seeded by the pair, not the rank, and the loss is a mean over all pairs of the step: a 2-process
    DDP run (4 pairs per rank per step) lands on the weights of a 1-process run; held-out pairs are sharded and
    gathered."""
    from test_distributed import _launch
    flags = ["--algo", "vrpo", "--model", "tiny:llada", "--preference.path", "task:addition", "--preference.limit",
             "32", "--preference.eval-path", "task:addition", "--preference.eval-split", "test",
             "--preference.eval-limit", "10", "--max-steps", "2", "--save-steps", "2", "--eval-steps", "2",
             "--prompts-per-step", "8", "--micro-batch-size", "4", "--optim", "sgd", "--learning-rate", "1.0"]
    _launch(["train_rl.py", *flags, "--output-dir", str(tmp_path / "two")])
    train_rl.main(parse(train_rl.args_class("vrpo"), [*flags[2:], "--output-dir", str(tmp_path / "one")]))
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert any((a[k] - weights("tiny:llada")[k]).abs().max() > 1e-3 for k in a)
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    evals = [[h for h in history(out, 2) if "eval_margin" in h][0] for out in (tmp_path / "one", tmp_path / "two")]
    assert evals[0]["eval_margin"] == pytest.approx(evals[1]["eval_margin"], abs=1e-5) != 0.0
