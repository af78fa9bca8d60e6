"""LLaDA-V (``dare.models.llada_v``), the first multimodal family's model: the official key names and shapes (the
trunk's published key list; LLaVA-OneVision's vision side), the trunk equal to DARE's LLaDA on the same weights under
Llama's names, and the picture features as the official tower and projector compute them."""

import json

import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoModel, SiglipVisionModel

from dare.data import load_rows
from dare.models import LLaDAVConfig, LLaDAVModelLM, tiny
from dare.models.llada_v import TOWERS, crops_of, feature_count, image_processor, placeholders, tiny_config

# the trunk's config.json in ML-GSAI/LLaDA-V train/llada_v_prepare/files (LLaDA-8B-Instruct under Llama's names), and
# the official LLaVA fields of its training scripts (train/scripts/llada_v_finetune.sh)
TRUNK = {"hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 32, "num_hidden_layers": 32,
         "num_key_value_heads": 32, "vocab_size": 126464, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,
         "max_position_embeddings": 16384, "tie_word_embeddings": False, "rope_scaling": None, "bos_token_id": 128000,
         "eos_token_id": 126081, "attention_bias": False, "hidden_act": "silu"}
LLAVA = {"mm_vision_tower": "google/siglip2-so400m-patch14-384", "mm_projector_type": "mlp2x_gelu",
         "mm_vision_select_layer": -2, "mm_use_im_start_end": False, "mm_use_im_patch_token": False,
         "image_aspect_ratio": "anyres_max_4", "mm_patch_merge_type": "spatial_unpad", "mm_hidden_size": 1152,
         "image_grid_pinpoints": [[384, 384], [384, 768]], "tokenizer_model_max_length": 8192}


def trunk_keys(layers: int) -> set[str]:
    """The published key list of the trunk (model.safetensors.index.json: 291 keys for 32 layers)."""
    per_layer = ["input_layernorm.weight", "post_attention_layernorm.weight", "mlp.down_proj.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight"] + [f"self_attn.{p}_proj.weight" for p in "qkvo"]
    keys = {f"model.layers.{i}.{k}" for i in range(layers) for k in per_layer}
    return keys | {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"}


def test_the_official_config_builds_the_official_key_names_and_shapes():
    config = LLaDAVConfig(**TRUNK, **LLAVA)
    assert config.vision_config == TOWERS["google/siglip2-so400m-patch14-384"]
    with torch.device("meta"):
        model = LLaDAVModelLM(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    text = {k for k in shapes if ".vision_tower." not in k and ".mm_projector." not in k and "newline" not in k}
    assert text == trunk_keys(32) and len(text) == 291
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (126464, 4096)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (12288, 4096)
    # LLaVA-OneVision's vision side: SigLIP so400m/14 at 384 (26 layers kept of 27), mlp2x_gelu, the row-end vector
    tower = "model.vision_tower.vision_tower.vision_model."
    assert shapes[tower + "embeddings.patch_embedding.weight"] == (1152, 3, 14, 14)
    assert shapes[tower + "embeddings.position_embedding.weight"] == (729, 1152)
    assert {k.split(".")[6] for k in shapes if k.startswith(tower + "encoder.layers.")} == {str(i) for i in range(26)}
    assert shapes[tower + "post_layernorm.weight"] == (1152,) and not any(".head." in k for k in shapes)
    assert shapes["model.mm_projector.0.weight"] == (4096, 1152) and shapes["model.mm_projector.2.weight"] == (
        4096, 4096)
    assert shapes["model.image_newline"] == (4096,)


def test_an_official_config_json_loads_through_the_auto_classes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TRUNK, **LLAVA, "model_type": "llava_llada",
                                                      "architectures": ["LlavaLLaDAModelLM"]}))
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is LLaDAVConfig and config.rope_parameters["rope_theta"] == 500000.0
    assert config.mm_use_im_start_end is False  # LLaVA's other fields are kept as given
    with pytest.raises(ValueError, match="unknown vision tower 'openai/clip-vit-large-patch14'"):
        LLaDAVConfig(**{**TRUNK, **LLAVA, "mm_vision_tower": "openai/clip-vit-large-patch14"})
    with pytest.raises(ValueError, match="projector 'linear'"):
        LLaDAVConfig(**{**TRUNK, **LLAVA, "mm_projector_type": "linear"})
    tiny_model = LLaDAVModelLM(tiny_config(300, mask_token_id=299))
    tiny_model.save_pretrained(tmp_path / "tiny")
    again = AutoModel.from_pretrained(tmp_path / "tiny")
    assert type(again) is LLaDAVModelLM
    for key, value in tiny_model.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key


