"""Uniform-noise block diffusion (DiffusionGemma): canvases of ``canvas_length`` tokens after the prompt, decoded
one after another; each canvas starts as uniformly random tokens and is refined for at most ``steps`` denoising
steps. How it follows the official sampler (transformers' ``DiffusionGemmaGenerationMixin.generate``,
``EntropyBoundSampler``):

* step n = N..1 (N = ``steps``) runs the decoder on the canvas with the previous step's logits as
  self-conditioning, divides the logits by the linear temperature ``t_min + (t_max - t_min) n / N``, samples a
  proposal from them (``temperature`` 0: their argmax) and keeps the proposal at the k lowest-entropy positions
  with ``sum(entropy) - max(entropy) <= entropy_bound``; every other position is re-noised with a fresh uniform
  token;
* a row stops refining a canvas once its argmax has not changed for ``stability_steps`` steps and its mean entropy
  is under ``confidence_stop``; the canvas's output is the last argmax, which the encoder then appends to its cache;
* after a canvas, a row holding a stop token is finished: tokens after its first stop token and every later canvas
  are padding (step -1); the batch stops once every row is.

Random numbers are drawn in the official order (the canvas, then per step the proposal and the re-noising), so with
the same seed an unpadded batch decodes token for token as ``generate`` does. Positions count from each row's first
real token (``generate`` counts padding columns: a padded row differs there, not here). ``step_map`` is the global
step at which a position was last accepted (canvas k owns steps ``k N .. (k+1) N - 1``; a position never accepted
takes its canvas's last step). ``record_states``: the generated region after every step, the current canvas
showing its argmax (the draft ``generate`` streams), later canvases padding.
"""

import torch
from transformers import DynamicCache

from ..models.diffusion_gemma import unwrap
from ..models.masks import positions_from_padding
from .config import Generation, plan_uniform


def entropy(logits: torch.Tensor) -> torch.Tensor:
    logp = logits.float().log_softmax(-1)
    return -(logp.exp() * logp).sum(-1)


def accept(entropies: torch.Tensor, bound: float) -> torch.Tensor:
    """The positions whose proposals are kept: the k lowest-entropy ones with ``sum - max <= bound`` (the sum over
    the others of the k bounds their mutual information; arXiv 2505.24857)."""
    ordered, order = entropies.sort(-1)
    keep = ordered.cumsum(-1) - ordered <= bound
    return torch.zeros_like(keep).scatter(-1, order, keep)


def generate_uniform(model, family, prompt_ids, prompt_mask, cfg, generator=None) -> Generation:
    plan = plan_uniform(cfg, family)
    canvas_len, vocab, device = family.block_size, family.vocab_size, prompt_ids.device
    rows = prompt_ids.shape[0]
    n_canvases = -(-cfg.gen_length // canvas_len)
    mask = prompt_mask.long()
    encoder = unwrap(model).model.encoder
    cache = DynamicCache(config=unwrap(model).config.get_text_config())
    encoder(input_ids=prompt_ids, attention_mask=mask, position_ids=positions_from_padding(mask), cache=cache)
    next_pos = mask.sum(-1)  # position of each row's next token
    stop_ids = torch.tensor(family.stop_ids, device=device)
    tokens, steps_of = [], []
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    nfe, states = 0, []
    region = torch.full((rows, n_canvases * canvas_len), family.pad_id, dtype=torch.long, device=device)
    for k in range(n_canvases):
        positions = next_pos[:, None] + torch.arange(canvas_len, device=device)
        full_mask = torch.cat([mask, torch.ones(rows, canvas_len, dtype=mask.dtype, device=device)], dim=1)
        canvas = torch.randint(0, vocab, (rows, canvas_len), device=device, generator=generator)
        argmax, sc_logits = canvas, None
        history = torch.full((plan.stability_steps, rows, canvas_len), -1, dtype=torch.long, device=device)
        done = torch.zeros(rows, dtype=torch.bool, device=device)
        last_accept = torch.full((rows, canvas_len), plan.steps - 1, dtype=torch.long, device=device)
        for i, n in enumerate(range(plan.steps, 0, -1)):
            logits = family.logits(model, canvas, full_mask, cache=cache, position_ids=positions,
                                   self_conditioning=sc_logits)
            nfe += 1
            logits = logits / (plan.t_min + (plan.t_max - plan.t_min) * n / plan.steps)
            if cfg.temperature > 0:
                probs = torch.softmax(logits / cfg.temperature, -1, dtype=torch.float32)
                proposal = torch.multinomial(probs.view(-1, vocab), 1, generator=generator).view(rows, canvas_len)
            else:
                proposal = logits.argmax(-1)
            new_argmax = logits.argmax(-1)
            kept = accept(entropy(logits), plan.entropy_bound)
            noise = torch.randint(0, vocab, (rows, canvas_len), device=device, generator=generator)
            new_canvas = torch.where(kept, proposal, noise)
            frozen = done[:, None]
            new_argmax = torch.where(frozen, argmax, new_argmax)
            new_canvas = torch.where(frozen, canvas, new_canvas)
            if sc_logits is not None:
                logits = torch.where(frozen[..., None], sc_logits, logits)
            last_accept = torch.where(kept & ~frozen, i, last_accept)
            stable = (history == new_argmax[None]).all(-1).all(0) if plan.stability_steps else torch.ones_like(done)
            history = torch.cat([history[1:], new_argmax[None]]) if plan.stability_steps else history
            done |= stable & (entropy(logits).mean(-1) < plan.confidence_stop)
            canvas, argmax, sc_logits = new_canvas, new_argmax, logits.to(next(model.parameters()).dtype)
            if cfg.record_states:
                region[:, k * canvas_len:(k + 1) * canvas_len] = torch.where(finished[:, None], family.pad_id, argmax)
                states.append(region[:, :cfg.gen_length].clone())
            if bool(done.all()):
                break
        hit = torch.isin(argmax, stop_ids)
        after = (hit.cumsum(-1) - hit.long()) > 0  # strictly after the first stop token
        dead = finished[:, None] | after
        tokens.append(argmax.masked_fill(dead, family.pad_id))
        region[:, k * canvas_len:(k + 1) * canvas_len] = tokens[-1]
        steps_of.append(torch.where(dead, -1, k * plan.steps + last_accept))
        finished |= hit.any(-1)
        if bool(finished.all()) or k == n_canvases - 1:
            break
        encoder(input_ids=argmax, attention_mask=full_mask, position_ids=positions, cache=cache)
        mask, next_pos = full_mask, next_pos + canvas_len
    sequences = torch.cat(tokens, dim=1)
    step_map = torch.cat(steps_of, dim=1)
    pad = n_canvases * canvas_len - sequences.shape[1]
    if pad:
        sequences = torch.nn.functional.pad(sequences, (0, pad), value=family.pad_id)
        step_map = torch.nn.functional.pad(step_map, (0, pad), value=-1)
    sequences, step_map = sequences[:, :cfg.gen_length], step_map[:, :cfg.gen_length]
    block_step = torch.where(step_map >= 0, step_map % plan.steps, -1)
    return Generation(sequences, step_map, block_step, nfe, states)
