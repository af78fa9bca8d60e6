"""DiffusionGemma (``google/diffusiongemma-26B-A4B-it``): uniform-noise block diffusion on transformers' own
``DiffusionGemmaForBlockDiffusion`` (no modeling code here: the official weights load with ``from_pretrained``).

The model is an encoder-decoder whose two stacks share their weights:

* the **encoder** reads the prompt and every accepted canvas causally (Gemma 4 attention: sliding-window layers
  and full layers) and only writes its keys and values into a cache;
* the **decoder** reads one canvas (``config.canvas_length`` tokens, 256) bidirectionally, attends to the encoder's
  cache (a sliding layer sees its last ``sliding_window - 1`` entries, as ``DynamicSlidingWindowLayer`` keeps
  them) and may take the previous step's logits as a self-conditioning input.

Canvases start right after the prompt (not at position 0 as SDAR's blocks do): canvas k of a row whose completion
starts at position p covers positions ``p + k C .. p + (k+1) C - 1``.

``layout_logits`` is the training layout (DARE's ``[x_t ‖ x_0]`` for this family): the encoder reads the clean
sequence once, and the decoder reads every noisy canvas of the completion in one call, each canvas attending to the
clean positions before its start and to itself: exactly the logits the decoding loop computes canvas by canvas.
Positions count from the first real token of the row (``transformers``' ``generate`` counts padding columns too, so
only an unpadded row decodes as it does there).
"""

import torch
from transformers import DiffusionGemmaConfig, DynamicCache

from .masks import for_attention, positions_from_padding

SLIDING, FULL = "sliding_attention", "full_attention"


def tiny_config(vocab_size: int, mask_token_id=None, eos_token_id=1, pad_token_id=0, bos_token_id=2,
                canvas_length: int = 8, **overrides) -> DiffusionGemmaConfig:
    """Two layers (one sliding with window 8, one full), 4 experts, a 1-layer vision tower of width 16 (the class
    always builds one): about 0.2 M parameters. ``overrides`` set text-config fields."""
    text = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=16, sliding_window=8,
                max_position_embeddings=1024, layer_types=[SLIDING, FULL], num_experts=4, top_k_experts=2,
                moe_intermediate_size=32, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                bos_token_id=bos_token_id)
    vision = dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=8, position_embedding_size=64,
                  patch_size=4, pooling_kernel_size=2)
    return DiffusionGemmaConfig(text_config={**text, **overrides}, vision_config=vision, canvas_length=canvas_length,
                                pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id)


def text_only(model):
    """The model with its vision tower frozen: DARE feeds it text only, so those weights never get a gradient (DDP
    without unused-parameter detection, as transformers' Trainer runs it under gradient checkpointing, would stop on
    them) and need no optimiser state. They still load and save with the rest."""
    for name in ("vision_tower", "embed_vision"):
        getattr(model.model.encoder, name).requires_grad_(False)
    return model


def _window(model) -> int:
    return model.config.get_text_config().sliding_window


def unwrap(model):
    """The ``DiffusionGemmaForBlockDiffusion`` inside DDP / DeepSpeed (``.module``) or PEFT (``get_base_model``)
    wrappers (LoRA layers live inside it, so calling it directly keeps them)."""
    while not hasattr(model, "lm_head") or not hasattr(getattr(model, "model", None), "encoder"):
        model = model.module if hasattr(model, "module") else model.get_base_model()
    return model


def layout_logits(model, noisy: torch.Tensor, clean: torch.Tensor, attention_mask: torch.Tensor | None,
                  start: torch.Tensor, keep: int | None = None,
                  self_conditioning: torch.Tensor | None = None,
                  self_conditioning_mask: torch.Tensor | None = None, with_encoder: bool = False):
    """Logits ``[B, L, V]`` of every noisy canvas (``keep=k``: only the last k columns, ``[B, k, V]``).

    noisy, clean   ``[B, L]``: the noised and the clean sequence (prompt + completion + padding)
    start          ``[B]``: the column where each row's completion (its first canvas) begins
    keep           score only the last ``keep`` columns (they must hold every row's completion)
    self_conditioning  ``[B, keep or L, V]`` logits of a previous pass fed to the decoder (None: none)

    with_encoder       also return the encoder's next-token logits ``[B, L, V]`` of the clean sequence (row i
                       predicts token i + 1; DiffusionGemma's SFT adds their cross-entropy)

    Columns before a row's ``start`` and padding are not canvases: their logits are meaningless (they attend to
    themselves only, so no query row is fully masked).
    """
    batch, length = clean.shape
    real = torch.ones_like(clean, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    pos = positions_from_padding(real.long())
    inner = unwrap(model)
    canvas = inner.config.canvas_length
    width = keep or length
    q0 = length - width
    col = torch.arange(length, device=clean.device)
    if bool((start < q0).any()):
        raise ValueError(f"keep={keep} cuts into a completion: completions start at columns {start.tolist()}")
    q = col[q0:]
    block = torch.where(q[None] >= start[:, None], (q[None] - start[:, None]) // canvas, -1)  # [B, Q]
    block_start = start[:, None] + block.clamp(min=0) * canvas
    target = (block >= 0) & real[:, q0:]
    before = col[None, None, :] < block_start[:, :, None]  # encoder key j is before the query's canvas
    on_enc = target[:, :, None] & before & real[:, None, :]
    recent = col[None, None, :] >= block_start[:, :, None] - (_window(inner) - 1)
    same = (block[:, :, None] == block[:, None, :]) & target[:, :, None] & target[:, None, :]
    self_only = torch.eye(width, dtype=torch.bool, device=clean.device)[None] & ~target[:, :, None]
    on_canvas = same | self_only
    dtype = next(model.parameters()).dtype
    masks = {FULL: torch.cat([on_enc, on_canvas], dim=-1),
             SLIDING: torch.cat([on_enc & recent, on_canvas], dim=-1)}
    masks = {k: for_attention(v, dtype, inner.config._attn_implementation) for k, v in masks.items()}
    # one call of the (possibly DDP / PEFT wrapped) model: its encoder fills the cache, its decoder reads it
    out = model(input_ids=clean, attention_mask=real.long(), position_ids=pos, cache=DynamicCache(),
                decoder_input_ids=noisy[:, q0:], decoder_attention_mask=masks, decoder_position_ids=pos[:, q0:],
                self_conditioning_logits=self_conditioning, self_conditioning_mask=self_conditioning_mask)
    if not with_encoder:
        return out.logits
    return out.logits, softcap(inner, inner.lm_head(out.encoder_last_hidden_state))


def softcap(model, logits: torch.Tensor) -> torch.Tensor:
    """The model's final logit soft-capping, as its forward applies it (float32)."""
    cap = model.config.get_text_config().final_logit_softcapping
    return logits.float() if cap is None else torch.tanh(logits.float() / cap) * cap
