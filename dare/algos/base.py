"""The plug-in contract of an RL algorithm, with plain GRPO on a per-token likelihood estimate as its behaviour.

Every hook is a function of its arguments: ``family`` (the trainer's scoring passes may hand a packed or
sequence-parallel wrapper of it) and ``sampling`` (the rollout's decoding, as ``rollout_sampling`` returned it)
included; no hook keeps state for another. The trainer (``dare.trainers.rl``) runs one step as: ``rollout`` ->
rewards -> ``make_batch`` (training rows; by default one per completion with its ``advantages``) -> ``corrupt`` for
each inner iteration (noise, stored and shared by the old / reference / current policy) -> old and reference
``score`` without gradients (only when needed) -> for every mini-batch, micro-batch and each of its ``streams``:
``step_loss`` -> backward. Streams split one micro-batch's loss into pieces backpropagated one at a time (an MC
sample, a position): memory stays that of one piece, and the sum is the unstreamed loss. An algorithm file
subclasses :class:`Algorithm` and overrides only the hooks where it differs; its dataclass fields are its knobs
(``--algo-config.*`` flags, the ``algo_config:`` section of a recipe).
"""

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..config import check_choices, one_of
from ..likelihood import Estimate, Trajectory, decoding_path, rollout_attention
from ..sampling import SamplingConfig
from .core import clipped_token_loss, group_advantages, kl_estimate, masked_stats, token_mean

ADVANTAGES = ("drgrpo", "grpo", "rloo")
LOSS_MASKS = ("all", "upto_first_eos")
KL_ESTIMATORS = ("abs", "k1", "k2", "k3")
KL_TARGETS = ("reference", "rollout")
Advantage, LossMask, KL = one_of(*ADVANTAGES), one_of(*LOSS_MASKS), one_of(*KL_ESTIMATORS)


NOISE_WHY = ("its noise is uniform random tokens and the algorithm's likelihood estimate is derived for masked "
             "diffusion (masked-token counts, mask-token states or a masked sampler's trajectory); on uniform noise "
             "run d1, wd1 or gdpo (one-step mean-field, quadrature ELBO)")
CAUSAL_WHY = ("it decodes each block against a causal context (the committed tokens read left to right, later blocks "
              "not there yet, dare/sampling/causal.py), so the masked sampler's step records, canvases and resumable "
              "decodings that the algorithm reads do not describe its decoding")


class Declared:
    """What the registry, the algorithm matrix and ``train_rl.py`` read of every algorithm, online or offline."""

    name: ClassVar[str] = ""
    families: ClassVar[tuple[str, ...] | None] = None  # the families the math allows (None: every family)
    why_not: ClassVar[str] = ""  # why the other families are excluded (shown in the error)
    noises: ClassVar[tuple[str, ...]] = ("mask",)  # the forward processes its estimator is derived for (Family.noise)
    # (mask: every estimator; uniform: MeanField and QuadratureElbo, dare.likelihood)
    trainer: ClassVar[str] = "rl"  # what trains it: rl (rollouts and rewards) | preference (fixed pairs, no rollout)
    uses_ratio: ClassVar[bool] = True  # the loss compares with the rollout policy (old log-probs needed when mu > 1)
    needs_sampler: ClassVar[str] = ""  # what the rollout needs from DARE's own samplers (Engine.own_samplers)
    needs_steps: ClassVar[str] = ""  # why it reads the step that committed each token (Engine.records_steps)
    whole_groups: ClassVar[str] = ""  # why a rollout's prompt groups cannot be dropped one by one ("": they can)

    @classmethod
    def supports(cls, family_name: str) -> bool:
        """Whether the math allows the family of that name (its noise, then the family list)."""
        from ..models.family import CAUSAL_CONTEXT, UNIFORM  # here: --help imports this module (transformers)

        noise = "uniform" if family_name in UNIFORM else "mask"
        causal = family_name in CAUSAL_CONTEXT and bool(cls.needs_steps or cls.needs_sampler)
        return noise in cls.noises and not causal and (cls.families is None or family_name in cls.families)

    def check_family(self, family) -> None:
        if family.noise not in self.noises:
            raise ValueError(f"{self.name} does not apply to {family.name}: {NOISE_WHY}")
        if family.causal_block is not None and (self.needs_steps or self.needs_sampler):
            raise ValueError(f"{self.name} does not apply to {family.name}: {CAUSAL_WHY} ({self.name} needs "
                             f"{self.needs_sampler or self.needs_steps.removeprefix('it ')})")
        if self.families is not None and family.name not in self.families:
            raise ValueError(f"{self.name} does not apply to {family.name} ({self.why_not}); it supports: "
                             f"{', '.join(self.families)}")

    def check_engine(self, engine) -> None:
        """Refuse a rollout engine (an ``Engine`` class) that cannot give what the algorithm reads of a rollout."""
        if self.needs_sampler and not engine.own_samplers:
            raise ValueError(f"rollout-engine {engine.name}: {self.name} needs {self.needs_sampler}, which only DARE's "
                             "own samplers provide; use --rollout-engine hf")
        if self.needs_steps and not engine.records_steps:
            raise ValueError(f"rollout-engine {engine.name}: {self.name} needs the step at which each token was "
                             f"decoded ({self.needs_steps}), which this engine does not record; use --rollout-engine "
                             "hf")


