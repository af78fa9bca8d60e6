"""What every family shares: the config clean-up, rotary embedding, gated MLP, sparse MoE, the backbone forward
(positions -> family attention mask -> layers -> final norm), the LM wrapper, and the code a saved folder ships.

A family file only declares its modules under the official names and, where needed, its own attention or router.

A saved folder carries its own code, as custom architectures on the Hub do: ``config.json`` gets an ``auto_map`` naming
``modeling_<family>.py`` (a copy of the family file) plus the sibling files it imports (this file, ``masks.py``), so it
loads with ``trust_remote_code=True`` where DARE is not installed. The shipped files must stay self-contained: only
``from .module import name`` relative imports (the form transformers follows) and no absolute ``dare`` imports.
"""

import functools
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama.modeling_llama import eager_attention_forward

from .masks import BlockMask, fixed_width, for_attention, positions_from_padding, visible

# transformers 5.24 renamed the output field past_key_values -> cache (older versions, e.g. 5.19 pinned by SGLang
# 0.5.23, only know past_key_values)
_CACHE_FIELD = "cache" if "cache" in BaseModelOutputWithPast.__dataclass_fields__ else "past_key_values"


@functools.cache
def cache_kwarg(module_cls: type) -> str:
    """The name ``module_cls.forward`` takes the KV cache under: ``cache`` for our own layers and transformers >= 5.24,
    ``past_key_values`` for transformers' layers before 5.24."""
    params = inspect.signature(module_cls.forward).parameters
    return "cache" if "cache" in params or "past_key_values" not in params else "past_key_values"

# True in DARE itself, False in the copy shipped with a saved folder (imported by transformers as remote code)
IN_DARE = __name__.startswith("dare.")


def clean_checkpoint_kwargs(kwargs: dict) -> dict:
    """Drop config.json keys that only make sense for remote code: its ``auto_map`` (DARE loads without
    ``trust_remote_code``; the shipped copy keeps it, transformers finds this very code through it) and a hard-coded
    ``attn_implementation`` (flash/flex there; the caller chooses here)."""
    for key in ("auto_map", "attn_implementation") if IN_DARE else ("attn_implementation",):
        kwargs.pop(key, None)
    if "rope_scaling" in kwargs and kwargs["rope_scaling"] is None:
        del kwargs["rope_scaling"]
    return kwargs


# relative imports transformers follows when it copies remote code, and the forms it would miss
_SIBLING_IMPORT = re.compile(r"^\s*from\s+\.(\w+)\s+import\b", re.MULTILINE)
_UNSHIPPABLE = re.compile(r"^\s*(from\s+\.(?!\w)|from\s+dare\b|import\s+dare\b)", re.MULTILINE)


def ship_code(config, folder) -> dict[str, str]:
    """Write the family file of ``config`` into ``folder`` as ``modeling_<family>.py``, with the sibling files it
    imports (recursively, under their own names); return the ``auto_map`` naming its config and LM classes (the LM
    class for both AutoModel and AutoModelForCausalLM, as ``dare.models`` registers them)."""
    module = sys.modules[type(config).__module__]
    shipped = f"modeling_{module.__name__.rpartition('.')[2]}"
    files, todo = {}, [(Path(module.__file__), shipped)]
    while todo:
        path, name = todo.pop()
        if path in files:
            continue
        text = path.read_text()
        if bad := _UNSHIPPABLE.search(text):
            raise ValueError(f"dare/models/{path.name} cannot be shipped with a checkpoint: {bad[0].strip()!r} "
                             "(shipped files import their siblings as `from .module import name`, never dare)")
        files[path] = name
        todo += [(path.with_name(f"{dep}.py"), dep) for dep in _SIBLING_IMPORT.findall(text)]
    for path, name in files.items():
        header = (f"# Copied by DARE from dare/models/{path.name}, so that this folder loads with "
                  "trust_remote_code=True where DARE is not installed.\n")
        (Path(folder) / f"{name}.py").write_text(header + path.read_text())
    lm = next(c for c in vars(module).values()
              if isinstance(c, type) and issubclass(c, DiffusionLM) and c.config_class is type(config))
    return {"AutoConfig": f"{shipped}.{type(config).__name__}", "AutoModel": f"{shipped}.{lm.__name__}",
            "AutoModelForCausalLM": f"{shipped}.{lm.__name__}"}