def test_the_trunk_is_llada_under_llamas_names():
    """LLaDA-V's trunk is LLaDA-8B-Instruct renamed (its prepare step): DARE's LLaDA and this trunk, holding the same
    weights under their two sets of names, give the same bidirectional logits, with and without padding."""
    llada, _ = tiny("llada")
    c = llada.config
    llada_v = LLaDAVModelLM(tiny_config(c.vocab_size, hidden_size=c.d_model, intermediate_size=c.mlp_hidden_size,
                                        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads,
                                        num_key_value_heads=c.n_kv_heads, rope_theta=c.rope_theta,
                                        rms_norm_eps=c.rms_norm_eps)).eval()
    names = {"attn_norm": "input_layernorm", "ff_norm": "post_attention_layernorm", "q_proj": "self_attn.q_proj",
             "k_proj": "self_attn.k_proj", "v_proj": "self_attn.v_proj", "attn_out": "self_attn.o_proj",
             "ff_proj": "mlp.gate_proj", "up_proj": "mlp.up_proj", "ff_out": "mlp.down_proj"}
    renamed = {"model.embed_tokens.weight": llada.model.transformer.wte.weight,
               "model.norm.weight": llada.model.transformer.ln_f.weight, "lm_head.weight": llada.lm_head.weight
               if hasattr(llada, "lm_head") else llada.model.transformer.ff_out.weight}
    for key, value in llada.state_dict().items():
        if ".blocks." in key:
            i, name = key.split(".blocks.")[1].split(".", 1)
            module, _, leaf = name.rpartition(".")
            renamed[f"model.layers.{i}.{names[module]}.{leaf}"] = value
    missing, unexpected = llada_v.load_state_dict(renamed, strict=False)
    assert not unexpected and all("vision" in k or "mm_projector" in k or "newline" in k for k in missing)
    ids = torch.randint(0, 200, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        for attention in (None, mask):
            torch.testing.assert_close(llada_v(input_ids=ids, attention_mask=attention).logits,
                                       llada(input_ids=ids, attention_mask=attention).logits, atol=1e-5, rtol=1e-5)


def test_picture_features_are_the_towers_last_kept_layer_through_the_projector():
    """As the official ``SigLipVisionTower.forward`` and ``mlp2x_gelu``: the last remaining layer's hidden states
    (before the post-layernorm, which it never applies), then Linear, GELU, Linear; one row per patch."""
    model = LLaDAVModelLM(tiny_config(300, mask_token_id=299)).eval()
    tower = model.model.vision_tower.vision_tower["vision_model"]
    assert isinstance(tower, SiglipVisionModel)
    pixels = torch.randn(3, 3, 28, 28)
    with torch.no_grad():
        states = tower(pixels, output_hidden_states=True).hidden_states[-1]
        first, _, second = model.model.mm_projector
        expect = second(torch.nn.functional.gelu(first(states)))
        got = model.model.crop_features(pixels)
    assert got.shape == (3, (28 // 7) ** 2, 64)
    torch.testing.assert_close(got, expect)
    assert not torch.allclose(states, tower(pixels).last_hidden_state)  # the post-layernorm output differs


def pictures(*sizes):
    """Random-coloured PIL pictures of the given (width, height) sizes."""
    g = torch.Generator().manual_seed(0)
    return [Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).to(torch.uint8).numpy()) for w, h in sizes]


SIZES = ((28, 28), (100, 40), (40, 100), (300, 290))  # one crop; wide; tall; large enough to be shrunk (anyres_max_4)


def test_pictures_are_packed_as_llava_onevision_packs_them():
    """Each picture: its whole crop, then its grid of crops laid out as the picture, unpadded, shrunk to at most 4
    crops' worth, rows closed by image_newline: equal to transformers'
    LLaVA-OneVision packing (the port of the same llava_arch code) on the same crop features; the placeholder count
    (``feature_count``, computed on the meta device) is the packed length."""
    from transformers import LlavaOnevisionConfig, LlavaOnevisionModel

    model = LLaDAVModelLM(tiny_config(300, mask_token_id=299)).eval()
    config = model.config
    inputs = image_processor(config)(images=pictures(*SIZES), return_tensors="pt")
    assert inputs["pixel_values"].shape[2:] == (3, 28, 28)
    with torch.no_grad():
        packed = model.model.image_features(inputs["pixel_values"], inputs["image_sizes"])
        crops = [model.model.crop_features(p[:crops_of(config, s)])
                 for p, s in zip(inputs["pixel_values"], inputs["image_sizes"].tolist(), strict=True)]
    reference = LlavaOnevisionConfig(vision_config=config.tower_config().to_dict(), text_config={"model_type": "llama"},
                                     image_grid_pinpoints=config.image_grid_pinpoints)
    with torch.device("meta"):
        hf = LlavaOnevisionModel(reference)
    expect, lengths = hf.pack_image_features(crops, inputs["image_sizes"], model.model.image_newline.detach(),
                                             vision_aspect_ratio=config.image_aspect_ratio)
    for got, want, size in zip(packed, expect, inputs["image_sizes"].tolist(), strict=True):
        torch.testing.assert_close(got, want)
        assert feature_count(config, size) == len(got)
    # 28 x 28: the whole crop (16) + a 1 x 1 grid of 4 rows of 4 + newline; 300 x 290: a 6 x 6 grid (24 x 24 features)
    # shrunk by 3 to 8 x 8 (anyres_max_4: 4 crops' worth), rows of 8 + newline
    assert [len(p) for p in packed] == [16 + 4 * 5, 72, 81, 16 + 8 * 9]


def test_pictures_fill_their_placeholders_and_the_text_reads_them():
    """Id ``-(j + 1)`` takes feature j of the batch's pictures (``feature_count`` per picture, in order): the same
    logits from ``pixel_values``, from precomputed ``image_embeds`` and from embeddings assembled by hand, and for
    rows repeated in another order (each placeholder names its feature); the answer positions read the picture
    (another picture changes them); gradients reach the projector and the tower; a placeholder past the features,
    or placeholders without pictures, fail."""
    model = LLaDAVModelLM(tiny_config(300, mask_token_id=299)).eval()
    config = model.config
    processor = image_processor(config)
    inputs = processor(images=pictures((100, 40), (28, 28)), return_tensors="pt")
    counts = [feature_count(config, s) for s in inputs["image_sizes"].tolist()]
    ids = torch.randint(0, 290, (2, max(counts) + 6))
    ids[0, 1:1 + counts[0]] = placeholders(0, counts[0])
    ids[1, 1:1 + counts[1]] = placeholders(counts[0], counts[1])
    pixels, sizes = inputs["pixel_values"], inputs["image_sizes"]
    with torch.no_grad():
        features = model.model.image_features(pixels, sizes)
        by_hand = model.model.embed_tokens(ids.clamp(min=0))
        for row, f in enumerate(features):
            by_hand[row, 1:1 + len(f)] = f
        expect = model(inputs_embeds=by_hand).logits
        torch.testing.assert_close(model(input_ids=ids, pixel_values=pixels, image_sizes=sizes).logits, expect)
        table = torch.cat(features)
        torch.testing.assert_close(model(input_ids=ids, image_embeds=table).logits, expect)
        torch.testing.assert_close(model(input_ids=ids[[1, 0, 1]], image_embeds=table).logits, expect[[1, 0, 1]])
        changed = model(input_ids=ids, pixel_values=pixels.flip(2), image_sizes=sizes).logits  # colours swapped
    assert (changed[:, -5:] - expect[:, -5:]).abs().max() > 1e-4
    model.zero_grad()
    model(input_ids=ids, pixel_values=pixels, image_sizes=sizes).logits[:, -1].sum().backward()
    tower = model.model.vision_tower.vision_tower["vision_model"]
    assert model.model.mm_projector[0].weight.grad.abs().sum() > 0 and model.model.image_newline.grad.abs().sum() > 0
    assert tower.embeddings.patch_embedding.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match=f"names picture feature {sum(counts) - 1} of {counts[0]}"):
        model(input_ids=ids, image_embeds=features[0])
    with pytest.raises(ValueError, match="placeholders but no pictures were given"):
        model(input_ids=ids)