def joined(parts: list[dict], *keys: str) -> dict:
    """The whole rollout batch's ``keys`` from its micro-batch pieces (``after_scoring``'s ``parts``, in row order)."""
    return {key: torch.cat([part[key] for part in parts]) for key in keys}


def split_into(parts: list[dict], **values: torch.Tensor) -> None:
    """Each whole-batch tensor of ``values`` cut back into ``parts`` along the rows (``joined``'s inverse)."""
    rows = [len(part["loss_mask"]) for part in parts]
    for name, value in values.items():
        for part, piece in zip(parts, value.split(rows), strict=True):
            part[name] = piece


DYNAMIC_SAMPLING = ("off", "pad", "resample", "drop")
SIGNAL_RULES = ("spread", "mixed", "accuracy")


@dataclass
class DynamicSampling:
    """Which rollout groups train (DAPO's dynamic sampling, DiRL's resampling, TraceRL's accuracy filter). A group has a
    signal when its rewards are not all equal (``keep: spread``: otherwise every advantage is 0), when some of its
    answers are right and some wrong (``keep: mixed``, DiRL's rule), or when its accuracy lies in ``[low, high]``
    (``keep: accuracy``, TraceRL's). ``off``: every group trains. ``resample``: while the step has fewer groups with a
    signal than prompts, roll out ``extra`` x its prompts more (new prompts each round, at most ``rounds`` rounds: DiRL
    has no cap, which never ends on a task the policy always fails), then train on the first groups with a signal (the
    step's own prompts first; DiRL keeps a random subset), filled up with groups without one when the rounds ran out.
    ``pad``: one extra round of ``extra`` x the prompts, rolled out with the step's own, filled up likewise. ``drop``:
    no refill; the groups without a signal leave the loss (advantages and loss tokens 0: the batch trains on fewer
    groups). Logged: ``rollout/groups_dropped``, ``groups_without_signal``, ``dynamic_rounds``."""

    mode: one_of(*DYNAMIC_SAMPLING) = "off"  # off | pad | resample | drop (see above)
    # spread: the group's rewards differ | mixed: 0 < accuracy < 1 | accuracy: in [low, high]
    keep: one_of(*SIGNAL_RULES) = "spread"
    low: float = 0.2  # keep: accuracy, the least accuracy kept (TraceRL: 0.2)
    high: float = 0.8  # keep: accuracy, the largest kept (TraceRL: 0.8)
    extra: float = 1.0  # prompts of each extra round, a fraction of the step's (pad: the one round)
    rounds: int = 5  # resample: extra rounds at most

    def validate(self) -> None:
        check_choices(self, "dynamic_sampling.")
        if not 0 <= self.low <= self.high <= 1 or not self.extra > 0 or self.rounds < 1:
            raise ValueError(f"dynamic_sampling needs 0 <= low <= high <= 1, extra > 0 and rounds >= 1; got "
                             f"{self.low}, {self.high}, {self.extra}, {self.rounds}")

    def signal(self, scores: torch.Tensor, accuracy: torch.Tensor, group_size: int) -> torch.Tensor:
        """``[groups]`` bool: the groups with a signal, from per-completion scores and accuracies (prompt-major)."""
        if self.keep == "spread":
            spread = scores.view(-1, group_size)
            return spread.max(-1).values > spread.min(-1).values
        share = accuracy.double().view(-1, group_size).mean(-1)
        if self.keep == "mixed":
            return (share > 0) & (share < 1)
        return (share >= self.low) & (share <= self.high)