class DiffusionConfigMixin:
    """First base of every family config: ``save_pretrained`` (which every model save, Trainer checkpoint and merged
    export goes through) also ships the family's code and names it in ``config.json``'s ``auto_map``. The in-memory
    config is left as it was. The shipped copy does nothing extra (transformers re-ships remote code itself), nor
    does a subclass defined outside dare.models (its code is not ours to ship)."""

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs):
        if not IN_DARE or not type(self).__module__.startswith("dare.models."):
            return super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        Path(save_directory).mkdir(parents=True, exist_ok=True)
        missing = object()
        previous = self.__dict__.get("auto_map", missing)
        self.auto_map = ship_code(self, save_directory)
        try:
            return super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)
        finally:
            if previous is missing:
                del self.auto_map
            else:
                self.auto_map = previous


class RotaryEmbedding(nn.Module):
    """Rotate-half RoPE over the first ``dim`` dims of each head (``dim < head_dim`` = partial RoPE).
    Frequencies are computed on the fly in fp32 (no buffers: nothing to re-initialise after meta loading)."""

    def __init__(self, dim: int, theta: float):
        super().__init__()
        self.dim, self.theta = dim, float(theta)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        exponent = torch.arange(0, self.dim, 2, device=x.device, dtype=torch.float32) / self.dim
        inv_freq = 1.0 / (self.theta**exponent)
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """RoPE on ``[B, H, L, D]`` tensors; with ``cos.shape[-1] < D`` only the leading dims rotate."""
    cos, sin = cos[:, None], sin[:, None]
    d = cos.shape[-1]

    def rotate(x):
        x_rot, x_pass = x[..., :d], x[..., d:]
        return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)

    return rotate(q), rotate(k)


def attend(module: nn.Module, q, k, v, attention_mask, cache: Cache | None, **kwargs) -> torch.Tensor:
    """Shared tail of our own attention modules: cache update, the configured attention function, ``[B, L, H*D]``."""
    if cache is not None:
        k, v = cache.update(k, v, module.layer_idx)
    fn: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(module.config._attn_implementation, eager_attention_forward)
    out, _ = fn(module, q, k, v, attention_mask, dropout=0.0, scaling=module.scaling, is_causal=False, **kwargs)
    return out.reshape(*out.shape[:2], -1).contiguous()


class GatedMLP(nn.Module):
    """SwiGLU feed-forward ``down(act(gate(x)) * up(x))`` under the Llama/Qwen names."""

    def __init__(self, hidden: int, inner: int, act: str = "silu"):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act_fn = ACT2FN[act]

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Router weight ``[E, H]`` (+ the selection-only, frozen ``expert_bias`` of LLaDA2). Deliberately not an
    ``nn.Linear``: PEFT's "all-linear" must not put adapters on routers."""

    def __init__(self, hidden: int, num_experts: int, expert_bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))
        if expert_bias:  # frozen (updated by the load balancer, not by gradients); a parameter, not a buffer, so
            # that FSDP2 shards it like every other state-dict entry (accelerate's sharded loading expects that)
            self.expert_bias = nn.Parameter(torch.zeros(num_experts), requires_grad=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Router logits in fp32."""
        return nn.functional.linear(h.float(), self.weight.float())


class SparseMoE(nn.Module):
    """Token-choice mixture of experts stored as one ``GatedMLP`` per expert (``experts.E.*`` as in the official
    checkpoints, so LoRA can target expert projections). ``route(h)`` returns ``(weights, indices)`` ``[T, k]``."""

    def __init__(self, hidden: int, inner: int, num_experts: int, act: str = "silu", expert_bias: bool = False):
        super().__init__()
        self.gate = Router(hidden, num_experts, expert_bias)
        self.experts = nn.ModuleList(GatedMLP(hidden, inner, act) for _ in range(num_experts))

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.reshape(-1, x.shape[-1])
        weights, indices = self.route(h)
        if torch.compiler.is_compiling():
            return self.every_expert(h, weights, indices).view_as(x)
        out = torch.zeros_like(h)
        # with several processes every expert runs, on no token where none chose it: the processes must use the
        # same parameters in the same order (ZeRO-3 gathers each expert as it runs; DDP / ZeRO-2 reduce every grad)
        every = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
        for e in range(len(self.experts)) if every else indices.unique().tolist():
            token, slot = torch.where(indices == e)
            out.index_add_(0, token, (self.experts[e](h[token]) * weights[token, slot, None]).to(h.dtype))
        return out.view_as(x)

    def every_expert(self, h: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The same sum with no shape that depends on the routing, for a compiled forward (one graph, which a GPU can
        capture; the loop above breaks the graph at ``unique`` and ``where``): every expert on every token, weighted
        by its routing weight, 0 where the token did not choose it. Experts add in the same order, and an unchosen
        one adds exactly 0, so the values equal the loop's; it costs E/k times the experts' arithmetic, while a small
        decoding batch on a GPU is bound by reading the experts' weights, which both read once."""
        chosen = torch.zeros(h.shape[0], len(self.experts), dtype=weights.dtype, device=h.device)
        chosen = chosen.scatter_add(1, indices, weights)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            out = out + (expert(h) * chosen[:, e, None]).to(h.dtype)
        return out


class DiffusionPreTrainedModel(PreTrainedModel):
    """Base of every family's model classes."""

    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True  # masks.for_attention builds BlockMasks of every layout
    _supports_attention_backend = True

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        """Every family dispatches through ``ALL_ATTENTION_FUNCTIONS`` (``attend`` or transformers' own layers), so
        ``set_attn_implementation`` may switch it; transformers' source heuristic misses ``attend`` and would refuse
        (LLaDA2 declares an ``*Attention(nn.Module)`` without the lookup in its own file)."""
        return True

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, Router):
            nn.init.normal_(module.weight, std=getattr(self.config, "initializer_range", 0.02))
            if hasattr(module, "expert_bias"):
                nn.init.zeros_(module.expert_bias)