def test_a_picture_prompt_holds_each_pictures_placeholders_between_its_text_pieces():
    from dare.models.readers import picture_prompt_ids

    _, tok = tiny("llada")
    config = tiny_config(300, mask_token_id=299)
    sizes = [(40, 100), (28, 28)]
    counts = [feature_count(config, s) for s in sizes]
    text = "<image>\nHow many red shapes? <image> and these?"
    ids = picture_prompt_ids(tok, text, counts, first=5)
    words = [tok(piece, add_special_tokens=False).input_ids for piece in ("\nHow many red shapes? ", " and these?")]
    expect = (placeholders(5, counts[0]).tolist() + words[0] + placeholders(5 + counts[0], counts[1]).tolist()
              + words[1])
    assert ids == expect
    assert picture_prompt_ids(tok, "no pictures", []) == tok("no pictures", add_special_tokens=False).input_ids
    with pytest.raises(ValueError, match="2 <image> placeholder.*for 1 picture"):
        picture_prompt_ids(tok, text, counts[:1])


def test_dares_samplers_decode_a_picture_prompt_handed_the_model_with_its_pictures():
    """DARE's masked-diffusion sampler, unchanged, decodes picture prompts when handed ``WithPictures``: a permuted
    batch decodes to the permuted answers (each placeholder names its feature), features computed once equal
    features computed at every step, and the bare model refuses the placeholders."""
    from dare.models import Family
    from dare.models.llada_v import WithPictures
    from dare.models.readers import picture_prompt_ids
    from dare.sampling import SamplingConfig, generate

    _, tok = tiny("llada")
    ids = dict(mask_token_id=tok.convert_tokens_to_ids("<|mdm_mask|>"), eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    model = LLaDAVModelLM(tiny_config(len(tok), **ids)).eval()
    family = Family.from_pretrained(model.config, tok)
    assert (family.name, family.mask_id, family.block_size) == ("llada_v", ids["mask_token_id"], None)
    inputs = image_processor(model.config)(images=pictures((100, 40), (28, 28)), return_tensors="pt")
    counts = [feature_count(model.config, s) for s in inputs["image_sizes"].tolist()]
    rows = []
    for question, first, count in (("How many red shapes?", 0, counts[0]), ("And green?", counts[0], counts[1])):
        text = tok.apply_chat_template([{"role": "user", "content": f"<image>\n{question}"}], tokenize=False,
                                       add_generation_prompt=True)
        rows.append(picture_prompt_ids(tok, text, [count], first))
    width = max(map(len, rows))
    prompt = torch.tensor([[tok.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    config = SamplingConfig(gen_length=8, steps=8, temperature=0.0)
    pictured = WithPictures(model, inputs["pixel_values"], inputs["image_sizes"])
    out = generate(pictured, family, prompt, mask, config).sequences
    swapped = generate(pictured, family, prompt[[1, 0]], mask[[1, 0]], config).sequences
    assert torch.equal(swapped, out[[1, 0]])
    every_step = WithPictures(model, inputs["pixel_values"], inputs["image_sizes"], fixed=False)
    assert torch.equal(generate(every_step, family, prompt, mask, config).sequences, out)
    with pytest.raises(ValueError, match="placeholders but no pictures"):
        generate(model, family, prompt, mask, config)


def test_tiny_llada_v_is_a_family_that_reads_pictures_and_text_families_do_not():
    from dare.models import Family
    from dare.models import pictures as reader_of

    model, tok = tiny("llada_v")
    family = Family.from_pretrained(model.config, tok)
    reader = reader_of(model.config)
    assert family.pictures and not Family.from_pretrained(tiny("llada")[0].config, tok).pictures
    assert reader_of(tiny("llada")[0].config) is None
    inputs = reader(pictures((100, 40), (28, 28)))
    assert inputs["pixel_values"].shape[:3] == (2, 9, 3) and inputs["image_sizes"].tolist() == [[40, 100], [28, 28]]
    assert [reader.count(s) for s in inputs["image_sizes"].tolist()] == [72, 36]
    wrapped = reader.wrap(model, **inputs)
    assert wrapped.config is model.config and next(wrapped.parameters()) is next(model.parameters())


def test_sft_on_pictures_trains_the_tower_and_projector_and_text_families_refuse_them(tmp_path):
    """train_sft.py on the visual task with tiny:llada_v: each example's picture placeholders are renumbered over
    its batch and its pictures arrive as pixel_values; after a few steps the tower and the projector have moved
    (their gradients came through the pictures); a text family refuses the same rows before loading weights."""
    import train_sft
    from dare.data import SFTCollator
    from dare.data.sft import SFTDataConfig, tokenize_dataset
    from dare.data.tasks import write_task
    from dare.models import Family
    from dare.models import pictures as reader_of
    from dare.models.loading import load_pretrained

    data = write_task("shapes", str(tmp_path / "shapes.parquet"), 24)
    model, tok = tiny("llada_v")
    family, reader = Family.from_pretrained(model.config, tok), reader_of(model.config)
    config = SFTDataConfig(path=data, max_length=160, pad_to="longest")
    examples = tokenize_dataset(load_rows(data, images=True), tok, family, config, reader)
    batch = SFTCollator(family, config, reader)([examples[0], examples[1]])
    counts = [sum(i < 0 for i in e["input_ids"]) for e in (examples[0], examples[1])]
    assert (batch["input_ids"] < 0).sum(-1).tolist() == counts
    assert sorted((-batch["input_ids"][batch["input_ids"] < 0] - 1).tolist()) == list(range(sum(counts)))
    assert batch["pixel_values"].shape[0] == 2 and batch["image_sizes"].tolist() == [[48, 48], [48, 48]]

    args = train_sft.Args(model="tiny:llada_v", output_dir=str(tmp_path / "out"), max_steps=4, save_steps=4,
                          per_device_train_batch_size=4, learning_rate=1e-2, warmup_steps=0.0, logging_steps=1)
    args.data.path, args.data.max_length, args.data.pad_to = data, 160, "longest"
    train_sft.main(args)
    trained, _, _ = load_pretrained(str(tmp_path / "out"))
    tower = "model.vision_tower.vision_tower.vision_model.embeddings.patch_embedding.weight"
    for key in (tower, "model.mm_projector.0.weight"):
        assert not torch.allclose(trained.state_dict()[key], model.state_dict()[key]), key
    refused = train_sft.Args(model="tiny:llada", output_dir=str(tmp_path / "text"))
    refused.data.path = data
    with pytest.raises(ValueError, match="holds images"):
        train_sft.main(refused)


def test_the_picture_probe_decodes_every_held_out_picture(tmp_path, capsys):
    """bench/probe_pictures.py on a saved tiny LLaDA-V: one answer per held-out picture, scored, with the majority
    answer beside it; a text model is refused."""
    import importlib.util

    from dare.models import save_tiny

    spec = importlib.util.spec_from_file_location("probe_pictures", "bench/probe_pictures.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    acc = probe.main(["--model", save_tiny("llada_v", tmp_path / "m"), "--questions", "6", "--gen-length", "4",
                      "--batch", "4"])
    out = capsys.readouterr().out
    assert 0.0 <= acc <= 1.0 and "right on 6 held-out pictures; always answering" in out and out.count("truth") == 5
    probe.main(["--model", str(tmp_path / "m"), "--questions", "3", "--gen-length", "4", "--wrong-pictures"])
    assert "right on 3 the next question's pictures" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="reads no pictures"):
        probe.main(["--model", save_tiny("llada", tmp_path / "t"), "--questions", "2"])


def test_the_engine_decodes_picture_prompts_in_micro_batches_as_in_one_batch():
    """HFEngine with ``PicturePrompt``s: n samples per prompt over micro-batches of 3 rows (a prompt's samples split
    across them) decode greedily what one batch of the model handed all the pictures decodes; the rollout keeps each
    row's pictures (rows of a prompt share them) through select and join; a text model refuses pictures."""
    from dare.data.images import PicturePrompt, batch_pictures, encode_pictured
    from dare.engines import HFEngine
    from dare.engines.base import Rollout
    from dare.models import Family
    from dare.models import pictures as reader_of
    from dare.models.llada_v import WithPictures
    from dare.sampling import SamplingConfig, generate

    model, tok = tiny("llada_v")
    family, reader = Family.from_pretrained(model.config, tok), reader_of(model.config)
    shown = [(p,) for p in pictures((100, 40), (28, 28))]
    prompts = [PicturePrompt([{"role": "user", "content": f"<image>\nHow many {c} shapes?"}], own)
               for c, own in zip(("red", "green"), shown, strict=True)]
    config = SamplingConfig(gen_length=6, steps=6, temperature=0.0)
    rollout = HFEngine(model, tok, family, max_batch_size=3).generate(prompts, 2, config, seed=0)
    ids = [e for e in encode_pictured(tok, reader, prompts) for _ in range(2)]
    width = max(map(len, ids))
    prompt = torch.tensor([[family.pad_id] * (width - len(i)) + i for i in ids])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(i) for i in ids])[:, None]).long()
    owners = [own for own in shown for _ in range(2)]
    fed, inputs = batch_pictures(reader, prompt, owners)
    with torch.no_grad():
        alone = generate(WithPictures(model, **inputs), family, fed, mask, config).sequences
    assert torch.equal(rollout.completion_ids, alone) and torch.equal(rollout.prompt_ids, prompt)
    assert rollout.pictures[0] is rollout.pictures[1] is shown[0] and rollout.pictures[2] is shown[1]
    assert rollout.select([3, 0]).pictures == [shown[1], shown[0]]
    assert Rollout.join([rollout.select([0]), rollout.select([2])], family.pad_id).pictures == [shown[0], shown[1]]
    text_model, text_tok = tiny("llada")
    with pytest.raises(ValueError, match="for a llada model, which reads none"):
        HFEngine(text_model, text_tok, Family.from_pretrained(text_model.config, text_tok)).generate(
            [PicturePrompt("q", ())], 1, config)


