"""The ``Family`` record: everything that differs between model families, resolved once from a model config and
its tokenizer, plus THE function that returns logits aligned to the positions being denoised.

Every sampler, loss and estimator calls ``Family.logits``; nothing else re-implements Dream's shift or the block
masks (those live in ``masks.py``, used here and by the models' own forward).
"""

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache

from . import masks
from .tokenizers import TURN_END

# model_type -> (family name, logits shifted by one (prediction for token i read at position i-1), default transfer
#                schedule, default remasking confidence, default threshold rule of the official sampler)
KNOWN = {"llada": ("llada", False, "linear", "low_confidence", "one"),
         "Dream": ("dream", True, "dream", "entropy", "quota"),
         "sdar": ("sdar", False, "linear", "low_confidence", "schedule"),
         "sdar_moe": ("sdar_moe", False, "linear", "low_confidence", "schedule"),
         "llada2_moe": ("llada2", False, "linear", "low_confidence", "schedule"),
         "diffusion_gemma": ("diffusion_gemma", False, "linear", "low_confidence", "one"),
         "nemotron_labs_diffusion": ("nemotron_diffusion", False, "linear", "low_confidence", "one"),
         "llava_llada": ("llada_v", False, "linear", "low_confidence", "one"),
         "mmada": ("mmada", False, "linear", "low_confidence", "one")}
UNIFORM = ("diffusion_gemma",)  # families whose noise is uniform random tokens, not a mask token
# families that decode blocks of config.block_size against a causal context (their attention is not block-causal: a
# block is read bidirectionally, committed tokens left to right; dare/sampling/causal.py). They train on [x_t ‖ x_0]
# with blocks of that size and a clean half read left to right (Nemotron's block_diff), or plainly bidirectionally.
CAUSAL_CONTEXT = ("nemotron_diffusion",)
PICTURES = ("llada_v", "mmada")  # families whose prompts may hold pictures (dare.models.pictures reads them)


