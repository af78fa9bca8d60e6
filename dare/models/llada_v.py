"""LLaDA-V (ML-GSAI, 2025): LLaDA's masked-diffusion trunk under Llama's names, fed pictures by a SigLIP vision tower
through a two-layer GELU projector, as LLaVA-OneVision is built (``model_type`` llava_llada).

Read, not copied: ``ML-GSAI/LLaDA-V`` ``train/llava/model/language_model/{llava_llada,modeling_llada}.py`` (the trunk:
Llama's modules with ``is_causal = False``, RoPE theta 500,000, untied ``lm_head``), ``llava_arch.py``
(``model.vision_tower``, ``model.mm_projector``, ``model.image_newline`` when ``mm_patch_merge_type`` unpads),
``multimodal_encoder/siglip_encoder.py`` (transformers' SigLIP vision model with its last layer deleted and no pooling
head: the picture's features are the last remaining layer's output, before the post-layernorm, 729 patches of a
384 x 384 crop), ``multimodal_projector/builder.py`` (``mlp2x_gelu``: Linear, GELU, Linear) and
``train/llada_v_prepare/files`` (the trunk's config and key list: LLaDA-8B-Instruct renamed to Llama's keys). The
official config names its tower (``mm_vision_tower``) instead of describing it; ``vision_config`` (DARE's field) does,
and defaults to that tower's published shape.
"""

import math
import re

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import LlamaConfig, SiglipVisionConfig, SiglipVisionModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.models.llava_onevision.modeling_llava_onevision import (
    get_anyres_image_grid_shape,
    image_size_to_num_patches,
    unpad_image,
)

from .common import DiffusionBackbone, DiffusionConfigMixin, DiffusionLM, clean_checkpoint_kwargs

# the towers LLaDA-V was trained with: their published shape, less the deleted last layer
TOWERS = {name: dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=26, num_attention_heads=16,
                     image_size=384, patch_size=14)
          for name in ("google/siglip2-so400m-patch14-384", "google/siglip-so400m-patch14-384")}


@strict
class LLaDAVConfig(DiffusionConfigMixin, LlamaConfig):
    """The official fields (``LlavaLLaDAConfig``: LLaDA's trunk as a Llama config, plus LLaVA's ``mm_*`` fields)."""

    model_type = "llava_llada"
    mask_token_id: int | None = 126336
    mm_vision_tower: str = "google/siglip2-so400m-patch14-384"
    mm_hidden_size: int = 1152
    mm_projector_type: str = "mlp2x_gelu"
    mm_vision_select_layer: int = -2
    mm_patch_merge_type: str = "spatial_unpad"
    image_aspect_ratio: str = "anyres_max_4"
    vision_config: dict | None = None  # DARE's: the tower's SiglipVisionConfig fields (default: TOWERS)
    image_grid_pinpoints: list | None = None  # anyres crop grids [height, width]; default 1x1 .. 6x6 tower crops

    def __post_init__(self, **kwargs):
        super().__post_init__(**clean_checkpoint_kwargs(kwargs))
        if self.vision_config is None:
            if self.mm_vision_tower not in TOWERS:
                raise ValueError(f"llava_llada: unknown vision tower {self.mm_vision_tower!r} and no vision_config "
                                 f"describing it; known: {sorted(TOWERS)}")
            self.vision_config = dict(TOWERS[self.mm_vision_tower])
        if self.mm_projector_type != "mlp2x_gelu":
            raise ValueError(f"llava_llada: projector {self.mm_projector_type!r} is not LLaDA-V's (mlp2x_gelu)")
        if self.mm_patch_merge_type != "spatial_unpad" or not re.fullmatch(r"anyres(_max_\d+)?",
                                                                             self.image_aspect_ratio):
            raise ValueError(f"llava_llada: pictures are packed as LLaDA-V's (spatial_unpad, anyres or anyres_max_N), "
                             f"got {self.mm_patch_merge_type!r}, {self.image_aspect_ratio!r}")
        if self.image_grid_pinpoints is None:  # its training scripts' "(1x1),...,(6x6)"
            side = self.vision_config["image_size"]
            self.image_grid_pinpoints = [[side * i, side * j] for i in range(1, 7) for j in range(1, 7)]

    def tower_config(self) -> SiglipVisionConfig:
        return SiglipVisionConfig(**{**self.vision_config, "vision_use_head": False})


class VisionTower(nn.Module):
    """``vision_tower.vision_tower.vision_model``: transformers' SigLIP vision model (no pooling head) where the
    official wrapper (``SigLipVisionTower``) holds SigLIP's (``.vision_tower``, whose transformer is ``.vision_model``);
    ``features`` reads its last layer before the post-layernorm."""

    def __init__(self, config: SiglipVisionConfig):
        super().__init__()
        self.vision_tower = nn.ModuleDict({"vision_model": SiglipVisionModel(config)})

    def features(self, pixel_values):
        model = self.vision_tower["vision_model"]
        h = model.embeddings(pixel_values.to(model.embeddings.patch_embedding.weight.dtype))
        return model.encoder(inputs_embeds=h).last_hidden_state