def test_a_micro_batch_handed_only_its_rows_pictures_reads_them_as_the_whole_batch():
    """A rollout numbers its placeholders over all its pictures (``number_pictures``); a micro-batch of its rows is
    handed only the pictures those rows use, with ``picture_at`` (their features' numbers in the rollout): its logits
    equal the whole batch's on those rows, with features computed once or at every call (gradients). Without
    ``picture_at`` the same features fill the wrong placeholders (control)."""
    from dare.data.images import PicturePrompt, encode_pictured, number_pictures, used_pictures
    from dare.models import pictures as reader_of
    from dare.models.llada_v import WithPictures

    model, tok = tiny("llada_v")
    model.eval()
    reader = reader_of(model.config)
    shown = [(p,) for p in pictures((100, 40), (28, 28), (40, 100))]
    prompts = [PicturePrompt(f"<image>\nHow many shapes of kind {k}?", own) for k, own in enumerate(shown)]
    ids = encode_pictured(tok, reader, prompts)
    width = max(map(len, ids))
    batch = torch.tensor([[0] * (width - len(i)) + i for i in ids])
    owners = list(shown)
    numbered, lists = number_pictures(batch, owners)
    assert [(first, count) for first, count, _ in lists] == [(0, reader.count((40, 100))),
                                                               (reader.count((40, 100)), reader.count((28, 28))),
                                                               (reader.count((40, 100)) + reader.count((28, 28)),
                                                                reader.count((100, 40)))]
    with torch.no_grad():
        whole = WithPictures(model, **reader([p for _, _, own in lists for p in own]))(numbered).logits
        part = numbered[1:]
        inputs = used_pictures(reader, part, lists)
        assert inputs["pixel_values"].shape[0] == 2 and inputs["picture_at"][0] == lists[1][0]
        for fixed in (True, False):
            torch.testing.assert_close(WithPictures(model, fixed=fixed, **inputs)(part).logits, whole[1:])
        inputs.pop("picture_at")
        with pytest.raises(ValueError, match="names picture feature"):
            WithPictures(model, **inputs)(part)
    assert used_pictures(reader, torch.tensor([[5, 6]]), lists) == {}


