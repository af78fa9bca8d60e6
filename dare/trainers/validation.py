"""Validation by generation, shared by the RL and SFT trainers: decode one completion per held-out prompt (the rows
sharded over the processes), score it with the rewards, and report reward and accuracy overall and per data source."""

import time
from contextlib import contextmanager

from accelerate.utils import gather_object
from trl.models.utils import unwrap_model_for_generation

from ..data.images import pictured_prompt
from ..engines import InProcessEngine


@contextmanager
def eval_policy(trainer):
    """The trainer's model for no-grad passes: unwrapped from DDP (ZeRO-3 parameters gathered), in eval mode. Every
    process must enter it (the gather is collective)."""
    with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
        was_training = model.training
        model.eval()
        try:
            yield model
        finally:
            model.train(was_training)


def generation_metrics(trainer, rows: list[dict], sampling, rewards, workers: int, batch_size: int,
                       prefix: str = "eval", server=None) -> dict:
    """``{prefix}_reward``, ``{prefix}_acc`` (and ``/<data source>`` of each), ``{prefix}_completion_length`` and
    ``{prefix}_seconds`` of greedy-or-sampled completions (``sampling``, seeded by ``args.seed``) of ``rows`` (RL
    rows: prompt messages, ground_truth, data_source, extra_info), decoded by ``server`` (default: in-process)."""
    accelerator = trainer.accelerator
    mine = rows[accelerator.process_index::accelerator.num_processes]
    start, scored = time.perf_counter(), []
    server = server or InProcessEngine(trainer.processing_class, trainer.family, batch_size)
    with eval_policy(trainer) as policy, trainer.compute_loss_context_manager(), \
            server.serving(policy, trainer.state.global_step) as engine:
        if mine:
            rollout = engine.generate([pictured_prompt(r) for r in mine], 1, sampling, seed=trainer.args.seed)
    if mine:
        results = rewards.score(rollout.texts, mine, workers)
        lengths = rollout.completion_mask.sum(-1).tolist()
        scored = [(r["data_source"], res.score, res.acc, n) for r, res, n in zip(mine, results, lengths, strict=True)]
    scored = [s for part in gather_object([scored]) for s in part]
    metrics = {f"{prefix}_seconds": round(time.perf_counter() - start, 3)}
    for source in [None, *sorted({s[0] for s in scored})]:
        pick = [s for s in scored if source is None or s[0] == source]
        tag = "" if source is None else f"/{source}"
        metrics[f"{prefix}_reward{tag}"] = sum(s[1] for s in pick) / len(pick)
        metrics[f"{prefix}_acc{tag}"] = sum(s[2] for s in pick) / len(pick)
    metrics[f"{prefix}_completion_length"] = sum(s[3] for s in scored) / len(scored)
    return metrics