@dataclass
class ValueSettings:
    """A value model beside the policy (``dare/trainers/value.py``): its own network, AdamW, checkpoint and export.
    An algorithm that can use one has a ``value: ValueSettings`` field and the ``value_targets`` / ``value_loss``
    hooks; setting ``model`` switches it on."""

    # "": none | policy: a copy of the policy's start whose LM head is replaced by a zeroed one-output head (TraceRL)
    # | a hub name or folder of the same family and tokenizer (its head replaced likewise)
    model: str = ""
    learning_rate: float = 5e-6  # its AdamW's (TraceRL: 5e-6, constant, no weight decay)
    clip: float = 0.2  # PPO value clip around the rollout-time prediction (0: off)
    max_grad_norm: float = 1.0  # clip its global gradient norm (0: off)


@dataclass
class Algorithm(Declared):
    """GRPO-family defaults (DARE's generic recipe values)."""

    num_iterations: int = 1  # mu: passes over each rollout batch (old log-probs come from the rollout policy)
    mini_batches: int = 1  # optimiser steps per pass, each on 1/M of the rollout (verl's ppo_mini_batch_size)
    resample_noise: bool = True  # draw new noise for each inner iteration (papers) instead of once per rollout (DARE)
    eps_low: float = 0.2  # PPO clip: ratio floor 1 - eps_low
    eps_high: float = 0.2  # PPO clip: ratio ceiling 1 + eps_high
    dual_clip: float | None = 3.0  # verl's dual clip c for A < 0 (None: off); inactive when num_iterations = 1
    beta: float = 0.0  # KL weight (0: no KL term, no reference model kept)
    kl: KL = "k3"  # KL estimator: k1 | abs | k2 | k3
    # reference: KL to the frozen start | rollout: to the policy that decoded the batch (TraceRL's code; no reference
    # model: 0 on an on-policy pass, it holds the inner steps near the rollout policy)
    kl_to: one_of(*KL_TARGETS) = "reference"
    advantage: Advantage = "grpo"  # grpo (r - mean) / std | drgrpo r - mean | rloo leave-one-out
    loss_mask: LossMask = "upto_first_eos"  # train on tokens up to and including the first stop, or "all" the canvas
    # which rollout groups train and how the step is refilled (off | pad | resample | drop; DynamicSampling)
    dynamic_sampling: DynamicSampling = field(default_factory=DynamicSampling)

    own_advantages: ClassVar[tuple[str, ...]] = ()  # advantage names an algorithm computes itself (MDPO, d-TreeRPO)
    objective: ClassVar[str] = ""  # the loss in LaTeX (markdown with $...$), shown on the algorithm's docs page

    def validate(self, family) -> "Algorithm":
        """Refuse knobs that do not fit (each other or ``family``); returns the algorithm."""
        self.check_family(family)
        if self.num_iterations < 1 or self.mini_batches < 1:
            raise ValueError(f"num_iterations and mini_batches must be >= 1, got {self.num_iterations}, "
                             f"{self.mini_batches}")
        if self.eps_low < 0 or self.eps_high < 0:
            raise ValueError(f"clip epsilons must be >= 0, got {self.eps_low}, {self.eps_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (or None), got {self.dual_clip}")
        check_choices(self)
        if self.kl_to == "rollout" and not self.uses_ratio:
            raise ValueError(f"kl_to rollout measures the KL to the rollout policy's log-probs; {self.name} scores "
                             "none (no ratio): use kl_to reference")
        self.dynamic_sampling.validate()
        return self

    def check_dynamic_sampling(self, sampling=None) -> None:
        """Refuse dropping and refilling prompt groups where the rollout ties them together."""
        mode = self.dynamic_sampling.mode
        if mode == "off":
            return
        if self.whole_groups:
            raise ValueError(f"dynamic sampling cannot drop {self.name}'s groups one by one: {self.whole_groups}")
        if mode == "drop" and self.own_advantages:
            raise ValueError(f"dynamic_sampling.mode drop leaves groups out of the loss by their advantages and loss "
                             f"tokens; {self.name} weighs its rows itself: use pad, resample or off")
        if mode == "resample" and sampling is not None and sampling.record_states:
            raise ValueError(f"dynamic_sampling.mode resample joins rollouts of several rounds; {self.name}'s rollout "
                             "records every step's canvas, which cannot be joined: use pad or off")

    # -- plan: what one run of the algorithm is, fixed before the first rollout -----------------------------------
    def rollout_sampling(self, family, config: SamplingConfig) -> SamplingConfig:
        """The decoding the rollout needs (e.g. recorded states), refused where it cannot; default: ``config``."""
        return config

    def streams(self, family, sampling: SamplingConfig) -> int:
        """Backward passes per micro-batch (see the module docstring), known before the rollout."""
        return 1

    def estimator(self, family, sampling: SamplingConfig):
        raise NotImplementedError(f"{type(self).__name__} must choose a likelihood estimator")

    # -- rollout ------------------------------------------------------------------------------------------------
    def rollout(self, engine, prompts: list, n: int, sampling: SamplingConfig, seed: int, *, rows=None, score=None):
        """``n`` completions of each prompt. ``rows``: the prompts' data rows (ground truth, reference solution);
        ``score(texts, picks)``: the rewards (``RewardResult``) of ``texts`` as completions of expanded rows
        ``picks`` (row ``i * n + k`` is sample k of prompt i), for algorithms that decide on rewards mid-rollout."""
        return engine.generate(prompts, n, sampling, seed)

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, self.advantage)

    def make_batch(self, family, rollout, rewards: torch.Tensor, group_size: int, reward_of, step: int,
                   sampling: SamplingConfig) -> dict:
        """The training rows of one rollout (every tensor's first dimension is the row; the trainer splits them
        into micro-batches). ``rewards`` are the completions' scores; ``reward_of(ids, rows)`` scores other token
        sequences ``[M, R]`` as completions of rollout rows ``rows`` (intermediate predictions); ``step`` is the
        optimiser step of the rollout (for schedules). Default: one row per completion."""
        return {"prompt_ids": rollout.prompt_ids, "prompt_mask": rollout.prompt_mask,
                "completion_ids": rollout.completion_ids, "completion_mask": rollout.completion_mask,
                "loss_mask": self.loss_mask_for(family, rollout), "advantages": self.advantages(rewards, group_size)}

    def loss_mask_for(self, family, rollout) -> torch.Tensor:
        """``upto_first_eos``: the rollout's completion mask; ``all``: every completion position the model attends
        (the whole canvas for masked diffusion, EOS tail included)."""
        if self.loss_mask == "upto_first_eos":
            return rollout.completion_mask
        return rollout_attention(family, rollout.prompt_mask, rollout.completion_mask)[:, rollout.prompt_ids.shape[1]:]

    # -- likelihood ---------------------------------------------------------------------------------------------
    def corrupt(self, family, batch: dict, generator: torch.Generator, sampling: SamplingConfig,
                iteration: int = 0) -> dict:
        """The noise of inner iteration ``iteration`` (each drawn afresh with ``resample_noise``)."""
        return self.estimator(family, sampling).corrupt(family, batch, generator)

    def score(self, model, family, batch: dict, noise: dict, sampling: SamplingConfig) -> Estimate:
        return self.estimator(family, sampling).score(model, family, batch, noise)

    # -- objective ----------------------------------------------------------------------------------------------
    def step_loss(self, model, family, batch: dict, slot: int, stream: int, normaliser: torch.Tensor,
                  sampling: SamplingConfig):
        """The loss of one micro-step: micro-batch ``batch``, noise ``slot`` (inner iteration), ``stream``.
        Old log-probs default to the detached current ones (the on-policy first pass: ratio exactly 1)."""
        estimate = self.score(model, family, batch, batch["noise"][slot], sampling)
        old = batch["old"][slot] if "old" in batch else estimate.logp.detach()
        ref = batch["ref"][slot] if "ref" in batch else None
        return self.loss(estimate, batch, old, ref, normaliser)

    @property
    def cycle(self) -> int:
        """Optimiser steps per rollout batch."""
        return self.num_iterations * self.mini_batches

    @property
    def needs_old(self) -> bool:
        """Score the rollout policy's log-likelihoods (``batch["old"]``) before training: a ratio with inner steps."""
        return self.cycle > 1 and self.uses_ratio

    @property
    def needs_reference(self) -> bool:
        """Keep the frozen reference and score it (``batch["ref"]``) before training: a KL term."""
        return bool(self.beta) and self.kl_to == "reference"

    @property
    def needs_value(self) -> bool:
        """A value model is kept beside the policy (an algorithm with a ``value`` field whose ``model`` is set)."""
        value = getattr(self, "value", None)
        return isinstance(value, ValueSettings) and bool(value.model)

    def value_targets(self, model, family, parts: list[dict], group_size: int, sampling: SamplingConfig) -> None:
        """With the value model ``model`` (called without gradients), set each part's advantages and what
        ``value_loss`` reads (its rows in order, as ``after_scoring``'s)."""
        raise NotImplementedError(f"{self.name} has no value model")

    def value_loss(self, model, family, batch: dict, stream: int, normaliser: torch.Tensor,
                   sampling: SamplingConfig):
        """The value model's loss on one micro-batch and stream (``streams`` of them), averaged by ``normaliser``
        (the rollout batch's loss tokens, all ranks), and its ``{metric: (sum, count)}``."""
        raise NotImplementedError(f"{self.name} has no value model")

    def after_scoring(self, parts: list[dict], group_size: int) -> None:
        """Called once per rollout batch after the old and reference scoring, with its micro-batch pieces (in row
        order; ``torch.cat`` of a key gives the whole batch): an algorithm whose training weights come from those
        scores (DMPO) sets them here. Default: nothing."""

    def normaliser(self, family, batch: dict, sampling: SamplingConfig) -> torch.Tensor:
        """What the loss is averaged over: a count (scalar, or a vector of several counts) that adds up over rows;
        the trainer sums it over each mini-batch on every rank. Default: loss tokens."""
        return batch["loss_mask"].sum()

    def loss(self, estimate: Estimate, batch: dict, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
             normaliser: torch.Tensor):
        """Token-level clipped surrogate (+ beta * KL). Returns the loss and ``{metric: (sum, count)}``."""
        mask = batch["loss_mask"]
        per_token, stats = self.surrogate(estimate.logp, old_logp, batch["advantages"], ref_logp, estimate.entropy)
        return token_mean(per_token, mask, normaliser), masked_stats(stats, mask)

    def surrogate(self, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                  ref_logp: torch.Tensor | None = None, entropy: torch.Tensor | None = None, scale=1.0):
        """Per token: ``scale x`` the clipped ratio loss ``+ beta x KL`` to the reference, and the statistics
        (clip fraction, ratio, entropy when given, KL with beta) for ``masked_stats``."""
        per_token, engaged = clipped_token_loss(logp, old_logp, advantages, self.eps_low, self.eps_high,
                                                self.dual_clip)
        if self.kl_to == "rollout":
            ref_logp = old_logp
        per_token = per_token * scale
        stats = {"clip_fraction": engaged, "ratio": torch.exp(logp.detach() - old_logp)}
        if entropy is not None:
            stats["entropy"] = entropy
        if self.beta:
            kl = kl_estimate(logp, ref_logp, self.kl)
            per_token = per_token + self.beta * kl
            stats["kl"] = kl.detach()
        return per_token, stats