def test_rl_on_pictures_trains_the_tower_alike_for_any_micro_batch_and_text_families_refuse_them(tmp_path):
    """train_rl.py (d1: its prompt masking draws on the whole batch) on the visual task with tiny:llada_v: one SGD
    step with one micro-batch of 8 or four of 2 moves the weights alike, the tower and projector included (their
    gradients came through the pictures); inner iterations and a KL reference score old and reference log-probs
    through the pictures; a text family, packing and another engine refuse before loading weights."""
    import train_rl
    from dare.data.tasks import write_task
    from dare.models import load_pretrained

    data = write_task("shapes", str(tmp_path / "shapes.parquet"), 16)
    start = tiny("llada_v")[0].state_dict()

    def run(name, **kw):
        kw = dict(model="tiny:llada_v", output_dir=str(tmp_path / name), max_steps=1, prompts_per_step=2,
                  num_generations=4, save_steps=1, optim="sgd", learning_rate=1.0,
                  rewards=["dare_test_rewards.length"]) | kw
        args = train_rl.args_class("d1")(**kw)
        args.data.path, args.rollout.gen_length, args.rollout.temperature = data, 8, 1.0
        return args

    for name, size in (("one", 8), ("four", 2)):
        train_rl.main(run(name, micro_batch_size=size))
    one, four = (load_pretrained(str(tmp_path / name))[0].state_dict() for name in ("one", "four"))
    for key in ("model.vision_tower.vision_tower.vision_model.embeddings.patch_embedding.weight",
                "model.mm_projector.0.weight", "model.layers.0.mlp.up_proj.weight"):
        assert (one[key] - start[key]).abs().max() > 1e-4, key
    assert all(torch.allclose(one[k], four[k], atol=1e-6) for k in one)
    inner = run("inner", micro_batch_size=4, max_steps=2, save_steps=2)
    inner.algo_config.num_iterations, inner.algo_config.beta = 2, 0.1
    train_rl.main(inner)
    for refused, match in ((run("text", model="tiny:llada"), "holds images"), (run("packed", pack=1), "reads pictures"),
                           (run("served", rollout_engine="sglang"), "reads pictures")):
        with pytest.raises(ValueError, match=match):
            train_rl.main(refused)


