"""MAGVIT-v2, the image tokenizer of Show-o and MMaDA (``dare.models.magvit``): the released tokenizer's key names and
shapes on the meta device, the code layout (13 signs as bits, most significant first), exact code -> vector -> code
round trips, shapes through encoder and decoder, and loading a folder. (Checked once, not here: with the same weights
the encoder, codes and decoder equal the reference implementation vendored in Gen-Verse/dLLM-RL at 10b4fd1,
``sample/vq/modeling_magvitv2.py``.)"""

import pytest
import torch

from dare.models.magvit import MAGVITConfig, MAGVITv2, tiny_config


def test_the_released_tokenizers_keys_and_shapes():
    with torch.device("meta"):
        model = MAGVITv2()
    state = model.state_dict()
    blocks = lambda side, level: len({k for k in state if k.startswith(f"{side}.{level}.block.") and
                                      k.endswith("conv1.weight")})
    assert [blocks("encoder.down", i) for i in range(5)] == [4, 3, 4, 3, 4]
    assert [blocks("decoder.up", i) for i in range(5)] == [4, 4, 3, 4, 3]
    assert {f"encoder.down.{i}.downsample.conv.weight" for i in range(4)} <= set(state)
    assert "encoder.down.4.downsample.conv.weight" not in state and "decoder.up.0.upsample.conv.weight" not in state
    assert {f"decoder.up.{i}.upsample.conv.weight" for i in range(1, 5)} <= set(state)
    assert state["encoder.conv_in.weight"].shape == (128, 3, 3, 3)
    assert state["encoder.down.1.block.0.nin_shortcut.weight"].shape == (256, 128, 1, 1)
    assert state["encoder.mid.attn_1.q.weight"].shape == (512, 512, 1, 1)
    assert state["encoder.conv_out.weight"].shape == (13, 512, 3, 3) and state["encoder.quant_conv.weight"].shape == \
        (13, 13, 1, 1)
    assert state["decoder.conv_in.weight"].shape == (512, 13, 3, 3) and state["decoder.conv_out.weight"].shape == \
        (3, 128, 3, 3)
    assert state["quantize.embedding"].shape == (8192, 13) and len(state) == 382
    assert not any(".attn.0." in k for k in state)  # attention only in the middle
    assert MAGVITConfig().codebook_size == 8192 and MAGVITConfig().downsampling == 16


def test_codes_are_the_signs_read_as_bits_and_round_trip_exactly():
    quantize = MAGVITv2(tiny_config()).quantize
    emb = quantize.embedding
    assert torch.equal(emb[1], torch.tensor([-1.0] * 12 + [1.0]))  # code 1: only the last bit set
    assert torch.equal(emb[4096], torch.tensor([1.0] + [-1.0] * 12))  # 2 ** 12: only the first
    codes = torch.randint(0, 8192, (3, 16), generator=torch.Generator().manual_seed(0))
    vectors = quantize.vectors(codes, 4)
    assert vectors.shape == (3, 13, 4, 4) and torch.equal(quantize.codes(vectors), codes)
    z = torch.randn(2, 13, 3, 3, generator=torch.Generator().manual_seed(1))
    flipped = z.clone()
    flipped[0, 12, 1, 2] *= -1  # the least significant bit of position (1, 2): row-major index 5
    delta = quantize.codes(flipped) - quantize.codes(z)
    assert delta.abs().sum() == 1 and delta[0, 5].abs() == 1


def test_pictures_become_codes_on_a_sixteenth_grid_and_decode_back_to_pictures():
    model = MAGVITv2(tiny_config()).eval()
    pixels = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(2)) * 2 - 1
    codes = model.codes(pixels)
    assert codes.shape == (2, 16) and codes.dtype == torch.long and 0 <= int(codes.min()) <= int(codes.max()) < 8192
    assert not torch.equal(codes[0], codes[1])  # different pictures, different codes
    assert model.picture(codes).shape == (2, 3, 64, 64)
    with pytest.raises(ValueError, match="square grid"):
        model.picture(codes[:, :15])


def test_a_folder_of_released_weights_loads_and_wrong_keys_are_named(tmp_path):
    from safetensors.torch import save_file

    model = MAGVITv2(tiny_config()).eval()
    save_file(model.state_dict(), str(tmp_path / "model.safetensors"))
    loaded = MAGVITv2.from_folder(str(tmp_path), tiny_config())
    pixels = torch.rand(1, 3, 32, 32) * 2 - 1
    assert torch.equal(loaded.codes(pixels), model.codes(pixels))
    state = model.state_dict()
    state["encoder.extra.weight"] = state.pop("encoder.conv_in.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="encoder.conv_in.weight"):
        MAGVITv2.from_folder(str(tmp_path), tiny_config())
    with pytest.raises(FileNotFoundError, match="no MAGVIT-v2 weights"):
        MAGVITv2.from_folder(str(tmp_path / "none"))
    model.save(str(tmp_path / "saved"))  # its shapes travel in config.json: a tiny tokenizer loads without them
    again = MAGVITv2.from_folder(str(tmp_path / "saved"))
    assert again.config == model.config and torch.equal(again.codes(pixels), model.codes(pixels))
