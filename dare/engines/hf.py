"""The ``hf`` engine: DARE's samplers on the in-process model, batched (many prompts x n samples, micro-batches
of left-padded prompts) and seeded."""

import time
from contextlib import contextmanager
from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F

from ..config import one_of
from ..data.chat import left_pad
from ..data.images import DrawPrompt, PicturePrompt, batch_pictures, encode_pictured
from ..sampling import Generation, SamplingConfig, generate
from .base import Engine, Rollout, check_prompts, decode_completions, identity, register_engine, weights_digest


@dataclass
class HFOptions:
    # decode through torch.compile of the model (the forward every sampler calls), each micro-batch padded to a power
    # of two rows (copies of its last row; not for uniform noise) and its prompts to a multiple of 32 tokens, block
    # caches of the canvas's size, so that a few shapes compile once: greedy tokens equal eager decoding, sampled ones
    # draw other noise. Compiling takes seconds to minutes per shape; it pays on long decodings
    compile: bool = False
    # torch.compile's mode: reduce-overhead adds CUDA graphs (a GPU), max-autotune searches kernels
    compile_mode: one_of("default", "reduce-overhead", "max-autotune") = "default"


@register_engine("hf")
class HFEngine(Engine):
    """Every family, every knob: DARE's samplers on ``model`` (``max_batch_size`` rows per forward)."""

    own_samplers = records_steps = True
    options = HFOptions

    def __init__(self, model, tokenizer, family, max_batch_size: int = 64, options: HFOptions | None = None):
        self.model, self.tokenizer, self.family = model, tokenizer, family
        self.max_batch_size, self.settings = max_batch_size, options or HFOptions()
        self.decoder = compiled(model, self.settings.compile_mode) if self.settings.compile else model

    @classmethod
    def open(cls, model_name, tokenizer, family, *, model=None, options=None, max_batch_size=64, gpu=None):
        return cls(model, tokenizer, family, max_batch_size, options)

    @classmethod
    def server(cls, model_name, tokenizer, family, *, options=None, max_batch_size=64):
        return InProcessEngine(tokenizer, family, max_batch_size, options)

    def identity(self) -> dict:
        compiled = {"compiled": self.settings.compile_mode} if self.settings.compile else {}  # other sampling noise
        return {"engine": self.name, **compiled, **identity(self.model.config, weights_digest(self.model))}

    def reader(self):
        """The model's picture reader (``dare.models.pictures``, made once); refused for a model that reads none."""
        from ..models import pictures  # here, not at the top: --help imports the engines, dare.models transformers

        if getattr(self, "_reader", None) is None:
            self._reader = pictures(self.model.config)
        if self._reader is None:
            raise ValueError(f"prompts with pictures (or to draw), for a {self.family.name} model, which reads none")
        return self._reader

    def encode(self, prompts: list) -> list[list[int]]:
        """Prompts' token ids; a ``PicturePrompt``'s pictures as their placeholders (numbered from 0 in each), a
        ``DrawPrompt`` as its text-to-image prompt (``dare.engines.drawing``)."""
        if any(isinstance(p, (PicturePrompt, DrawPrompt)) for p in prompts):
            return encode_pictured(self.tokenizer, self.reader(), prompts)
        return super().encode(prompts)

    def rows_for(self, n: int) -> int:
        """The rows a micro-batch of ``n`` decodes: ``n``, or compiled, the next power of two (at most the batch).
        Not for uniform noise: its sampler draws random canvases even greedily, and more rows would draw other ones."""
        pads = self.settings.compile and self.family.noise == "mask"
        return min(1 << (n - 1).bit_length(), self.max_batch_size) if pads else n

    def generate(self, prompts: list, n: int = 1, config: SamplingConfig | None = None,
                 seed: int | None = None, canvas: torch.Tensor | None = None, from_step: int = 0,
                 to_step: int | None = None, given: torch.Tensor | None = None) -> Rollout:
        """``n`` completions per prompt (prompt-major). ``canvas``/``from_step``/``to_step``: resume each row's
        partial decoding (one canvas row per output row), see ``dare.sampling.generate``; the samplers only ever
        commit masked positions, so a canvas's tokens stay as given. ``given`` ``[N, R]``: the canvas positions that
        are supplied hints rather than the policy's own tokens (inpainting), kept in ``Rollout.given``.
        A ``PicturePrompt`` (a model that reads pictures) hands each micro-batch's model its prompts' pictures
        (features once); ``Rollout.pictures`` keeps each row's."""
        config = config or SamplingConfig()
        if any(isinstance(p, DrawPrompt) for p in prompts):  # MaskGIT over a picture's codes (dare.engines.drawing)
            if canvas is not None or not all(isinstance(p, DrawPrompt) for p in prompts):
                raise ValueError("prompts to draw decode alone and from scratch: no text prompts or canvas beside them")
            from .drawing import draw_rollout

            return draw_rollout(self, prompts, n, config, seed)
        if given is not None and (canvas is None or (given.bool() & (canvas == self.family.mask_id)).any()):
            raise ValueError("given marks canvas tokens: it needs a canvas with a token at every given position")
        device = next(self.model.parameters()).device
        generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
        pictured = any(isinstance(p, PicturePrompt) for p in prompts)
        reader = self.reader() if pictured else None
        ids = check_prompts([p for p in self.encode(prompts) for _ in range(n)])
        owners = [getattr(p, "pictures", ()) for p in prompts for _ in range(n)] if pictured else None
        parts, start = [], time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        try:
            for i in range(0, len(ids), self.max_batch_size):
                rows = ids[i:i + self.max_batch_size]
                padded = rows + rows[-1:] * (self.rows_for(len(rows)) - len(rows))
                prompt_ids, prompt_mask = (t.to(device) for t in left_pad(padded, self.family.pad_id))
                wider = -prompt_ids.shape[1] % WIDTH_STEP if self.settings.compile else 0  # a few prompt widths
                prompt_ids = F.pad(prompt_ids, (wider, 0), value=self.family.pad_id)
                prompt_mask = F.pad(prompt_mask, (wider, 0))
                partial = None if canvas is None else canvas[i:i + self.max_batch_size].to(device)
                if partial is not None and len(padded) > len(rows):
                    partial = torch.cat([partial, partial[-1:].expand(len(padded) - len(rows), -1)])
                decoder, fed = self.decoder, prompt_ids
                if reader is not None:  # the micro-batch's prompts' pictures, their features numbered over it
                    own = owners[i:i + self.max_batch_size]
                    fed, inputs = batch_pictures(reader, prompt_ids, own + own[-1:] * (len(padded) - len(rows)))
                    if inputs:  # features to hand the model (LLaDA-V); MMaDA's pictures are tokens of the prompt
                        decoder = reader.wrap(self.decoder, **{k: v.to(device) for k, v in inputs.items()})
                out = generate(decoder, self.family, fed, prompt_mask, config, generator, partial,
                               from_step, to_step, fixed_shapes=self.settings.compile)
                own = slice(len(rows)), slice(wider, None)  # the micro-batch's rows and prompt columns
                parts.append((prompt_ids[own], prompt_mask[own], first_rows(out, len(rows))))
        finally:
            self.model.train(was_training)
        seconds = time.perf_counter() - start
        width = max(p.shape[1] for p, _, _ in parts)
        prompt_ids = torch.cat([F.pad(p, (width - p.shape[1], 0), value=self.family.pad_id) for p, _, _ in parts])
        prompt_mask = torch.cat([F.pad(m, (width - m.shape[1], 0)) for _, m, _ in parts])
        completion = torch.cat([g.sequences for _, _, g in parts])
        step_map = torch.cat([g.step_map for _, _, g in parts])
        generated = step_map >= 0
        if canvas is not None:  # a resumed decoding: the canvas's tokens were generated earlier
            generated |= canvas.to(generated.device) != self.family.mask_id
        completion_mask, texts = decode_completions(self.tokenizer, self.family, completion, generated)
        most = max(len(g.states) for _, _, g in parts)
        for _, _, g in parts:  # a micro-batch that finished in fewer steps stays as it ended: no proposals
            if g.states and len(g.states) < most:
                extra = most - len(g.states)
                g.predictions += [g.states[-1]] * extra if g.predictions else []
                g.confidences += [torch.zeros_like(g.confidences[-1])] * extra if g.confidences else []
                g.states += [g.states[-1]] * extra
        steps = lambda name: [torch.cat(s) for s in zip(*[getattr(g, name) for _, _, g in parts], strict=True)]
        replay = parts[0][2].replay_ids is not None
        if given is not None:  # hints a block family's post-stop padding erased are no longer given
            given = given.to(completion.device).bool() & (completion == canvas.to(completion.device))
        return Rollout(prompt_ids, prompt_mask, completion, completion_mask, step_map,
                       torch.cat([g.block_step for _, _, g in parts]), texts, sum(g.nfe for _, _, g in parts),
                       seconds, steps("states"), steps("predictions"), steps("confidences"),
                       torch.cat([g.replay_ids for _, _, g in parts]) if replay else None,
                       torch.cat([g.replay_step for _, _, g in parts]) if replay else None, given=given,
                       entropy=cat_or_none(parts, "entropy"), replay_entropy=cat_or_none(parts, "replay_entropy"),
                       pictures=owners)