def test_evaluation_decodes_picture_benchmarks_and_a_rerun_reuses_only_the_same_pictures(tmp_path):
    """evaluate.py's harness on task:shapes with tiny:llada_v: every held-out picture question decoded and scored
    (the greedy answers equal the engine's on the rows' PicturePrompts), a rerun reuses them all; a record's prompt
    hash covers its pictures (another picture of the same size: another plan); a text model refuses the benchmark."""
    from dare.data.images import pictured_prompt, png
    from dare.engines import HFEngine
    from dare.eval import harness
    from dare.eval.benchmarks import load_benchmark
    from dare.models import Family
    from dare.sampling import SamplingConfig

    model, tok = tiny("llada_v")
    engine = HFEngine(model, tok, Family.from_pretrained(model.config, tok), max_batch_size=4)
    config = SamplingConfig(gen_length=6, steps=6, temperature=0.0)
    run = lambda: harness.evaluate_benchmarks(engine, ["task:shapes"], config, tmp_path, limit=5, batch_size=2,
                                              model_name="tiny:llada_v")["task:shapes"]
    first, again = run(), run()
    assert (first["decoded"], again["decoded"], again["reused"]) == (5, 0, 5)
    rows = load_benchmark("task:shapes", limit=5, images=True)
    texts = engine.generate([pictured_prompt(r) for r in rows], 1, config, seed=0).texts
    records = sorted(harness.read_records(tmp_path), key=lambda r: r["index"])
    assert [r["output"] for r in records] == texts
    changed = [dict(rows[0], images=[png(pictures((48, 48))[0])]), rows[1]]
    plans = [harness.expected(engine, r, [[0, 1]]) for r in (rows[:2], changed)]
    assert plans[0][0] != plans[1][0] and plans[0][1] == plans[1][1]
    text_model, text_tok = tiny("llada")
    text = HFEngine(text_model, text_tok, Family.from_pretrained(text_model.config, text_tok))
    with pytest.raises(ValueError, match="its questions are pictures, and this model reads text only"):
        harness.evaluate_benchmarks(text, ["task:shapes"], config, tmp_path / "text", limit=2)


