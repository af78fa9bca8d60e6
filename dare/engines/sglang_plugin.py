"""DARE's block decoding as an SGLang dLLM algorithm, ``DareBlock``: SGLang's own algorithms decode by argmax only
(a GRPO group of greedy completions is one completion n times), so the ``sglang`` engine runs this one, which takes
each request's knobs from its ``custom_params`` and decodes a block exactly as ``dare/sampling/block.py`` does:
the same proposal (temperature, top-k/top-p, Gumbel-max in float64, mask and suppressed EOS banned), confidence
(``remasking``), schedule (``steps`` counted from the block size, linear or ascending) and selection (threshold
rules, Fast-dLLM factor, EOS early rejection), through the same functions.

SGLang finds it through the ``sglang.srt.plugins`` entry point in pyproject.toml, which every SGLang process loads
(its workers are spawned: a class registered only in the parent would be lost there).
"""

import hashlib
import json
from types import SimpleNamespace

import torch

from ..sampling.config import plan_block
from ..sampling.primitives import ascending_schedule, decode_step, eos_factor, linear_schedule

NAME = "DareBlock"
KNOBS = ("temperature", "top_k", "top_p", "remasking", "schedule", "steps", "threshold", "threshold_rule", "factor",
         "alg_temp", "suppress_eos", "eos_early_rejection")


def request_knobs(config, family, seed: int) -> dict:
    """The ``custom_params`` of one request: the resolved decoding knobs (steps per block filled in), the family's
    ids and the request's seed."""
    return {**{k: getattr(config, k) for k in KNOBS}, "steps": plan_block(config, family), "eos_id": family.eos_id,
            "block": family.block_size, "seed": seed}


def block_step(ids: torch.Tensor, logits: torch.Tensor, requests: list[dict], states: list, mask_id: int,
               prompt: torch.Tensor | None = None) -> list[bool]:
    """One denoising step of ``B`` blocks in place: ``ids`` ``[B, block]`` (masks where undecoded), ``logits``
    ``[B, block, V]``, ``requests`` each row's ``request_knobs``, ``states`` each row's block state (None at a block's
    first step; set here). Returns which rows had no mask left when the step began (SGLang then emits the block: the
    forward that produced these logits cached its final tokens)."""
    masked = ids == mask_id
    if prompt is not None:  # prompt positions inside the first block
        masked &= ~prompt
    done = (~masked.any(-1)).tolist()
    groups: dict[str, list[int]] = {}  # rows with the same knobs at the same step of their block decode together
    for row, knobs in enumerate(requests):
        if not done[row]:
            states[row] = states[row] or {"j": 0, "carry": 0}
            key = {**{k: knobs[k] for k in (*KNOBS, "steps", "eos_id", "block")}, "j": states[row]["j"]}
            groups.setdefault(json.dumps(key, sort_keys=True), []).append(row)
    for key, rows in groups.items():
        knobs = json.loads(key)
        config, j = SimpleNamespace(**{k: knobs[k] for k in KNOBS}), knobs["j"]
        block, dynamic = knobs["block"], knobs["threshold"] is not None or knobs["factor"] is not None
        steps = block if dynamic else knobs["steps"]
        quota = (ascending_schedule if knobs["schedule"] == "ascending" else linear_schedule)(
            torch.full((1,), block, device=ids.device), steps)[0]  # counted from the block size, as block.py
        left = masked[rows].sum(-1)
        n = (quota[j] if j < steps else 0) + torch.tensor([states[r]["carry"] for r in rows], device=ids.device)
        n = torch.maximum(n.minimum(left), (left > 0).long()) if dynamic else n.minimum(left)
        # one generator per group, seeded by its requests and their progress: reproducible for a given batch
        seeds = repr(sorted((requests[r]["seed"], int(left[i])) for i, r in enumerate(rows)) + [j]).encode()
        generator = torch.Generator(ids.device).manual_seed(
            int.from_bytes(hashlib.blake2b(seeds, digest_size=8).digest(), "little") >> 1)
        x0, chosen, _ = decode_step(logits[rows], masked[rows], n, config, knobs["eos_id"], generator, mask_id,
                                    eos_factor(config.eos_early_rejection, j, steps))
        ids[rows] = torch.where(chosen, x0, ids[rows])
        for i, row in enumerate(rows):
            states[row]["j"] += 1
            if config.threshold is not None and config.threshold_rule == "quota":
                states[row]["carry"] = int(n[i] - chosen[i].sum())
    return done


def knobs_carrier() -> str:
    """A serialized no-op SGLang logit processor. SGLang hands requests' ``custom_params`` to the batch (where
    ``DareBlock`` reads them) only for requests that name a custom logit processor (server flag
    ``enable_custom_logit_processor``); dLLM decoding never calls it."""
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    class DareKnobs(CustomLogitProcessor):
        def __call__(self, logits, custom_param_list=None):
            return logits

    return DareKnobs.to_str()


def register():
    """The ``sglang.srt.plugins`` entry point: add ``DareBlock`` to SGLang's dLLM algorithms (in every process)."""
    from sglang.srt.dllm.algorithm import algo_name_to_cls
    from sglang.srt.dllm.algorithm.base import DllmAlgorithm

    class DareBlock(DllmAlgorithm):
        def max_steps(self, block_size: int) -> int:
            return block_size + 1  # every schedule commits >= 1 token per step, + the forward that caches the block

        def step(self, forward_batch, full_logits, states):
            batch = forward_batch.batch_size
            ids = forward_batch.input_ids.view(batch, self.block_size).clone()
            requests = forward_batch.sampling_info.custom_params
            if requests is None or any(not r or "block" not in r for r in requests):
                raise ValueError(f"{NAME} decodes DARE's requests only: custom_params must carry the decoding knobs "
                                 "(dare.engines.sglang builds them)")
            done = block_step(ids, full_logits.view(batch, self.block_size, -1), requests, states, self.mask_id,
                              forward_batch.dllm_prompt_mask)
            forward_batch.input_ids.copy_(ids.view(-1))  # in place: SGLang keeps the tensor's identity
            return done

    DareBlock.__name__ = DareBlock.__qualname__ = NAME
    algo_name_to_cls[NAME] = DareBlock
