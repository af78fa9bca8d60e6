"""DARE's block decoding as an SGLang dLLM algorithm, ``DareBlock``: SGLang's own algorithms decode by argmax only
(a GRPO group of greedy completions is one completion n times), so the ``sglang`` engine runs this one, which takes
each request's knobs from its ``custom_params`` and decodes a block exactly as ``dare/sampling/block.py`` does:
the same proposal (temperature, top-k/top-p, Gumbel-max in float64, mask and suppressed EOS banned), confidence
(``remasking``), schedule (``steps`` counted from the block size, linear or ascending) and selection (threshold
rules, Fast-dLLM factor, EOS early rejection), through the same functions.

It also records the block-local step that committed each position (``block_step``'s states) and returns every
emitted block with those steps: a hook around SGLang's ``process_batch_result_dllm`` attaches them to the request's
``customized_info`` (key ``STEPS_KEY``), which SGLang returns in ``meta_info`` aligned with ``output_ids``, so the
trajectory algorithms (cj-grpo, d2, tracerl, dipo, agrpo) replay SGLang rollouts as they replay DARE's own.

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
STEPS_KEY = "dare_block"  # meta_info key: per output token, the (ids, steps) of the block it starts, or None
SCHEDULER_HOOK = "sglang.srt.dllm.mixin.scheduler.SchedulerDllmMixin.process_batch_result_dllm"
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
    first step; set here: ``j`` the block-local step, ``at`` the step that committed each position, -1 for none).
    Returns which rows had no mask left when the step began (SGLang then emits the block: the forward that produced
    these logits cached its final tokens)."""
    masked = ids == mask_id
    if prompt is not None:  # prompt positions inside the first block
        masked &= ~prompt
    done = (~masked.any(-1)).tolist()
    groups: dict[str, list[int]] = {}  # rows with the same knobs at the same step of their block decode together
    for row, knobs in enumerate(requests):
        if not done[row]:
            states[row] = states[row] or {"j": 0, "carry": 0, "at": [-1] * ids.shape[1]}
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
            for position in chosen[i].nonzero()[:, 0].tolist():
                states[row]["at"][position] = j
            states[row]["j"] += 1
            if config.threshold is not None and config.threshold_rule == "quota":
                states[row]["carry"] = int(n[i] - chosen[i].sum())
    return done


class StepRecords(list):
    """``DareBlock.run``'s per-row block states, in the slot where SGLang's first-done-first-out mode (its default)
    carries the unfinished rows' states to the next round."""


def attach_steps(reqs: list, emitted: list, accepted: list | None, states: list) -> None:
    """Before SGLang appends a decoded block's tokens to each request's ``output_ids``: give the first of them the
    block's ``(ids, steps)`` (the positions it committed, in order: the prompt's positions in its first block have
    none) and the others None, in ``req.customized_info[STEPS_KEY]``; SGLang slices that list as it slices the tokens
    and returns it in ``meta_info``. ``emitted``: each row's block ids (or their generated tail), ``accepted``: which
    rows finished their block this round (None: all)."""
    for row, (req, state) in enumerate(zip(reqs, states, strict=True)):
        if not state or (accepted is not None and not accepted[row]):
            continue
        ids, at = list(emitted[row]), state["at"]
        offset = len(at) - len(ids)  # a generated tail is right-aligned in its block
        positions = [p for p, step in enumerate(at) if step >= 0]
        if not positions:
            continue
        if req.customized_info is None:
            req.customized_info = {}
        record = ([int(ids[p - offset]) for p in positions], [at[p] for p in positions])
        req.customized_info.setdefault(STEPS_KEY, []).extend([record] + [None] * (len(positions) - 1))


def keep_steps(original, scheduler, batch, result):
    """``SCHEDULER_HOOK`` (AROUND): ``attach_steps`` for the batches ``DareBlock`` decoded, then SGLang's own."""
    if isinstance(result.dllm_algo_state, StepRecords) and result.next_token_ids:
        attach_steps(batch.reqs, result.next_token_ids, result.accept_length_per_req_cpu, result.dllm_algo_state)
    return original(scheduler, batch, result)


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
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    class DareBlock(DllmAlgorithm):
        def max_steps(self, block_size: int) -> int:
            return block_size + 1  # every schedule commits >= 1 token per step, + the forward that caches the block

        def run(self, model_runner, forward_batch, algo_states=None):
            self.states = None
            logits, emitted, accepted, carried, graph = super().run(model_runner, forward_batch, algo_states)
            if self.states is None:  # nothing was decoded (a prompt-only block)
                return logits, emitted, accepted, carried, graph
            # every row's state: a finished row's holds its block's steps; SGLang keeps only the unfinished ones'
            return logits, emitted, accepted, StepRecords(self.states), graph

        def step(self, forward_batch, full_logits, states):
            batch = forward_batch.batch_size
            ids = forward_batch.input_ids.view(batch, self.block_size).clone()
            requests = forward_batch.sampling_info.custom_params
            if requests is None or any(not r or "block" not in r for r in requests):
                raise ValueError(f"{NAME} decodes DARE's requests only: custom_params must carry the decoding knobs "
                                 "(dare.engines.sglang builds them)")
            done = block_step(ids, full_logits.view(batch, self.block_size, -1), requests, states, self.mask_id,
                              forward_batch.dllm_prompt_mask)
            self.states = states  # filled in place: run returns them
            forward_batch.input_ids.copy_(ids.view(-1))  # in place: SGLang keeps the tensor's identity
            return done

    DareBlock.__name__ = DareBlock.__qualname__ = NAME
    algo_name_to_cls[NAME] = DareBlock
    HookRegistry.register(SCHEDULER_HOOK, keep_steps, HookType.AROUND)
