"""MAGVIT-v2, the image tokenizer of Show-o and MMaDA (``showlab/magvitv2``): a convolutional VQGAN encoder and
decoder around a look-up-free quantizer, under the official key names (``encoder.down.{i}.block.{j}.norm1``, ...,
``quantize.embedding``), so the released weights load as they are.

A 512 x 512 picture (padded square with white, resized, scaled to [-1, 1]: ``pixels``) becomes 32 x 32 codes in
[0, 8192): the encoder halves the resolution four times and ends in 13 channels; each position's code is the 13 signs
read as a binary number, most significant first (``codes``). ``picture`` decodes codes back to pixels. MMaDA reads a
picture as those codes shifted past its text vocabulary, and writes one the same way (its text-to-image decoding).

    tokenizer = MAGVITv2.from_folder("path/to/magvitv2")        # or MAGVITv2(tiny_config()) for tests
    codes = tokenizer.codes(pixels)                              # [N, 1024]
    images = tokenizer.picture(codes)                            # [N, 3, 512, 512] in about [-1, 1]
"""

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class MAGVITConfig:
    """The encoder's and decoder's shapes (the released tokenizer's defaults)."""

    ch: int = 128
    encoder_ch_mult: tuple = (1, 2, 2, 4, 4)
    encoder_res_blocks: tuple = (4, 3, 4, 3, 4)
    decoder_ch_mult: tuple = (1, 1, 2, 2, 4)
    decoder_res_blocks: tuple = (4, 4, 3, 4, 3)
    z_channels: int = 13  # the code's bits: 2 ** 13 = 8192 codes
    in_channels: int = 3
    groups: int = 32  # GroupNorm groups

    @property
    def codebook_size(self) -> int:
        return 2 ** self.z_channels

    @property
    def downsampling(self) -> int:
        return 2 ** (len(self.encoder_ch_mult) - 1)


def tiny_config() -> MAGVITConfig:
    """A tiny random tokenizer for tests: the same five levels (/16) and 13-bit codes, 32 channels throughout."""
    return MAGVITConfig(ch=32, encoder_ch_mult=(1,) * 5, encoder_res_blocks=(1,) * 5, decoder_ch_mult=(1,) * 5,
                        decoder_res_blocks=(1,) * 5)


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, channels, eps=1e-6)


class ResnetBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, groups: int):
        super().__init__()
        self.norm1, self.conv1 = _norm(in_channels, groups), nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2, self.conv2 = _norm(out_channels, groups), nn.Conv2d(out_channels, out_channels, 3, padding=1)
        if in_channels != out_channels:
            self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the positions, with 1 x 1 convolutions as projections."""

    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = _norm(channels, groups)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(channels, channels, 1) for _ in range(4))

    def forward(self, x):
        b, c, h, w = x.shape
        y = self.norm(x)
        q, k, v = (conv(y).flatten(2).transpose(1, 2) for conv in (self.q, self.k, self.v))  # [B, HW, C]
        out = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        return x + self.proj_out(out.transpose(1, 2).reshape(b, c, h, w))


class Level(nn.Module):
    """One resolution of the encoder or decoder: its residual blocks, then its down- or up-sampling convolution."""

    def __init__(self, channels_in: int, channels: int, blocks: int, groups: int, resample: str | None):
        super().__init__()
        self.block = nn.ModuleList(ResnetBlock(channels_in if i == 0 else channels, channels, groups)
                                   for i in range(blocks))
        self.attn = nn.ModuleList()  # the released tokenizer attends only in the middle
        if resample == "down":
            self.downsample = nn.Module()
            self.downsample.conv = nn.Conv2d(channels, channels, 3, stride=2)
        elif resample == "up":
            self.upsample = nn.Module()
            self.upsample.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        for block in self.block:
            x = block(x)
        if hasattr(self, "downsample"):  # pad right and bottom by one, then a stride-2 convolution
            x = self.downsample.conv(F.pad(x, (0, 1, 0, 1)))
        if hasattr(self, "upsample"):
            x = self.upsample.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return x


class Middle(nn.Module):
    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.block_1 = ResnetBlock(channels, channels, groups)
        self.attn_1 = AttnBlock(channels, groups)
        self.block_2 = ResnetBlock(channels, channels, groups)

    def forward(self, x):
        return self.block_2(self.attn_1(self.block_1(x)))


class Encoder(nn.Module):
    def __init__(self, config: MAGVITConfig):
        super().__init__()
        widths = [config.ch * m for m in config.encoder_ch_mult]
        self.conv_in = nn.Conv2d(config.in_channels, config.ch, 3, padding=1)
        last = len(widths) - 1
        self.down = nn.ModuleList(Level(config.ch if i == 0 else widths[i - 1], widths[i], config.encoder_res_blocks[i],
                                        config.groups, "down" if i < last else None) for i in range(len(widths)))
        self.mid = Middle(widths[-1], config.groups)
        self.norm_out = _norm(widths[-1], config.groups)
        self.conv_out = nn.Conv2d(widths[-1], config.z_channels, 3, padding=1)
        self.quant_conv = nn.Conv2d(config.z_channels, config.z_channels, 1)

    def forward(self, pixels):
        h = self.conv_in(pixels)
        for level in self.down:
            h = level(h)
        h = self.conv_out(F.silu(self.norm_out(self.mid(h))))
        return self.quant_conv(h)


class Decoder(nn.Module):
    def __init__(self, config: MAGVITConfig):
        super().__init__()
        widths = [config.ch * m for m in config.decoder_ch_mult]
        self.post_quant_conv = nn.Conv2d(config.z_channels, config.z_channels, 1)
        self.conv_in = nn.Conv2d(config.z_channels, widths[-1], 3, padding=1)
        self.mid = Middle(widths[-1], config.groups)
        # up.{i} is resolution i (0: the finest), run from the coarsest; each takes the width of the level above it
        self.up = nn.ModuleList(Level(widths[i + 1] if i + 1 < len(widths) else widths[-1], widths[i],
                                      config.decoder_res_blocks[i], config.groups, "up" if i > 0 else None)
                                for i in range(len(widths)))
        self.norm_out = _norm(widths[0], config.groups)
        self.conv_out = nn.Conv2d(widths[0], config.in_channels, 3, padding=1)

    def forward(self, z):
        h = self.mid(self.conv_in(self.post_quant_conv(z)))
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class LookupFreeQuantizer(nn.Module):
    """Each position's 13 channels -> their signs; the code is the signs as bits (positive = 1), most significant
    first. ``embedding`` ``[8192, 13]`` holds every code's ±1 vector (the decoder's input)."""

    def __init__(self, bits: int):
        super().__init__()
        weights = 2 ** torch.arange(bits - 1, -1, -1)
        self.register_buffer("embedding", ((torch.arange(2 ** bits)[:, None] & weights) > 0).float() * 2 - 1)
        self.register_buffer("power_vals", weights)

    def codes(self, z: torch.Tensor) -> torch.Tensor:
        """``[N, bits, H, W]`` -> codes ``[N, H * W]`` (row-major)."""
        return ((z > 0).long() * self.power_vals.view(1, -1, 1, 1)).sum(1).flatten(1)

    def vectors(self, codes: torch.Tensor, side: int) -> torch.Tensor:
        """Codes ``[N, side * side]`` -> their ±1 vectors ``[N, bits, side, side]``."""
        return self.embedding[codes].view(len(codes), side, side, -1).permute(0, 3, 1, 2)


class MAGVITv2(nn.Module):
    """The tokenizer: ``codes`` (pixels -> codes), ``picture`` (codes -> pixels)."""

    def __init__(self, config: MAGVITConfig | None = None):
        super().__init__()
        self.config = config or MAGVITConfig()
        self.encoder, self.decoder = Encoder(self.config), Decoder(self.config)
        self.quantize = LookupFreeQuantizer(self.config.z_channels)

    @torch.no_grad()
    def codes(self, pixels: torch.Tensor) -> torch.Tensor:
        """Pixels ``[N, 3, S, S]`` in [-1, 1] -> codes ``[N, (S / 16) ** 2]`` in [0, 8192)."""
        return self.quantize.codes(self.encoder(pixels))

    @torch.no_grad()
    def picture(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[N, side * side]`` -> pixels ``[N, 3, 16 side, 16 side]`` (about [-1, 1])."""
        side = int(round(codes.shape[1] ** 0.5))
        if side * side != codes.shape[1]:
            raise ValueError(f"MAGVIT-v2 decodes a square grid of codes, got {codes.shape[1]}")
        return self.decoder(self.quantize.vectors(codes, side))

    @classmethod
    def from_folder(cls, path: str, config: MAGVITConfig | None = None) -> "MAGVITv2":
        """The released tokenizer from its folder (``model.safetensors`` or ``pytorch_model.bin``, the official keys;
        a missing or unexpected key is an error naming it). Its shapes: ``config``, else those of a ``config.json``
        written by ``save`` (the keys of ``MAGVITConfig``; the released folder names none: the defaults)."""
        folder = Path(path)
        if config is None and (folder / "config.json").is_file():
            keys = {f.name for f in fields(MAGVITConfig)}
            saved = {k: tuple(v) if isinstance(v, list) else v
                     for k, v in json.loads((folder / "config.json").read_text()).items() if k in keys}
            config = MAGVITConfig(**saved)
        found = [folder / n for n in ("model.safetensors", "diffusion_pytorch_model.safetensors", "pytorch_model.bin",
                                      "diffusion_pytorch_model.bin") if (folder / n).is_file()]
        if not found:
            raise FileNotFoundError(f"{path}: no MAGVIT-v2 weights (model.safetensors or pytorch_model.bin)")
        if found[0].suffix == ".safetensors":
            from safetensors.torch import load_file
            state = load_file(str(found[0]))
        else:
            state = torch.load(found[0], map_location="cpu", weights_only=True)
        model = cls(config)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"{found[0]}: not MAGVIT-v2's keys (missing {missing[:3]}, unexpected {unexpected[:3]})")
        return model.eval()

    def config_dict(self) -> dict:
        return asdict(self.config)

    def save(self, path: str) -> None:
        """``model.safetensors`` and ``config.json`` (its shapes) in ``path``: what ``from_folder`` loads."""
        from safetensors.torch import save_file

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(self.config_dict(), indent=1))


__all__ = ["MAGVITConfig", "MAGVITv2", "tiny_config"]
