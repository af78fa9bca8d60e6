"""LLaDA (8B Base / Instruct / 1.5): a Llama-style Transformer with the causal mask removed, under the OLMo key
names of the official checkpoint (``model.transformer.blocks.N.{q,k,v}_proj`` ...). Mask token 126336.

Note the name collision kept from the checkpoint: ``blocks.N.ff_out`` is the MLP down projection while
``transformer.ff_out`` is the LM head.
"""

from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import PreTrainedConfig
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from .common import (
    DiffusionBackbone,
    DiffusionConfigMixin,
    DiffusionLM,
    RotaryEmbedding,
    apply_rotary,
    attend,
    clean_checkpoint_kwargs,
)


@strict
class LLaDAConfig(DiffusionConfigMixin, PreTrainedConfig):
    """The official ``config.json`` fields (OLMo names) that the architecture uses; the rest is kept as given."""

    model_type = "llada"
    attribute_map = {
        "hidden_size": "d_model", "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads",
        "num_hidden_layers": "n_layers", "intermediate_size": "mlp_hidden_size",
        "max_position_embeddings": "max_sequence_length", "initializer_range": "init_std",
    }
    d_model: int = 4096
    n_heads: int = 32
    n_kv_heads: int | None = None
    n_layers: int = 32
    mlp_hidden_size: int = 12288
    vocab_size: int = 126464
    embedding_size: int | None = 126464
    max_sequence_length: int = 4096
    rope_theta: float | int = 500000.0
    rms_norm_eps: float = 1e-5
    activation_type: str = "silu"
    include_bias: bool = False
    init_std: float = 0.02
    weight_tying: bool = False
    mask_token_id: int | None = 126336
    eos_token_id: int | None = 126081
    pad_token_id: int | None = 126081
    bos_token_id: int | None = 126080
    tie_word_embeddings: bool = False

    def __post_init__(self, **kwargs):
        if "num_experts" in kwargs or "expert_intermediate_size" in kwargs:  # its config.json says "llada" too
            raise ValueError("a LLaDA-MoE checkpoint (model_type 'llada' with experts, inclusionAI/LLaDA-MoE-*): DARE "
                             "has no LLaDA-MoE family yet; the dense LLaDA classes cannot load its experts")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.weight_tying:
            raise ValueError("LLaDA checkpoints have an untied LM head; weight_tying=True is not supported.")
        if self.include_bias:
            raise ValueError("LLaDA checkpoints have no linear biases; include_bias=True is not supported.")
        super().__post_init__(**clean_checkpoint_kwargs(kwargs))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def rows(self) -> int:
        return self.embedding_size or self.vocab_size


class LLaDABlock(GradientCheckpointingLayer):
    """Pre-norm attention + SwiGLU block with its projections directly on the block, as in the checkpoint."""

    def __init__(self, config: LLaDAConfig, layer_idx: int):
        super().__init__()
        self.config, self.layer_idx = config, layer_idx
        d, hd = config.d_model, config.head_dim
        self.head_dim, self.scaling, self.is_causal = hd, hd**-0.5, False
        self.num_key_value_groups = config.n_heads // config.n_kv_heads
        self.attn_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.q_proj = nn.Linear(d, config.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.n_kv_heads * hd, bias=False)
        self.attn_out = nn.Linear(config.n_heads * hd, d, bias=False)
        self.ff_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.ff_proj = nn.Linear(d, config.mlp_hidden_size, bias=False)  # gate branch (goes through SiLU)
        self.up_proj = nn.Linear(d, config.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(config.mlp_hidden_size, d, bias=False)
        self.act = nn.SiLU()

    def forward(self, h, attention_mask=None, position_embeddings=None, cache=None, **kwargs):
        x = self.attn_norm(h)
        shape = (*x.shape[:-1], -1, self.head_dim)
        q, k, v = (proj(x).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        q, k = apply_rotary(q, k, *position_embeddings)
        h = h + self.attn_out(attend(self, q, k, v, attention_mask, cache))
        x = self.ff_norm(h)
        return h + self.ff_out(self.act(self.ff_proj(x)) * self.up_proj(x))


class LLaDAModel(DiffusionBackbone):
    config_class = LLaDAConfig
    _no_split_modules = ["LLaDABlock"]

    def __init__(self, config: LLaDAConfig):
        super().__init__(config)
        self.block_size = None
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.rows, config.d_model),
            blocks=nn.ModuleList(LLaDABlock(config, i) for i in range(config.n_layers)),
            ln_f=LlamaRMSNorm(config.d_model, eps=config.rms_norm_eps),
            ff_out=nn.Linear(config.d_model, config.rows, bias=False),
        ))
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta)
        self.post_init()

    embed_tokens = property(lambda self: self.transformer.wte)
    layers = property(lambda self: self.transformer.blocks)
    norm = property(lambda self: self.transformer.ln_f)


class LLaDAModelLM(DiffusionLM):
    config_class = LLaDAConfig
    _no_split_modules = ["LLaDABlock"]

    def __init__(self, config: LLaDAConfig):
        super().__init__(config)
        self.model = LLaDAModel(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.model.transformer.ff_out

    def set_output_embeddings(self, new):
        self.model.transformer.ff_out = new

    def get_input_embeddings(self):
        return self.model.transformer.wte

    def set_input_embeddings(self, new):
        self.model.transformer.wte = new


def tiny_config(vocab_size: int, **overrides) -> LLaDAConfig:
    kw = dict(d_model=64, n_heads=4, n_kv_heads=4, n_layers=2, mlp_hidden_size=128, vocab_size=vocab_size,
              embedding_size=vocab_size, max_sequence_length=1024)
    return LLaDAConfig(**{**kw, **overrides})