class LLaDAVBackbone(DiffusionBackbone):
    """``model``: embeddings, Llama layers (bidirectional), final norm; and the vision side under LLaVA's names."""

    config_class = LLaDAVConfig
    _no_split_modules = ["LlamaDecoderLayer", "SiglipEncoderLayer"]

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        for layer in self.layers:
            layer.self_attn.is_causal = False  # DARE's masks decide (bidirectional, padding)
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        tower = config.tower_config()
        if tower.hidden_size != config.mm_hidden_size:
            raise ValueError(f"llava_llada: mm_hidden_size {config.mm_hidden_size} != the tower's hidden size "
                             f"{tower.hidden_size}")
        self.vision_tower = VisionTower(tower)
        self.mm_projector = nn.Sequential(nn.Linear(config.mm_hidden_size, config.hidden_size), nn.GELU(),
                                          nn.Linear(config.hidden_size, config.hidden_size))
        if "unpad" in config.mm_patch_merge_type:
            # the row-end embedding of unpadded grids (LLaVA's initialisation: normal, std 1 / sqrt(hidden))
            self.image_newline = nn.Parameter(torch.randn(config.hidden_size) * config.hidden_size ** -0.5)
        self.post_init()

    def crop_features(self, crops):
        """``[M, 3, S, S]`` crops -> ``[M, patches, hidden]``: the tower's patch features through the projector."""
        return self.mm_projector(self.vision_tower.features(crops))

    def image_features(self, pixel_values, image_sizes) -> list:
        """Each picture's features ``[F_i, hidden]``, as LLaVA-OneVision packs them (``llava_arch``'s ``spatial_unpad``
        with ``anyres_max_N``): the whole picture's crop, then the grid of crops laid out as the picture, its padding
        cut, shrunk to at most N crops' worth, each row closed by ``image_newline``; a one-crop picture: its features
        and one ``image_newline``. ``pixel_values`` ``[N, crops, 3, S, S]`` (padded crops ignored) with
        ``image_sizes`` ``[N, 2]`` (height, width), as ``image_processor`` makes them."""
        counts = [crops_of(self.config, size) for size in image_sizes.tolist()]
        crops = torch.cat([p[:n] for p, n in zip(pixel_values, counts, strict=True)])
        features = self.crop_features(crops).split(counts)
        return [pack(self.config, f, size, self.image_newline) for f, size in zip(features, image_sizes.tolist(),
                                                                                   strict=True)]


class LLaDAVModelLM(DiffusionLM):
    """``model -> lm_head``, the official names (``LlavaLLaDAModelLM``; ``model_type`` llava_llada)."""

    config_class = LLaDAVConfig
    _no_split_modules = ["LlamaDecoderLayer", "SiglipEncoderLayer"]

    def __init__(self, config):
        super().__init__(config)
        self.model = LLaDAVBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def embed(self, input_ids, pixel_values=None, image_sizes=None, image_embeds=None, picture_at=None):
        """Token embeddings with the pictures' features in their placeholders: id ``-(j + 1)`` stands for feature j
        of the batch's pictures (``placeholders``), so rows may be repeated, reordered or subset freely. The features
        are ``image_embeds`` ``[F, hidden]`` (computed once, e.g. for every step of a decoding) or those of
        ``pixel_values`` / ``image_sizes`` (``image_processor``'s), the pictures' packed features in order;
        ``picture_at``: the batch's feature numbers of those given (the rest of the batch's pictures left out)."""
        slots = input_ids < 0
        h = self.model.embed_tokens(input_ids.clamp(min=0))
        given = pixel_values is not None or image_embeds is not None
        if not given:
            if bool(slots.any()):
                raise ValueError("llava_llada: input_ids hold picture placeholders but no pictures were given "
                                 "(pixel_values or image_embeds)")
            return h
        if image_embeds is None:
            image_embeds = self.picture_features(pixel_values, image_sizes)
        index = -input_ids[slots] - 1
        if picture_at is not None and index.numel():  # the features given are a larger batch's features picture_at
            lookup = torch.full((max(int(index.max()), int(picture_at.max())) + 1,), len(image_embeds),
                                device=index.device)
            lookup[picture_at.to(index.device)] = torch.arange(len(picture_at), device=index.device)
            index = lookup[index]
        if index.numel() and int(index.max()) >= len(image_embeds):
            raise ValueError(f"llava_llada: a placeholder names picture feature {int(index.max())} of "
                             f"{len(image_embeds)}")
        return h.index_put((slots,), image_embeds[index].to(h.dtype))

    def picture_features(self, pixel_values, image_sizes) -> torch.Tensor:
        """The pictures' packed features ``[F, hidden]`` in order (``embed``'s ``image_embeds``)."""
        return torch.cat(self.model.image_features(pixel_values, image_sizes))

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=False, logits_to_keep=0, pixel_values=None, image_sizes=None, image_embeds=None,
                picture_at=None, **kwargs):
        """``DiffusionLM.forward``; ids holding picture placeholders read ``pixel_values`` or ``image_embeds``."""
        if input_ids is not None and inputs_embeds is None:
            inputs_embeds = self.embed(input_ids, pixel_values, image_sizes, image_embeds, picture_at)
            input_ids = None
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               cache=cache, inputs_embeds=inputs_embeds, use_cache=use_cache,
                               logits_to_keep=logits_to_keep, **kwargs)


