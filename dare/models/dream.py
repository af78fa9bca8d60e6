"""Dream (v0 7B): Qwen2.5 (GQA, q/k/v with bias) with bidirectional attention. Initialised from an AR model, it
keeps the AR alignment: the prediction for token i is read at position i-1 (``Family.logits`` applies the shift).
Standard HF Qwen2 key names; transformers' Qwen2 decoder layers are reused as they are.
"""

from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import Qwen2Config
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RMSNorm

from .common import DiffusionBackbone, DiffusionConfigMixin, DiffusionLM, RotaryEmbedding, clean_checkpoint_kwargs


@strict
class DreamConfig(DiffusionConfigMixin, Qwen2Config):
    model_type = "Dream"
    mask_token_id: int | None = 151666

    def __post_init__(self, **kwargs):
        super().__post_init__(**clean_checkpoint_kwargs(kwargs))


class DreamBaseModel(DiffusionBackbone):
    config_class = DreamConfig
    _no_split_modules = ["Qwen2DecoderLayer"]

    def __init__(self, config: DreamConfig):
        super().__init__(config)
        self.block_size = None
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        for layer in self.layers:
            layer.self_attn.is_causal = False
        self.norm = Qwen2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.rotary_emb = RotaryEmbedding(head_dim, config.rope_parameters["rope_theta"])
        self.post_init()


class DreamModel(DiffusionLM):
    """Named like the official class (``architectures: [DreamModel]``): the full model with its LM head."""

    config_class = DreamConfig
    _no_split_modules = ["Qwen2DecoderLayer"]
    # tied where the config says so (Dream's own is not; small Qwen2.5 models converted by dare.convert are)
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: DreamConfig):
        super().__init__(config)
        self.model = DreamBaseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


def tiny_config(vocab_size: int, **overrides) -> DreamConfig:
    kw = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=1024, rope_theta=1e6,
              rms_norm_eps=1e-6, tie_word_embeddings=False)
    return DreamConfig(**{**kw, **overrides})