def test_lora_sft_and_lora_rl_with_a_reference_run_on_pictures(tmp_path):
    """LoRA on tiny:llada_v with picture rows: SFT writes adapters and a merged folder with the official keys; RL with
    a KL reference (the adapter-disabled base, handed the pictures through PEFT's wrapper) starts at KL 0."""
    import json as json_

    import train_rl
    import train_sft
    from dare.data.tasks import write_task
    from dare.models.loading import load_pretrained

    data = write_task("shapes", str(tmp_path / "shapes.parquet"), 16)
    sft = train_sft.Args(model="tiny:llada_v", output_dir=str(tmp_path / "sft"), max_steps=2, save_steps=2,
                         per_device_train_batch_size=4)
    sft.data.path, sft.data.max_length, sft.data.pad_to = data, 160, "longest"
    sft.lora.rank, sft.lora.alpha = 4, 8
    train_sft.main(sft)
    merged = load_pretrained(str(tmp_path / "sft" / "merged"))[0].state_dict()
    assert set(merged) == set(tiny("llada_v")[0].state_dict())
    rl = train_rl.args_class("d1")(model="tiny:llada_v", output_dir=str(tmp_path / "rl"), max_steps=2, save_steps=2,
                                    prompts_per_step=2, num_generations=4, micro_batch_size=4,
                                    rewards=["dare_test_rewards.length"], learning_rate=3e-2)
    rl.data.path, rl.rollout.gen_length, rl.rollout.temperature = data, 8, 1.0
    rl.lora.rank, rl.lora.alpha, rl.algo_config.beta = 4, 8, 0.1
    train_rl.main(rl)
    log = json_.loads((tmp_path / "rl" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    kls = [h["kl"] for h in log if "kl" in h]
    assert kls[0] == 0.0 and kls[-1] > 0.0