class DiffusionBackbone(DiffusionPreTrainedModel):
    """The decoder stack. Subclasses create ``embed_tokens``, ``layers``, ``norm`` and ``rotary_emb`` (properties
    are fine where the official names differ) and set ``self.block_size`` (None = bidirectional).

    ``attention_mask`` may be a 2-D padding mask over ``past + current`` tokens (HF convention; positions and block
    ids then count real tokens only) or a ready 4-D additive mask (or FlexAttention ``BlockMask``), used as given
    (with explicit ``position_ids``).
    ``key_position_ids`` ``[B, past + current]`` overrides the key positions derived from a 2-D mask, for callers
    that hide real cached tokens (the dual cache hides a block's stale rows without moving the keys after it).
    ``causal=True`` reads left to right (each query sees the keys at its position and before): a family that decodes
    both ways (Nemotron-Labs-Diffusion) chooses per call.
    """

    block_size: int | None = None

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool = False,
        key_position_ids: torch.LongTensor | None = None,
        causal: bool = False,
        **kwargs,
    ) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        h = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if use_cache and cache is None:
            cache = DynamicCache()
        width = fixed_width(cache)
        if width is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids, mask = self._positions_and_mask(attention_mask, position_ids, h, past, key_position_ids,
                                                          causal)
        else:
            position_ids, mask = self._fixed_cache_mask(attention_mask, position_ids, key_position_ids, h, width,
                                                        causal)
        position_embeddings = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_ids=position_ids, **{cache_kwarg(type(layer)): cache},
                      position_embeddings=position_embeddings, **kwargs)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(h), **{_CACHE_FIELD: cache})

    def _positions_and_mask(self, attention_mask, position_ids, h, past, key_position_ids=None, causal=False):
        batch, length = h.shape[:2]
        if isinstance(attention_mask, BlockMask) or (attention_mask is not None and attention_mask.dim() == 4):
            if position_ids is None:
                raise ValueError("A 4-D attention mask needs explicit position_ids.")
            return position_ids, attention_mask if isinstance(attention_mask, BlockMask) else attention_mask.to(h.dtype)
        if attention_mask is not None:
            if attention_mask.shape != (batch, past + length):
                raise ValueError(
                    f"attention_mask must cover cached + current tokens: expected {(batch, past + length)}, "
                    f"got {tuple(attention_mask.shape)}")
            all_pos = positions_from_padding(attention_mask)
            # no padding: no key mask (reading that is a graph break for torch.compile, which takes the mask as is)
            padded = torch.compiler.is_compiling() or not bool(attention_mask.all())
            k_valid = attention_mask.bool() if padded else None
        else:
            all_pos = torch.arange(past + length, device=h.device).expand(batch, -1)
            k_valid = None
        if position_ids is None:
            position_ids = all_pos[:, past:]
        k_pos = torch.cat([all_pos[:, :past], position_ids.expand(batch, -1)], dim=1)
        if key_position_ids is not None:
            if key_position_ids.shape[-1] != past + length:
                raise ValueError(f"key_position_ids must cover cached + current tokens ({past + length}), "
                                 f"got {key_position_ids.shape[-1]}")
            k_pos = key_position_ids.expand(batch, -1)
        ok = visible(position_ids.expand(batch, -1), k_pos, self.block_size, k_valid=k_valid, causal=causal)
        if self.config._attn_implementation.startswith("flash"):
            return position_ids, self._flash_mask(ok, attention_mask)
        return position_ids, for_attention(ok, h.dtype, self.config._attn_implementation)

    def _fixed_cache_mask(self, attention_mask, position_ids, key_position_ids, h, width, causal=False):
        """A fixed-size cache (compiled decoding) returns all its ``width`` key columns at every call, however far it
        is filled: the caller marks the valid ones (``attention_mask`` ``[B, width]``, the current tokens' columns
        included) and gives every position (``position_ids`` of the queries, ``key_position_ids`` ``[B, width]``), so
        no shape depends on the fill."""
        batch = h.shape[0]
        if attention_mask is None or tuple(attention_mask.shape) != (batch, width) or position_ids is None \
                or key_position_ids is None or key_position_ids.shape[-1] != width:
            raise ValueError(f"a fixed-size cache of {width} columns needs attention_mask [B, {width}] (its valid "
                             f"keys), position_ids and key_position_ids [B, {width}]")
        if self.config._attn_implementation.startswith("flash"):
            raise ValueError("a fixed-size cache masks its unfilled columns, which flash-attn cannot: load the model "
                             "with attn_implementation='sdpa' (or 'eager', 'flex_attention')")
        ok = visible(position_ids.expand(batch, -1), key_position_ids.expand(batch, -1), self.block_size,
                     k_valid=attention_mask.bool(), causal=causal)
        return position_ids, for_attention(ok, h.dtype, self.config._attn_implementation)

    def _flash_mask(self, ok, attention_mask):
        """flash-attn takes no arbitrary mask: padding goes as the 2-D mask (varlen), block structure cannot."""
        if ok is None or bool(ok.all()):
            return None
        if self.block_size is None:
            return attention_mask
        raise ValueError(
            f"{self.config._attn_implementation} cannot express the block-causal mask of this call; load the model "
            "with attn_implementation='sdpa' (or 'eager') for block-diffusion prefill and training.")


