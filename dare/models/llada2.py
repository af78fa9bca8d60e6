"""LLaDA2.x-mini (Ling-2.0 / "BailingMoE" backbone): block diffusion with block size 32. Fused QKV laid out
head-major as [Q heads ; K heads ; V heads], per-head q/k RMSNorm before RoPE, partial RoPE (only the first
``head_dim * partial_rotary_factor`` dims rotate), first ``first_k_dense_replace`` layers dense, then MoE layers
with a sigmoid group-limited router (selection biased by ``expert_bias``, mixing weights unbiased, renormalised,
times ``routed_scaling_factor``) plus always-on shared experts. Mask token ``<|mask|>`` = 156895.
"""

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import PreTrainedConfig
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from .common import (
    DiffusionBackbone,
    DiffusionConfigMixin,
    DiffusionLM,
    GatedMLP,
    RotaryEmbedding,
    SparseMoE,
    apply_rotary,
    attend,
    clean_checkpoint_kwargs,
)


@strict
class LLaDA2MoeConfig(DiffusionConfigMixin, PreTrainedConfig):
    model_type = "llada2_moe"
    vocab_size: int = 157184
    hidden_size: int = 2048
    intermediate_size: int = 5120
    moe_intermediate_size: int = 512
    num_hidden_layers: int = 20
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int | None = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float | int = 600000.0
    partial_rotary_factor: float = 0.5
    rotary_dim: int | None = None  # head_dim * partial_rotary_factor
    num_experts: int = 256
    num_experts_per_tok: int = 8
    num_shared_experts: int = 1
    n_group: int = 8
    topk_group: int = 4
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True
    score_function: str = "sigmoid"
    moe_router_enable_expert_bias: bool = True
    first_k_dense_replace: int = 1
    use_qk_norm: bool = True
    use_qkv_bias: bool = False
    use_bias: bool = False
    initializer_range: float = 0.02
    embedding_dropout: float = 0.0  # official keys (all 0.0), kept in saved configs: SGLang reads embedding_dropout
    attention_dropout: float = 0.0
    output_dropout: float = 0.0
    tie_word_embeddings: bool = False
    block_size: int = 32
    mask_token_id: int | None = 156895
    pad_token_id: int | None = 156892
    eos_token_id: int | None = 156892

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.rotary_dim is None:
            self.rotary_dim = int(self.head_dim * self.partial_rotary_factor)
        if self.rotary_dim != int(self.head_dim * self.partial_rotary_factor) or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim={self.rotary_dim} disagrees with head_dim={self.head_dim} x "
                             f"partial_rotary_factor={self.partial_rotary_factor} (or is odd)")
        unsupported = {"score_function": self.score_function != "sigmoid", "use_qk_norm": not self.use_qk_norm,
                       "use_qkv_bias": self.use_qkv_bias, "use_bias": self.use_bias}
        if any(unsupported.values()):
            raise ValueError(f"LLaDA2 settings not used by any official checkpoint: "
                             f"{[k for k, bad in unsupported.items() if bad]}")
        if self.num_experts % self.n_group:
            raise ValueError(f"num_experts={self.num_experts} is not divisible by n_group={self.n_group}")
        super().__post_init__(**clean_checkpoint_kwargs(kwargs))


class LLaDA2Attention(nn.Module):
    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        self.head_dim, self.scaling, self.is_causal = config.head_dim, config.head_dim**-0.5, False
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        qkv = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, qkv, bias=False)
        self.query_layernorm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.key_layernorm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.dense = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x, attention_mask, position_embeddings, cache):
        heads = self.query_key_value(x).view(*x.shape[:-1], -1, self.head_dim)
        q, k, v = heads.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=-2)
        q, k, v = self.query_layernorm(q).transpose(1, 2), self.key_layernorm(k).transpose(1, 2), v.transpose(1, 2)
        q, k = apply_rotary(q, k, *position_embeddings)
        return self.dense(attend(self, q, k, v, attention_mask, cache))


class LLaDA2MoE(SparseMoE):
    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__(config.hidden_size, config.moe_intermediate_size, config.num_experts, config.hidden_act,
                         expert_bias=config.moe_router_enable_expert_bias)
        self.shared_experts = GatedMLP(config.hidden_size, config.moe_intermediate_size * config.num_shared_experts,
                                       config.hidden_act)
        self.cfg = config

    def route(self, h):
        c = self.cfg
        scores = torch.sigmoid(self.gate(h))
        select = scores + self.gate.expert_bias.float() if hasattr(self.gate, "expert_bias") else scores
        grouped = select.view(h.shape[0], c.n_group, -1)
        group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)
        keep_groups = group_score.topk(c.topk_group, dim=-1).indices
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep_groups, True)
        select = grouped.masked_fill(~keep[..., None], float("-inf")).view_as(select)
        indices = select.topk(c.num_experts_per_tok, dim=-1).indices
        weights = scores.gather(1, indices)
        if c.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return weights * c.routed_scaling_factor, indices

    def forward(self, x):
        return super().forward(x) + self.shared_experts(x)


class LLaDA2DecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config: LLaDA2MoeConfig, layer_idx: int):
        super().__init__()
        self.attention = LLaDA2Attention(config, layer_idx)
        dense = layer_idx < config.first_k_dense_replace
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size) if dense else LLaDA2MoE(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, h, attention_mask=None, position_embeddings=None, cache=None, **kwargs):
        h = h + self.attention(self.input_layernorm(h), attention_mask, position_embeddings, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LLaDA2MoeModel(DiffusionBackbone):
    config_class = LLaDA2MoeConfig
    _no_split_modules = ["LLaDA2DecoderLayer"]

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__(config)
        self.block_size = config.block_size
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LLaDA2DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rotary_dim, config.rope_theta)
        self.post_init()

    embed_tokens = property(lambda self: self.word_embeddings)


class LLaDA2MoeModelLM(DiffusionLM):
    config_class = LLaDA2MoeConfig
    _no_split_modules = ["LLaDA2DecoderLayer"]

    def __init__(self, config: LLaDA2MoeConfig):
        super().__init__(config)
        self.model = LLaDA2MoeModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.word_embeddings

    def set_input_embeddings(self, new):
        self.model.word_embeddings = new


def tiny_config(vocab_size: int, **overrides) -> LLaDA2MoeConfig:
    kw = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
              num_experts_per_tok=2, n_group=4, topk_group=2, max_position_embeddings=1024, block_size=32)
    return LLaDA2MoeConfig(**{**kw, **overrides})
