"""SDAR: block diffusion on Qwen3 (dense 1.7B/4B/8B) and Qwen3-MoE (30B-A3B), block-causal with block size 4
(blocks counted from position 0 of the unpadded sequence). Mask token ``<|MASK|>`` = 151669.

The dense family reuses transformers' Qwen3 decoder layers. The MoE family keeps one module per expert
(``mlp.experts.E.{gate,up,down}_proj``) because that is the checkpoint's layout (transformers 5 fuses them).
"""

from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import Qwen3Config, Qwen3MoeConfig
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3DecoderLayer, Qwen3RMSNorm

from .common import (
    DiffusionBackbone,
    DiffusionConfigMixin,
    DiffusionLM,
    GatedMLP,
    RotaryEmbedding,
    SparseMoE,
    cache_kwarg,
    clean_checkpoint_kwargs,
)


@strict
class SDARConfig(DiffusionConfigMixin, Qwen3Config):
    model_type = "sdar"
    block_size: int = 4
    mask_token_id: int | None = 151669

    def __post_init__(self, **kwargs):
        super().__post_init__(**clean_checkpoint_kwargs(kwargs))


@strict
class SDARMoeConfig(DiffusionConfigMixin, Qwen3MoeConfig):
    model_type = "sdar_moe"
    head_dim: int | None = None  # 128 in SDAR-30B-A3B although hidden / heads = 64
    block_size: int = 4
    mask_token_id: int | None = 151669  # absent from the official config.json; the tokenizer declares it

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        super().__post_init__(**clean_checkpoint_kwargs(kwargs))


class SoftmaxTopKMoE(SparseMoE):
    """Qwen3-MoE routing: softmax over all experts in fp32, top-k, optional renormalisation."""

    def __init__(self, config: SDARMoeConfig):
        super().__init__(config.hidden_size, config.moe_intermediate_size, config.num_experts, config.hidden_act)
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob

    def route(self, h):
        probs = self.gate(h).softmax(dim=-1)
        weights, indices = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, indices


class SDARMoeDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: SDARMoeConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Qwen3Attention(config, layer_idx)
        sparse = layer_idx not in config.mlp_only_layers and (layer_idx + 1) % config.decoder_sparse_step == 0
        self.mlp = SoftmaxTopKMoE(config) if sparse else GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, h, attention_mask=None, position_embeddings=None, cache=None, **kwargs):
        a, _ = self.self_attn(self.input_layernorm(h), position_embeddings=position_embeddings,
                              attention_mask=attention_mask, **{cache_kwarg(type(self.self_attn)): cache})
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h))


class _SDARBackbone(DiffusionBackbone):
    layer_class: type

    def __init__(self, config):
        super().__init__(config)
        self.block_size = config.block_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(self.layer_class(config, i) for i in range(config.num_hidden_layers))
        for layer in self.layers:
            layer.self_attn.is_causal = False
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_parameters["rope_theta"])
        self.post_init()


class SDARModel(_SDARBackbone):
    config_class = SDARConfig
    layer_class = Qwen3DecoderLayer
    _no_split_modules = ["Qwen3DecoderLayer"]


class SDARMoeModel(_SDARBackbone):
    config_class = SDARMoeConfig
    layer_class = SDARMoeDecoderLayer
    _no_split_modules = ["SDARMoeDecoderLayer"]


class SDARForCausalLM(DiffusionLM):
    config_class = SDARConfig
    _no_split_modules = ["Qwen3DecoderLayer"]
    # tied where the config says so (SDAR's are not; small Qwen3 models converted by dare.convert are)
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    backbone_class = SDARModel

    def __init__(self, config):
        super().__init__(config)
        self.model = self.backbone_class(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


class SDARMoeForCausalLM(SDARForCausalLM):
    config_class = SDARMoeConfig
    _no_split_modules = ["SDARMoeDecoderLayer"]
    backbone_class = SDARMoeModel


def tiny_config(vocab_size: int, **overrides) -> SDARConfig:
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=vocab_size, max_position_embeddings=1024,
              rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False, block_size=4)
    return SDARConfig(**{**kw, **overrides})


def tiny_moe_config(vocab_size: int, **overrides) -> SDARMoeConfig:
    kw = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
              num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=vocab_size, max_position_embeddings=1024,
              rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=False, block_size=4)
    return SDARMoeConfig(**{**kw, **overrides})