class DiffusionLM(DiffusionPreTrainedModel):
    """``backbone -> LM head``; returns raw (unshifted) logits. Use ``dare.models.Family.logits`` for logits aligned
    to the denoised positions. ``logits_to_keep`` (int: last k; an index tensor of positions; or a boolean ``[B, L]``
    mask, whose True positions give ``[M, V]`` in row-major order) avoids materialising vocabulary-sized rows that
    nobody reads."""

    _tied_weights_keys: dict = {}

    @classmethod
    def can_generate(cls) -> bool:
        return False  # no left-to-right generate(): diffusion LMs decode with dare.sampling

    def prepare_inputs_for_generation(self, *args, **kwargs):
        """Only looked up (never called) by PEFT's causal-LM wrapper (``AutoPeftModelForCausalLM``)."""
        raise NotImplementedError(f"{type(self).__name__} is a diffusion LM: decode with dare.sampling or "
                                  "evaluate.py, not transformers' left-to-right generate()")

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new):
        self.lm_head = new

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, new):
        self.model.embed_tokens = new

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, inputs_embeds=None,
                use_cache=False, logits_to_keep: int | torch.Tensor = 0, **kwargs):
        # the standard causal-LM arguments that wrappers (PEFT's PeftModelForCausalLM) pass, as None by default
        kwargs.pop("return_dict", None)
        for key in ("labels", "output_attentions", "output_hidden_states"):
            if (value := kwargs.pop(key, None)) is not None and value is not False:
                raise NotImplementedError(f"{type(self).__name__}.forward does not take {key}= (losses live in "
                                          "dare.objectives; the forward returns logits only)")
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=cache, inputs_embeds=inputs_embeds,
                         use_cache=use_cache, **kwargs)
        h = out.last_hidden_state
        if isinstance(logits_to_keep, int):
            h = h[:, -logits_to_keep:] if logits_to_keep else h
        elif logits_to_keep.dtype == torch.bool:  # [B, L]: these positions only, flattened to [M, V]
            h = h[logits_to_keep]
        else:
            h = h[:, logits_to_keep]
        logits = self.get_output_embeddings()(h)
        return CausalLMOutputWithPast(logits=logits, **{_CACHE_FIELD: getattr(out, _CACHE_FIELD)})


__all__ = [
    "DiffusionBackbone", "DiffusionLM", "DiffusionPreTrainedModel", "GatedMLP", "RotaryEmbedding", "Router",
    "SparseMoE", "apply_rotary", "attend", "clean_checkpoint_kwargs", "DiffusionConfigMixin", "ship_code",
]