@dataclass
class SequenceLevel(Algorithm):
    """An algorithm whose loss is a function of one value per sequence (an ELBO averaged over Monte-Carlo draws).
    Streamed exactly with the proxy gradient: the first stream evaluates the value of every draw without a graph
    and takes ``g = d loss / d value``; stream j then backpropagates ``value_j . g / draws`` (the value is linear
    in the draws). Exact when the forward is deterministic (no dropout)."""

    stream: bool = True  # one draw per backward (memory of one graph); False: all draws in one graph

    def draws(self, family, sampling: SamplingConfig) -> int:
        return self.estimator(family, sampling).samples

    def streams(self, family, sampling: SamplingConfig) -> int:
        return self.draws(family, sampling) if self.stream else 1

    def normaliser(self, family, batch: dict, sampling: SamplingConfig) -> torch.Tensor:
        """Sequences with at least one loss token."""
        return (batch["loss_mask"].sum(-1) > 0).sum()

    def sequence_loss(self, value, old, ref, batch) -> tuple[torch.Tensor, dict]:
        """Per-sequence loss ``[N]`` and ``{metric: per-sequence values}``."""
        raise NotImplementedError

    def _objective(self, value, batch, slot, normaliser):
        old = batch["old"][slot].mean(-1) if "old" in batch else value.detach()
        ref = batch["ref"][slot].mean(-1) if "ref" in batch else None
        if self.kl_to == "rollout":
            ref = old
        per_sequence, stats = self.sequence_loss(value, old, ref, batch)
        valid = (batch["loss_mask"].sum(-1) > 0).to(per_sequence.dtype)
        count = valid.sum()
        return ((per_sequence * valid).sum() / normaliser.clamp(min=1),
                {k: ((v.detach().float() * valid).sum(), count) for k, v in stats.items()})

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        noise = batch["noise"][slot]
        if self.streams(family, sampling) == 1:
            value = self.score(model, family, batch, noise, sampling).logp.mean(-1)
            return self._objective(value, batch, slot, normaliser)
        if stream == 0:
            with torch.no_grad():
                value = self.score(model, family, batch, noise, sampling).logp.mean(-1)
            leaf = value.detach().requires_grad_()
            with torch.enable_grad():
                objective, stats = self._objective(leaf, batch, slot, normaliser)
                batch["proxy_grad"] = torch.autograd.grad(objective, leaf)[0]
            stats["objective"] = (objective.detach() * normaliser, normaliser)
        else:
            stats = {}
        draw = self.estimator(family, sampling).score(model, family, batch, noise, draw=stream).logp[:, 0]
        return (draw * batch["proxy_grad"]).sum() / self.draws(family, sampling), stats