def max_positions(config) -> int | None:
    """The longest sequence the checkpoint was built for (``max_position_embeddings``; LLaDA:
    ``max_sequence_length``; DiffusionGemma: its text config's)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "max_sequence_length", None)


@dataclass(frozen=True)
class Family:
    name: str                      # llada ... llada_v mmada (KNOWN)
    mask_id: int                   # -1 for uniform-noise families (they have no mask token)
    eos_id: int
    pad_id: int
    bos_id: int | None
    stop_ids: tuple[int, ...]      # EOS and the turn terminator the model emits
    shift: bool                    # Dream: logits at i-1 predict token i
    block_size: int | None         # None = fully bidirectional (masked diffusion); DiffusionGemma: its canvas length
    vocab_size: int
    schedule: str = "linear"       # default tokens-per-step rule: LLaDA's even split, or Dream's floor(m(1-s/t))
    remasking: str = "low_confidence"  # default confidence (Dream's recommended alg is entropy)
    # parallel decoding rule of the official sampler (sampling.primitives.THRESHOLD_RULES)
    threshold_rule: str = "one"
    # "mask": noised positions hold mask_id; "uniform": a uniformly random token (DiffusionGemma: an encoder-decoder
    # whose canvases start after the prompt, dare.models.diffusion_gemma)
    noise: str = "mask"
    # Nemotron-Labs-Diffusion: the default block of its decoding against a causal context (a causal prefill, each
    # block denoised bidirectionally against the cache, then a causal pass that proposes the next block's first
    # token: dare/sampling/causal.py); None: the family's sampler reads the canvas with its own attention
    causal_block: int | None = None
    pictures: bool = False  # its prompts may hold pictures (LLaDA-V): rows with images are read, not refused

    @property
    def is_block_diffusion(self) -> bool:
        return self.block_size is not None

    @classmethod
    def from_pretrained(cls, config, tokenizer=None) -> "Family":
        """Resolve ids in the reference order: config.json first; then the tokenizer's bos/eos/pad; the mask id
        from the tokenizer if it declares a mask token (Dream, SDAR, LLaDA2), else config.mask_token_id (LLaDA)."""
        model_type = getattr(config, "model_type", None)
        if model_type not in KNOWN:
            raise ValueError(f"Unknown model family {model_type!r}; known model_type values: {sorted(KNOWN)}")
        name, shift, schedule, remasking, threshold_rule = KNOWN[model_type]
        uniform = name in UNIFORM
        text = config.get_text_config() if hasattr(config, "get_text_config") else config  # DiffusionGemma's ids
        ids = {k: _first(getattr(config, f"{k}_token_id", None) or getattr(text, f"{k}_token_id", None))
               for k in ("mask", "eos", "pad", "bos")}
        stop = []
        if tokenizer is not None:
            for k in ("bos", "eos", "pad"):
                if getattr(tokenizer, f"{k}_token", None) is not None:
                    ids[k] = getattr(tokenizer, f"{k}_token_id")
            if getattr(tokenizer, "mask_token", None) is not None:
                ids["mask"] = tokenizer.convert_tokens_to_ids(tokenizer.mask_token)
            turn_end = tokenizer.convert_tokens_to_ids(TURN_END[name.removesuffix("_moe")])
            if turn_end is not None and turn_end != tokenizer.unk_token_id:
                stop.append(turn_end)
        vocab = getattr(config, "embedding_size", None) or text.vocab_size
        if uniform:  # noise is random tokens: a mask token (Gemma's tokenizer declares one) is never used
            ids["mask"] = -1
        elif ids["mask"] is None:
            raise ValueError(f"{name}: no mask token: the tokenizer declares none and config.mask_token_id is unset")
        elif not 0 <= ids["mask"] < vocab:
            raise ValueError(f"{name}: mask token id {ids['mask']} is outside the vocabulary (size {vocab})")
        if ids["eos"] is None:
            raise ValueError(f"{name}: no EOS token id in the config or the tokenizer")
        if ids["pad"] is None:
            ids["pad"] = ids["eos"]
        stop_ids = tuple(dict.fromkeys([ids["eos"], *stop]))
        block = config.canvas_length if uniform else getattr(config, "block_size", None)
        causal_block = block if name in CAUSAL_CONTEXT else None
        if causal_block is not None:  # its attention is bidirectional (or causal), never block-causal
            block = None
        return cls(name, ids["mask"], ids["eos"], ids["pad"], ids["bos"], stop_ids, shift, block, vocab, schedule,
                   remasking, threshold_rule, "uniform" if uniform else "mask", causal_block, name in PICTURES)

    def logits(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
               clean_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None,
               cache=None, key_position_ids: torch.Tensor | None = None,
               keep: int | torch.Tensor | None = None, segment_ids: torch.Tensor | None = None,
               start: torch.Tensor | None = None, self_conditioning: torch.Tensor | None = None,
               self_conditioning_mask: torch.Tensor | None = None, clean_cache=None,
               clean_keep: torch.Tensor | None = None, block_origin: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, L, V]`` where row i scores the token at position i of ``input_ids``; ``keep=k`` returns only
        the last k positions ``[B, k, V]``, ``keep=positions`` (1-D) only those, and a boolean ``[B, L]`` ``keep`` the
        True positions ``[M, V]`` in row-major order (SFT's masked positions), without materialising the rest.

        * plain layout (``clean_ids=None``): the model's own attention (bidirectional, or block-causal for block
          families), with a padding mask and an optional cache. For a shifted family (Dream) position 0 of the
          call has no prediction and repeats position 1's source (never a target when the call starts the
          sequence; a chunk that starts mid-sequence must include one preceding token).
        * doubled layout (``clean_ids`` given, block families): the model reads ``[x_t ‖ x_0]`` with the three
          BD3LM attention rules and the logits of the noisy half are returned; with ``keep`` the noisy copy of the
          blocks before every kept row's block (the prompt's, in RL scoring) is left out of the call: nothing kept
          reads it (``masks.unread_noisy_columns``). ``clean_cache`` (from ``clean_cache``, for the same rows and
          clean ids): only the noisy half is fed, against the clean half's cached keys and values (the estimators
          score every draw this way; no-grad scoring of several draws of one batch shares one clean pass).
          A family that decodes against a causal context (Nemotron-Labs-Diffusion, ``causal_block``) trains on this
          layout with blocks of ``causal_block`` and a clean half that reads left to right (its ``block_diff``
          training); ``clean_keep`` (boolean ``[B, L]``, with a boolean ``keep``) also returns the clean half's
          logits at those positions, its causal next-token predictions: ``(noisy [M, V], clean [M', V])``.
          ``block_origin`` ``[B]``: the position where each row's blocks start (default: the global grid; Nemotron's
          RL scoring starts them at the completion, as its sampler decodes them).
        * packed rows (``segment_ids`` ``[B, L]``: which example each position belongs to, -1 = padding; either
          layout): attention stays inside each example, positions and blocks restart at its first token, and
          Dream's shift reads position i-1 of the same example (an example's first position reads itself, as
          position 0 does above). Each example's logits are those it gets alone. ``keep`` here is boolean, if
          any (a packed row's other prompts and padding are read by nothing).
        * uniform-noise families (DiffusionGemma, ``dare.models.diffusion_gemma``): the plain layout is one canvas
          read by the decoder against the encoder's ``cache`` (``attention_mask`` covers the cached columns and the
          canvas); the doubled layout (``clean_ids``) needs ``start`` ``[B]``, the column where each row's completion
          begins (its canvases start there). ``self_conditioning``: the previous pass's logits of these positions.
        """
        if self.noise == "uniform":
            return self._uniform_logits(model, input_ids, attention_mask, clean_ids, position_ids, cache, keep,
                                        segment_ids, start, self_conditioning, self_conditioning_mask)
        masked = torch.is_tensor(keep) and keep.dtype == torch.bool
        if masked and keep.shape != input_ids.shape:
            raise ValueError(f"a boolean keep must have the shape of input_ids {tuple(input_ids.shape)}, got "
                             f"{tuple(keep.shape)}")
        if segment_ids is not None:
            if any(x is not None for x in (attention_mask, position_ids, cache, key_position_ids)):
                raise ValueError("segment_ids define the attention and the positions of packed rows: pass no "
                                 "attention_mask, position_ids or cache with them")
            if keep is not None and not masked:
                raise ValueError(f"packed rows keep a boolean mask of their shape {tuple(input_ids.shape)}, got "
                                 f"{keep if not torch.is_tensor(keep) else tuple(keep.shape)}")
            if _attention(model).startswith("flash"):
                raise ValueError("packed rows need a 4-D attention mask: load the model with attn_implementation="
                                 "'sdpa' (or 'eager')")
            if clean_ids is None:
                return self._packed_logits(model, input_ids, segment_ids, keep)
        if clean_ids is None:
            if cache is not None and self.block_size is not None and masks.fixed_width(cache) is None:
                self._check_whole_blocks(cache, attention_mask, input_ids.shape[1])
            width = input_ids.shape[1]
            if masked:  # a shifted family's position i reads row i - 1 (position 0 itself)
                source = (torch.arange(width, device=keep.device) - 1).clamp(min=0).expand_as(keep)
                return self._kept_logits(model, keep, source, input_ids=input_ids, attention_mask=attention_mask,
                                         position_ids=position_ids, cache=cache, key_position_ids=key_position_ids)
            if torch.is_tensor(keep):  # explicit positions: a shifted family reads each one a position back
                rows = (keep - 1).clamp(min=0) if self.shift else keep
                return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache, key_position_ids=key_position_ids, logits_to_keep=rows).logits
            if keep is not None and not 0 < keep <= width:
                raise ValueError(f"keep must be in [1, {width}], got {keep}")
            extra = int(self.shift and keep is not None and keep < width)  # the shifted row reads one position back
            only = {} if keep is None else {"logits_to_keep": keep + extra}
            out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                        key_position_ids=key_position_ids, **only).logits
            if not self.shift:
                return out
            return out[:, :-1] if extra else torch.cat([out[:, :1], out[:, :-1]], dim=1)
        block = self.block_size or self.causal_block
        if block is None:
            raise ValueError(f"{self.name} is a masked-diffusion family: the [x_t ‖ x_0] layout needs a block size")
        if cache is not None or position_ids is not None:
            raise ValueError("The [x_t ‖ x_0] layout derives its own positions and takes no cache.")
        if clean_keep is not None and not masked:
            raise ValueError("clean_keep needs a boolean keep of the noisy positions")
        if clean_cache is not None:
            return self._noisy_against_clean(model, input_ids, attention_mask, keep, clean_cache)
        ids, pos, ok = masks.doubled_layout(input_ids, clean_ids, attention_mask, block, segment_ids,
                                            clean_causal=self.causal_block is not None, block_origin=block_origin)
        dtype = next(model.parameters()).dtype
        width = input_ids.shape[1]
        rows = keep if torch.is_tensor(keep) else torch.arange(width - (keep or width), width, device=ids.device)
        skip = 0
        if keep is not None and segment_ids is None:  # the noisy copy of whole prompt blocks is never read: skip it
            skip = masks.unread_noisy_columns(attention_mask, rows, width, block, block_origin)
            ids, pos, rows = ids[:, skip:], pos[:, skip:], keep[:, skip:] if masked else rows - skip
            ok = None if ok is None else ok[:, skip:, skip:]
        if masked:  # the kept noisy positions; the clean half: none, or clean_keep's
            rows = torch.cat([rows, torch.zeros_like(keep) if clean_keep is None else clean_keep.bool()], 1)
        out = model(input_ids=ids, attention_mask=masks.for_attention(ok, dtype, _attention(model)), position_ids=pos,
                    logits_to_keep=rows).logits
        if clean_keep is None:
            return out
        noisy = rows.nonzero()[:, 1] < width - skip  # out's rows in row-major order of the layout
        return out[noisy], out[~noisy]

    def clean_cache(self, model, clean_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """The keys and values of the clean half of ``[x_t ‖ x_0]`` (block families): the clean half attends to
        itself only, block-causally, exactly as a plain pass over ``clean_ids`` does, so one pass serves every noisy
        draw of the same rows (``logits(..., clean_cache=)``). None for other families, and for a model in training
        mode with activation checkpointing, whose layers drop the cache when they build a graph: its scoring stays
        in the one-call layout with and without a graph, so both give the same numbers."""
        if self.block_size is None or self.noise != "mask":
            return None
        if model.training and any(getattr(m, "gradient_checkpointing", False) for m in model.modules()):
            return None
        cache = DynamicCache()
        # the kept row ties the clean pass's last layer into the graph (zero gradient), as the one-call layout does:
        # an expert only clean tokens chose there gets a zero gradient, not none (AdamW treats them differently)
        cache.anchor = model(input_ids=clean_ids, attention_mask=attention_mask, cache=cache, logits_to_keep=1).logits
        return cache

    def _noisy_against_clean(self, model, noisy, attention_mask, keep, cache):
        """The noisy half of ``[x_t ‖ x_0]`` fed alone against the clean half's cache, under the layout's rules (a
        noisy query sees clean keys of earlier blocks and noisy keys of its own block); the noisy copy of the
        blocks before every kept row's block is left out, as in the doubled call."""
        batch, width = noisy.shape
        if cache.get_seq_length() != width:
            raise ValueError(f"the clean cache holds {cache.get_seq_length()} columns, the noisy half {width}")
        valid = (torch.ones_like(noisy, dtype=torch.bool) if attention_mask is None else attention_mask.bool())
        pos = masks.positions_from_padding(valid)
        rows = keep if torch.is_tensor(keep) else torch.arange(width - (keep or width), width, device=noisy.device)
        masked = rows.dtype == torch.bool  # a boolean [B, L] keep: its True positions, [M, V]
        skip = masks.unread_noisy_columns(attention_mask, rows, width, self.block_size) if keep is not None else 0
        q_pos = pos[:, skip:]
        clean = torch.ones(batch, width, dtype=torch.bool, device=noisy.device)
        ok = masks.visible(q_pos, torch.cat([pos, q_pos], 1), self.block_size,
                           k_valid=torch.cat([valid, valid[:, skip:]], 1), q_clean=~clean[:, skip:],
                           k_clean=torch.cat([clean, ~clean[:, skip:]], 1))
        mask = masks.for_attention(ok, next(model.parameters()).dtype, _attention(model))
        fresh = DynamicCache()  # this call's keys and values join a copy: every draw finds the clean half alone
        for i, layer in enumerate(cache.layers):
            fresh.update(layer.keys, layer.values, i)
        logits = model(input_ids=noisy[:, skip:], attention_mask=mask, position_ids=q_pos, cache=fresh,
                       logits_to_keep=rows[:, skip:] if masked else rows - skip).logits
        return logits + cache.anchor.sum() * 0.0 if torch.is_grad_enabled() else logits

    def _uniform_logits(self, model, input_ids, attention_mask, clean_ids, position_ids, cache, keep, segment_ids,
                        start, self_conditioning, self_conditioning_mask):
        from . import diffusion_gemma

        if segment_ids is not None:
            raise ValueError(f"{self.name}: packed rows are not supported (its encoder reads each row causally)")
        if clean_ids is None:
            if cache is None:
                raise ValueError(f"{self.name}: a canvas is read against the encoder's cache: pass cache=")
            out = model(decoder_input_ids=input_ids, cache=cache, decoder_attention_mask=attention_mask,
                        decoder_position_ids=position_ids, self_conditioning_logits=self_conditioning,
                        self_conditioning_mask=self_conditioning_mask).logits
            return out if keep is None else out[:, -keep:]
        if start is None:
            raise ValueError(f"{self.name}: the [x_t ‖ x_0] layout needs start= (where each row's canvases begin)")
        if torch.is_tensor(keep):
            raise ValueError(f"{self.name}: keep= takes a number of last columns, not positions")
        return diffusion_gemma.layout_logits(model, input_ids, clean_ids, attention_mask, start, keep,
                                             self_conditioning, self_conditioning_mask)

    def _packed_logits(self, model, input_ids, segment_ids, keep=None):
        pos, ok = masks.packed_layout(segment_ids, self.block_size)
        mask = masks.for_attention(ok, next(model.parameters()).dtype, _attention(model))
        source = torch.arange(input_ids.shape[1], device=input_ids.device) - (pos > 0).long()  # shifted: i-1 in it
        if keep is not None:
            return self._kept_logits(model, keep, source, input_ids=input_ids, attention_mask=mask, position_ids=pos)
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=pos).logits
        return out.gather(1, source[..., None].expand_as(out)) if self.shift else out

    def _kept_logits(self, model, keep, source, **inputs):
        """``[M, V]``: the logits of ``keep``'s True positions, row-major; a shifted family's position ``(r, c)`` reads
        the model's row ``(r, source[r, c])``, computed once where two positions read one."""
        if not self.shift:
            return model(**inputs, logits_to_keep=keep).logits
        rows, cols = keep.nonzero(as_tuple=True)
        read = torch.zeros_like(keep)
        read[rows, source[rows, cols]] = True
        out = model(**inputs, logits_to_keep=read).logits
        rank = read.flatten().cumsum(0) - 1  # each read position's row of ``out``
        return out[rank[rows * keep.shape[1] + source[rows, cols]]]

    def _check_whole_blocks(self, cache, attention_mask, length):
        """Rows that feed real tokens must have whole blocks cached (rows feeding only padding are done)."""
        past = cache.get_seq_length()
        if attention_mask is None:
            real, feeding = torch.tensor([past]), torch.tensor([True])
        else:
            real, feeding = attention_mask[:, :past].sum(-1), attention_mask[:, past:].bool().any(-1)
        if bool(((real % self.block_size != 0) & feeding).any()):
            raise ValueError(
                f"{self.name}: the KV cache must hold whole blocks of {self.block_size} real tokens, got "
                f"{real.tolist()}; prefill the prompt up to a block boundary and decode the partial block")


def _attention(model) -> str:
    """The attention path the model was loaded with (``sdpa``, ``flex_attention``, ...; DDP / DeepSpeed wrap it)."""
    config = getattr(getattr(model, "module", model), "config", None)
    return getattr(config, "_attn_implementation", None) or ""


def _first(value):
    return value[0] if isinstance(value, (list, tuple)) else value
