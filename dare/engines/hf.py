"""The ``hf`` engine: DARE's samplers on the in-process model, batched (many prompts x n samples, micro-batches
of left-padded prompts) and seeded."""

import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from ..sampling import SamplingConfig, generate
from ..sampling.primitives import after_first
from .base import Rollout


def encode(tokenizer, prompts: list) -> list[list[int]]:
    """Chats (lists of messages) go through the chat template; strings are used as they are."""
    out = []
    for p in prompts:
        if isinstance(p, str):
            out.append(tokenizer(p, add_special_tokens=False)["input_ids"])
        else:
            out.append(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"])
    return out


def check_prompts(ids: list[list[int]]) -> list[list[int]]:
    """The token ids of the rows to decode, refused if there are none or one is empty."""
    if not ids:
        raise ValueError("No prompts given.")
    if any(len(p) == 0 for p in ids):
        raise ValueError("Empty prompt: every prompt needs at least one token.")
    return ids


def decode_completions(tokenizer, family, completion: torch.Tensor, generated: torch.Tensor | None = None):
    """The completion mask (generated tokens up to and including the first stop token) and the texts (up to, not
    including, the first stop token; special tokens skipped) of ``[N, R]`` completion ids."""
    is_stop = torch.isin(completion, torch.tensor(family.stop_ids, device=completion.device))
    mask = ~after_first(is_stop)
    if generated is not None:
        mask &= generated
    texts = [tokenizer.decode(c[m & ~s], skip_special_tokens=True) for c, m, s in zip(completion, mask, is_stop, strict=True)]
    return mask.long(), texts


class HFEngine:
    def __init__(self, model, tokenizer, family, max_batch_size: int = 64):
        self.model, self.tokenizer, self.family = model, tokenizer, family
        self.max_batch_size = max_batch_size

    def encode(self, prompts: list) -> list[list[int]]:
        return encode(self.tokenizer, prompts)

    def identity(self) -> dict:
        """What an evaluation's fingerprint records of the model (revision, config and weights digests)."""
        from ..eval.harness import identity, weights_digest
        return identity(self.model.config, weights_digest(self.model))

    def generate(self, prompts: list, n: int = 1, config: SamplingConfig | None = None,
                 seed: int | None = None, canvas: torch.Tensor | None = None, from_step: int = 0,
                 to_step: int | None = None) -> Rollout:
        """``n`` completions per prompt (prompt-major). ``canvas``/``from_step``/``to_step``: resume each row's
        partial decoding (masked families; one canvas row per output row), see ``dare.sampling.generate``."""
        config = config or SamplingConfig()
        device = next(self.model.parameters()).device
        generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
        ids = check_prompts([p for p in self.encode(prompts) for _ in range(n)])
        parts, start = [], time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        try:
            for i in range(0, len(ids), self.max_batch_size):
                prompt_ids, prompt_mask = self._left_pad(ids[i:i + self.max_batch_size], device)
                partial = None if canvas is None else canvas[i:i + self.max_batch_size].to(device)
                parts.append((prompt_ids, prompt_mask, generate(self.model, self.family, prompt_ids, prompt_mask,
                                                                config, generator, partial, from_step, to_step)))
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
        steps = lambda name: [torch.cat(s) for s in zip(*[getattr(g, name) for _, _, g in parts], strict=True)]  # noqa: E731
        replay = parts[0][2].replay_ids is not None
        return Rollout(prompt_ids, prompt_mask, completion, completion_mask, step_map,
                       torch.cat([g.block_step for _, _, g in parts]), texts, sum(g.nfe for _, _, g in parts),
                       seconds, steps("states"), steps("predictions"), steps("confidences"),
                       torch.cat([g.replay_ids for _, _, g in parts]) if replay else None,
                       torch.cat([g.replay_step for _, _, g in parts]) if replay else None)

    def _left_pad(self, rows: list[list[int]], device):
        ids, mask = left_pad(rows, self.family.pad_id)
        return ids.to(device), mask.to(device)


class InProcessEngine:
    """A trainer's ``hf`` engine: DARE's samplers on the policy being trained, so nothing is copied. The trainer
    calls ``serving`` around each rollout (``dare/engines/sglang.py`` has the same contract)."""

    sync_seconds = 0.0  # nothing is copied

    def __init__(self, tokenizer, family, max_batch_size: int = 64):
        self.tokenizer, self.family, self.max_batch_size = tokenizer, family, max_batch_size

    @contextmanager
    def serving(self, policy, version: int):
        """An engine decoding with ``policy``'s current weights (``version``: the optimiser step they come from)."""
        yield HFEngine(policy, self.tokenizer, self.family, self.max_batch_size)

    def close(self):
        pass


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists as a left-padded ``[N, longest]`` batch and its attention mask."""
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[r, width - len(row):] = 1
    return ids, mask