RECOMPILE_LIMIT = 64  # shapes compiled per forward before dynamo falls back to eager (block caches grow per block)
WIDTH_STEP = 32  # compiled: prompts left-padded to a multiple of this (the extra columns dropped from the rollout)


def compiled(model, mode: str):
    """``model`` behind ``torch.compile`` (static shapes; ``mode`` as torch.compile's)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(model, mode=None if mode == "default" else mode, dynamic=False)


def first_rows(out: Generation, n: int) -> Generation:
    """``out`` with only its first ``n`` rows (a padded micro-batch's own)."""
    cut = lambda v: v[:n] if isinstance(v, torch.Tensor) else [t[:n] for t in v] if isinstance(v, list) else v
    return Generation(**{f.name: cut(getattr(out, f.name)) for f in fields(out)})


def cat_or_none(parts, name: str):
    """The micro-batches' recorded ``name`` tensors joined (None: not recorded)."""
    found = [getattr(g, name) for _, _, g in parts]
    return None if found[0] is None else torch.cat(found)


class InProcessEngine:
    """A trainer's ``hf`` engine: DARE's samplers on the policy being trained, so nothing is copied. The trainer
    calls ``serving`` around each rollout (``dare/engines/sglang.py`` has the same contract)."""

    sync_seconds = 0.0  # nothing is copied

    def __init__(self, tokenizer, family, max_batch_size: int = 64, options: HFOptions | None = None):
        self.tokenizer, self.family, self.max_batch_size, self.options = tokenizer, family, max_batch_size, options

    @contextmanager
    def serving(self, policy, version: int):
        """An engine decoding with ``policy``'s current weights (``version``: the optimiser step they come from)."""
        yield HFEngine(policy, self.tokenizer, self.family, self.max_batch_size, self.options)

    def close(self):
        pass

