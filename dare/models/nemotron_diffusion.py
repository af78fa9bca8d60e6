"""Nemotron-Labs-Diffusion (NVIDIA, 2026; 3B / 8B / 14B): a Ministral-3 decoder converted from an autoregressive
model and trained as a masked diffusion LM. One checkpoint reads bidirectionally (denoising a block of masks) or
left to right (autoregressive decoding, and the committed context its blocks are denoised against): the attention is
chosen per call (``causal``), the weights are the same.

Read, not copied: the checkpoint's remote code (``configuration_nemotron_labs_diffusion.py``,
``modeling_nemotron_labs_diffusion.py``: the backbone is ``encoder`` (a Ministral-3 model), the output layer an untied
``diffusion_head``; a ``diffusion_lm`` switch turns the layers' attention bidirectional, unmasked, or causal) and
vLLM's ``nemotron_dllm.py`` (checkpoint prefix ``encoder.``, YaRN RoPE with transformers' attention factor, llama-4
query scaling after RoPE). The layers are transformers' own ``Ministral3DecoderLayer`` (YaRN rotary, the llama-4
scale from each token's position), so the causal path equals ``Ministral3ForCausalLM`` on the same weights (tested).
Released configs: 3B (hidden 3072, 26 layers) and 8B (4096, 34), 32 heads, 8 KV heads, head 128, vocabulary 131,072,
block 32, mask token 100, ``dlm_paradigm`` "bidirectional".
"""

from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import Ministral3Config
from transformers.models.ministral3.modeling_ministral3 import (
    Ministral3DecoderLayer,
    Ministral3RMSNorm,
    Ministral3RotaryEmbedding,
)

from .common import DiffusionBackbone, DiffusionConfigMixin, DiffusionLM, clean_checkpoint_kwargs


@strict
class NemotronDiffusionConfig(DiffusionConfigMixin, Ministral3Config):
    """The official config's fields (``NemotronLabsDiffusionConfig``) on transformers' Ministral-3 config."""

    model_type = "nemotron_labs_diffusion"
    pad_token_id: int | None = None
    mask_token_id: int | None = 100
    block_size: int = 32
    dlm_paradigm: str = "bidirectional"  # training layout: bidirectional | autoregressive | block_diff
    dlm_loss_weight: float | None = None  # weight of the diffusion loss (None: 1)
    ar_loss_weight: float = 1.0  # block_diff: weight of the autoregressive loss on the clean copy
    dp_varying_mask_ratio: bool = False

    def __post_init__(self, **kwargs):
        super().__post_init__(**clean_checkpoint_kwargs(kwargs))


class NemotronDiffusionBackbone(DiffusionBackbone):
    """``encoder``: embeddings, Ministral-3 layers, final norm; bidirectional unless a call is ``causal``."""

    config_class = NemotronDiffusionConfig
    _no_split_modules = ["Ministral3DecoderLayer"]

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Ministral3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        for layer in self.layers:
            layer.self_attn.is_causal = False  # DARE's masks decide (bidirectional or causal, padding)
        self.norm = Ministral3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Ministral3RotaryEmbedding(config)
        self.post_init()


class NemotronLabsDiffusionModel(DiffusionLM):
    """``encoder -> diffusion_head``, the official names (``model_type`` nemotron_labs_diffusion)."""

    config_class = NemotronDiffusionConfig
    base_model_prefix = "encoder"
    _no_split_modules = ["Ministral3DecoderLayer"]

    def __init__(self, config):
        super().__init__(config)
        self.encoder = NemotronDiffusionBackbone(config)
        self.diffusion_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @property
    def model(self):  # what DiffusionLM's forward and input-embedding accessors read
        return self.encoder

    def get_output_embeddings(self):
        return self.diffusion_head

    def set_output_embeddings(self, new):
        self.diffusion_head = new


def tiny_config(vocab_size: int, **overrides) -> NemotronDiffusionConfig:
    rope = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 128.0, "original_max_position_embeddings": 16,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
    kw = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, rope_parameters=rope, block_size=4)
    return NemotronDiffusionConfig(**{**kw, **overrides})