@dataclass
class StepGroups(Algorithm):
    """An algorithm on the rollout's recorded decoding path whose tokens are scored from the canvas at the start of
    their step's group (the tokens of earlier groups visible, the rest masked): one forward per group, streamed, the
    token-level clipped surrogate averaged over the batch's loss tokens. A subclass says how steps form groups
    (``groups``) and how many there are (``streams``)."""

    needs_steps: ClassVar[str] = "it replays the decoding trajectory"

    def rollout_sampling(self, family, config):
        if config.editing_threshold is not None:
            raise ValueError(f"{self.name} replays first-unmask steps; LLaDA2.1 editing overwrites decoded tokens, "
                             "which a step map cannot replay (unset editing_threshold)")
        return config

    def groups(self, steps: torch.Tensor, family, sampling) -> torch.Tensor:
        """The group of each recorded step (``steps``: global steps for masked families, block-local for block
        ones; -1 stays -1), numbered from 0 to ``streams - 1``."""
        raise NotImplementedError

    def estimator(self, family, sampling):
        return Trajectory(self.streams(family, sampling))

    def make_batch(self, family, rollout, rewards, group_size, reward_of, step, sampling):
        batch = super().make_batch(family, rollout, rewards, group_size, reward_of, step, sampling)
        ids, steps, loss_mask = decoding_path(family, rollout, self.loss_mask == "upto_first_eos")
        groups = self.groups(steps, family, sampling)
        batch.update(completion_ids=ids, completion_mask=(steps >= 0).long(), steps=groups, loss_mask=loss_mask)
        return batch

    def group_surrogate(self, model, family, batch, slot, stream, sampling):
        """``(per_token, target, stats)`` of group ``stream``: the clipped surrogate of every position scored from the
        group's starting canvas, the group's loss tokens, and their statistics."""
        # a forward even without targets: every rank runs the same number of graphs
        est = self.estimator(family, sampling).score(model, family, batch, {}, step=stream)
        target = (batch["steps"] == stream) & batch["loss_mask"].bool()
        old = batch["old"][slot] if "old" in batch else est.logp.detach()
        ref = batch["ref"][slot] if "ref" in batch else None
        per_token, stats = self.surrogate(est.logp, old, batch["advantages"], ref, est.entropy)
        return per_token, target, masked_stats(stats, target)

    def step_loss(self, model, family, batch, slot, stream, normaliser, sampling):
        per_token, target, stats = self.group_surrogate(model, family, batch, slot, stream, sampling)
        return (per_token * target).sum() / normaliser.clamp(min=1), stats
