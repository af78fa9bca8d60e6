"""Drawing SFT (MMaDA's text-to-image loss, MaskGIT's): a drawing row's example is MMaDA's ``t2i_prompt`` (the text
left-padded outside the attention, then ``<|soi|>`` codes ``<|eoi|>``), exactly round(n cos(pi t / 2)) >= 1 of its
codes masked, the mean cross-entropy over the masked codes (the whole vocabulary), every column a position, and some
rows trained without their text; a tiny MMaDA so trained draws its pictures' codes."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dare.data import SFTCollator, load_rows
from dare.data.images import load_image
from dare.data.sft import SFTDataConfig, tokenize_dataset
from dare.data.tasks import make_task
from dare.diffusion import DRAWING, RECIPES
from dare.models import Family, pictures, tiny
from dare.models.readers import EveryPosition
from dare.objectives import sft_loss, sft_noise


def drawing_rows(tmp_path, n=4):
    rows = {r["prompt"][-1]["content"]: r for r in make_task("colours", 24, 0, "train")}
    path = tmp_path / "draw.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in list(rows.values())[:n]))
    return str(path), list(rows.values())[:n]


def test_maskgit_noise_masks_exactly_round_n_cos_of_the_codes_and_at_least_one():
    model, tok = tiny("mmada")
    family = Family.from_pretrained(model.config, tok)
    loss_mask = torch.zeros(5, 30, dtype=torch.long)
    loss_mask[:, 10:26] = 1  # 16 codes
    t = torch.tensor([0.0, 0.3, 0.5, 0.9, 1.0])
    _, masked = sft_noise(family, torch.zeros_like(loss_mask), loss_mask, DRAWING, torch.Generator().manual_seed(0),
                          t=t)
    assert not (masked & ~loss_mask.bool()).any()
    # float32 as MaskGIT: cos(pi / 4) * 16 = 11.31, cos(0.45 pi) * 16 = 2.50 (rounds to 3 in float32), t = 1: 1
    assert masked.sum(-1).tolist() == [16, 14, 11, 3, 1]
    linear = sft_noise(family, torch.zeros_like(loss_mask), loss_mask, RECIPES["mmada"],
                       torch.Generator().manual_seed(0), t=t)[1]
    assert linear.sum(-1).tolist() != [16, 14, 11, 3, 1]  # the text recipe masks each token with probability t
    with pytest.raises(ValueError, match="schedule must be"):
        type(DRAWING)(schedule="square")


def test_a_drawing_row_trains_its_pictures_codes_after_mmadas_text_to_image_prompt(tmp_path):
    path, rows = drawing_rows(tmp_path, 2)
    model, tok = tiny("mmada")
    family, reader = Family.from_pretrained(model.config, tok), pictures(model.config)
    config = SFTDataConfig(path=path, max_length=80)
    examples = tokenize_dataset(load_rows(path), tok, family, config, reader)
    batch = SFTCollator(family, config, reader)([examples[0], examples[1]])
    laid = reader.drawing_prompts(tok, [r["prompt"][-1]["content"] for r in rows])
    start, first, n = laid["start"], laid["first"], model.config.num_vq_tokens
    codes = reader.codes([load_image(r["extra_info"]["solution"]) for r in rows]) + first
    assert torch.equal(batch["input_ids"][:, :start], laid["ids"][:, :start])  # what MaskGIT draws from
    assert torch.equal(batch["input_ids"][:, start:start + n], codes)
    assert (batch["input_ids"][:, -1] == model.config.eoi_token_id).all()
    assert batch["input_ids"].shape[1] == start + n + 1
    assert batch["loss_mask"].sum(-1).tolist() == [n, n] and batch["loss_mask"][:, start:start + n].all()
    assert torch.equal(batch["attention_mask"][:, :start], laid["attention_mask"][:, :start])
    assert batch["attention_mask"][:, start:].all() and not batch["attention_mask"].all()  # the text's padding
    assert torch.equal(batch["uncond_ids"][:, :start], laid["uncond_ids"][:, :start])  # guidance's empty prompt
    assert torch.equal(batch["uncond_ids"][:, start:], batch["input_ids"][:, start:])
    assert torch.equal(batch["uncond_attention_mask"][:, :start], laid["uncond_mask"][:, :start])

    with pytest.raises(ValueError, match="max_length=60: raise data.max_length"):
        tokenize_dataset(load_rows(path), tok, family, SFTDataConfig(path=path, max_length=60), reader)
    text = tmp_path / "mixed.jsonl"
    text.write_text(Path(path).read_text() + json.dumps(make_task("sum4", 1)[0]) + "\n")
    with pytest.raises(ValueError, match="2 of 3 rows are drawings"):
        tokenize_dataset(load_rows(str(text)), tok, family, config, reader)
    llada, llada_tok = tiny("llada")
    with pytest.raises(ValueError, match="a model that draws none"):
        tokenize_dataset(load_rows(path), llada_tok, Family.from_pretrained(llada.config, llada_tok), config, None)


def test_the_drawing_loss_is_mmadas_mean_cross_entropy_over_the_masked_codes(tmp_path):
    """The whole vocabulary, no 1/t weight, divided by the masked codes (not per example), every column a position;
    a row whose text is dropped reads the empty prompt."""
    from dare.trainers.sft import DiffusionSFTTrainer

    path, _ = drawing_rows(tmp_path, 3)
    model, tok = tiny("mmada")
    family, reader = Family.from_pretrained(model.config, tok), pictures(model.config)
    config = SFTDataConfig(path=path, max_length=80)
    batch = SFTCollator(family, config, reader)(list(tokenize_dataset(load_rows(path), tok, family, config, reader)))
    t, masked = sft_noise(family, batch["input_ids"], batch["loss_mask"], DRAWING, torch.Generator().manual_seed(1))
    assert masked.sum(-1).tolist() != [1, 1, 1]

    def by_hand(ids, attention):
        positions = torch.arange(ids.shape[1])[None]
        logits = model(input_ids=ids.masked_fill(masked, family.mask_id), attention_mask=attention,
                       position_ids=positions).logits
        return F.cross_entropy(logits[masked].float(), ids[masked])

    ids, attention = batch["input_ids"], batch["attention_mask"]
    loss = sft_loss(EveryPosition(model), family, ids, batch["loss_mask"], attention, recipe=DRAWING, t=t,
                    masked=masked)
    assert torch.allclose(loss, by_hand(ids, attention), atol=1e-5)
    # the trainer: the rows whose text drops read the empty prompt, the others their text
    trainer = DiffusionSFTTrainer.__new__(DiffusionSFTTrainer)
    trainer.family, trainer.sp, trainer.model = family, None, model
    drop = torch.tensor([True, False, True])
    inputs = {**batch, "t": t, "masked": masked, "drop_text": drop}
    mixed_ids = torch.where(drop[:, None], batch["uncond_ids"], ids)
    mixed_attention = torch.where(drop[:, None], batch["uncond_attention_mask"], attention)
    assert not torch.equal(mixed_ids, ids)
    trainer.state = type("State", (), {"global_step": 1})()
    trainer.args = type("Args", (), {"logging_steps": 1000})()
    model.eval()  # not training: the loss only
    assert torch.allclose(trainer.compute_loss(model, inputs), by_hand(mixed_ids, mixed_attention), atol=1e-5)
    assert not math.isclose(float(by_hand(mixed_ids, mixed_attention)), float(by_hand(ids, attention)), rel_tol=1e-4)


def test_a_tiny_mmada_trained_on_drawings_draws_their_codes(tmp_path):
    """train_sft.py on four drawing rows: MaskGIT (greedy, no guidance) then draws codes of their pictures, which the
    random start never does (1 in 8,192 by chance)."""
    import train_sft
    from dare.models import load_pretrained
    from dare.sampling.maskgit import DrawConfig, maskgit

    path, rows = drawing_rows(tmp_path, 4)

    def matches(model, tok):
        reader = pictures(model.config)
        laid = reader.drawing_prompts(tok, [r["prompt"][-1]["content"] for r in rows])
        truth = reader.codes([load_image(r["extra_info"]["solution"]) for r in rows])
        with torch.no_grad():
            codes, _ = maskgit(model.eval(), laid["ids"], laid["attention_mask"], laid["start"], laid["first"],
                               laid["size"], model.config.mask_token_id, DrawConfig(steps=8, guidance=0, temperature=0))
        return int((codes == truth).sum())

    before = matches(*tiny("mmada"))
    sft = train_sft.Args(model="tiny:mmada", output_dir=str(tmp_path / "sft"), max_steps=300, save_steps=300,
                         per_device_train_batch_size=4, learning_rate=1e-2, warmup_steps=0.0, logging_steps=40,
                         lr_scheduler_type="constant")
    sft.data.path, sft.data.max_length = path, 80
    train_sft.main(sft)
    after = matches(*load_pretrained(str(tmp_path / "sft"))[:2])
    print(f"codes drawn as their pictures': {before} -> {after} of 64 (measured 0 -> 47; chance 0.008)")
    assert before == 0 and after >= 20