class WithPictures(nn.Module):
    """``model`` reading a batch's pictures at every call: what samplers, estimators and losses are handed in place of
    the model (they call it as any model), so no decoding or algorithm knows of pictures. ``fixed``: the features
    are computed once, without gradients (decoding, scoring under no_grad); otherwise at every call, so the tower and
    projector get their gradients. Everything else (config, parameters, modes) is the model's."""

    def __init__(self, model, pixel_values, image_sizes, fixed: bool = True, picture_at=None):
        super().__init__()
        self.model = model
        if fixed:
            with torch.no_grad():  # through DDP, PEFT and torch.compile wrappers alike
                features = getattr(model, "module", model).picture_features(pixel_values, image_sizes)
            self.pictures = {"image_embeds": features}
        else:
            self.pictures = {"pixel_values": pixel_values, "image_sizes": image_sizes}
        if picture_at is not None:
            self.pictures["picture_at"] = picture_at

    def forward(self, input_ids=None, **kwargs):
        return self.model(input_ids=input_ids, **self.pictures, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("model"), name)


def placeholders(first: int, count: int) -> torch.Tensor:
    """The ids standing for picture features ``first .. first + count - 1`` of a batch (``LLaDAVModelLM.embed``)."""
    return -1 - torch.arange(first, first + count)


def crops_of(config, size) -> int:
    """How many crops ``image_processor`` cuts a picture of ``size`` (height, width) into (the whole one included)."""
    return image_size_to_num_patches(tuple(size), config.image_grid_pinpoints, config.vision_config["image_size"])


def pack(config, features, size, newline):
    """One picture's crop features ``[crops, side * side, hidden]`` -> its packed features (``image_features``)."""
    if features.shape[0] == 1:
        return torch.cat([features[0], newline[None].to(features)])
    crop = config.vision_config["image_size"]
    side = crop // config.vision_config["patch_size"]
    rows, cols = get_anyres_image_grid_shape(tuple(size), config.image_grid_pinpoints, crop)
    grid = features[1:].view(rows, cols, side, side, -1).permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)
    grid = unpad_image(grid, tuple(size))
    _, height, width = grid.shape
    most = re.fullmatch(r"anyres_max_(\d+)", config.image_aspect_ratio)
    ratio = math.sqrt(height * width / (int(most.group(1)) * side ** 2)) if most else 0.0
    if ratio > 1.1:
        grid = nn.functional.interpolate(grid[None], [int(height // ratio), int(width // ratio)], mode="bilinear")[0]
    grid = torch.cat([grid, newline[:, None, None].to(grid).expand(*grid.shape[:-1], 1)], dim=-1)
    return torch.cat([features[0], grid.flatten(1, 2).transpose(0, 1)])


def feature_count(config, size) -> int:
    """How many placeholders a picture of ``size`` (height, width) takes: its packed features, counted on the meta
    device (no compute)."""
    side = config.vision_config["image_size"] // config.vision_config["patch_size"]
    crops = torch.empty(crops_of(config, size), side * side, 1, device="meta")
    return pack(config, crops, size, torch.empty(1, device="meta")).shape[0]


def image_processor(config):
    """transformers' LLaVA-OneVision image processor set as LLaDA-V's (SigLIP's 0.5 mean and std, the tower's crop
    size, the config's grids): PIL pictures -> ``pixel_values`` ``[N, crops, 3, S, S]`` and ``image_sizes``."""
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    side = config.vision_config["image_size"]
    return LlavaOnevisionImageProcessorPil(size={"height": side, "width": side}, do_pad=True,
                                           image_grid_pinpoints=config.image_grid_pinpoints, image_mean=[0.5] * 3,
                                           image_std=[0.5] * 3)


def tiny_config(vocab_size: int, **overrides) -> LLaDAVConfig:
    tower = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=28,
                 patch_size=7)
    kw = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=4, max_position_embeddings=1024, rope_theta=500000.0, mm_hidden_size=32,
              vision_config=tower, tie_word_embeddings=False)
    return LLaDAVConfig(**{**kw, **overrides})
