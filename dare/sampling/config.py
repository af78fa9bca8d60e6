"""What a decoding is asked (``SamplingConfig``, ``SamplingOverrides``), what each family's sampler plans for it
(``plan_masked``, ``plan_block``: every refusal raised before any model runs, step counts) and what it returns
(``Generation``)."""

import warnings
from dataclasses import asdict, dataclass, field, replace

import torch

from ..config import check_choices, one_of
from .primitives import CONFIDENCE, THRESHOLD_RULES, ascending_steps

Remasking = one_of(*sorted([*CONFIDENCE, "origin"]), optional=True)
Cache = one_of("none", "prefix", "dual", "block", optional=True)

PROBABILITIES = ("low_confidence", "maskgit_plus", "margin")  # confidences that are probabilities
# The fastest decoding that kept its quality in DARE's measurements (docs/benchmarks.md, "The rollout's share of an RL
# step"):
# masked families the Fast-dLLM dual cache with dInfer's vicinity refresh and confidence threshold 0.7, block families
# their block cache with threshold 0.9. A choice for a run to make (``fast_decoding``): threshold decoding samples
# another trajectory distribution than the reference's one token per step.
FAST_DECODING = {"masked": dict(cache="dual", vicinity=16, threshold=0.7), "block": dict(cache="block", threshold=0.9)}


@dataclass
class SamplingConfig:
    """Decoding knobs. ``steps``/``block_length`` default per family: masked diffusion = one step per token over
    one block of ``gen_length``; block diffusion = the model's block size and one step per block token."""

    gen_length: int = 128  # tokens to generate per prompt
    block_length: int | None = None  # masked: semi-AR block (divides gen_length); block families: model block size
    steps: int | None = None  # masked: total denoising steps; block families: per block; uniform: most per canvas (48)
    temperature: float = 0.0  # 0 = greedy; else Gumbel-max sampling in float64
    top_k: int | None = None  # sample among the k most likely tokens (None = all)
    top_p: float | None = None  # nucleus sampling: the smallest set of tokens with this much probability (None = all)
    # confidence used to pick positions (CONFIDENCE, + "origin" for Dream); None = family's
    remasking: Remasking = None
    # tokens per step: "linear" (LLaDA even split), "dream" (floor(m*(1-s/t))) or "ascending" (2^j, CJ-GRPO's ASS;
    # default steps log2(block+1)); None = family's
    schedule: one_of("linear", "dream", "ascending", optional=True) = None
    eps: float = 1e-3  # Dream schedule: final noise level of linspace(1, eps, steps+1)
    alg_temp: float | None = None  # Dream: sample positions from softmax(conf/alg_temp) instead of top-n
    # parallel decoding: commit the positions threshold_rule admits (a probability; Dream then uses maskgit_plus)
    threshold: float | None = None
    # "one": all >= threshold, at least one | "schedule": all > threshold if the step's count pass, else the top count |
    # "quota": top (share + carried), first always, rest if >= threshold; None = family's official (LLaDA one, Dream
    # quota, SDAR/LLaDA2 schedule)
    threshold_rule: one_of(*sorted(THRESHOLD_RULES), optional=True) = None
    factor: float | None = None  # Fast-dLLM dynamic parallel decoding: commit c_n >= 1 - factor/(n+1)
    # masked: "none" (default), "prefix" or "dual" (Fast-dLLM); block: "block" (default) or "none"
    cache: Cache = None
    # dual cache: also recompute this many positions on each side of the block at every step (dInfer's vicinity
    # refresh: the K/V next to the block, the stalest, are fresh; 0: Fast-dLLM's dual cache)
    vicinity: int = 0
    editing_threshold: float | None = None  # block families: LLaDA2.1 editing, overwrite decoded tokens above it
    max_post_steps: int = 16  # LLaDA2.1 editing: refinement steps after a block has no masks left
    cfg_scale: float = 0.0  # classifier-free guidance (masked diffusion, cache "none")
    # causal-context families (Nemotron-Labs-Diffusion): self-speculation, each block drafted bidirectionally (in one
    # pass, or with a threshold as threshold decoding), verified left to right; the longest agreeing prefix + 1 stays
    speculative: bool = False
    suppress_eos: bool = False  # never propose EOS (LLaDA's logits_eos_inf)
    # block families: a sequence is finished after the block holding its first stop token (EOS or turn end); tokens
    # after it are padding
    stop_at_eos: bool = True
    # CJ-GRPO's EOSER: EOS confidence x gamma rising from this to 1 over the steps
    eos_early_rejection: float | None = None
    entropy_bound: float | None = None  # uniform noise: keep the lowest-entropy proposals, sum-max <= this (None: 0.1)
    t_min: float | None = None  # uniform noise: the last step's temperature (None: 0.4); ``temperature`` scales it
    t_max: float | None = None  # uniform noise: the first step's temperature (None: 0.8); ``temperature`` scales it
    # uniform noise: a canvas stops once its argmax held this many steps (None: 1) ...
    stability_steps: int | None = None
    confidence_stop: float | None = None  # ... and its mean entropy is under this (None: 0.005)
    # also return the canvas after every step (masked families without cache: + each step's whole-canvas prediction and
    # its probability, MDPO)
    record_states: bool = False
    # also return the entropy of the distribution each token was drawn from (tempered, top-k / top-p filtered; AGRPO's
    # entropy-proportional step draws)
    record_entropy: bool = False

    def resolve(self, family) -> "SamplingConfig":
        """A copy with the family's defaults filled in (Dream: its linspace schedule and entropy confidence; with a
        threshold the confidence must be a probability: Dream's official confidence_threshold uses maskgit_plus)."""
        if self.speculative and family.causal_block is None:
            raise ValueError(f"speculative decoding drafts with a bidirectional reading and verifies with a causal one "
                             f"of the same weights: {family.name} has no causal reading (Nemotron-Labs-Diffusion has)")
        remasking = self.remasking or family.remasking
        if self.threshold is not None and not self.remasking and remasking not in PROBABILITIES:
            remasking = "maskgit_plus"
        return replace(self, schedule=self.schedule or family.schedule, remasking=remasking,
                       threshold_rule=self.threshold_rule or family.threshold_rule)

    def validate(self):
        if None in (self.remasking, self.schedule, self.threshold_rule):
            raise ValueError("validate a resolved config: resolve(family) fills remasking, schedule, threshold_rule")
        check_choices(self)
        if self.eos_early_rejection is not None:
            if not 0 < self.eos_early_rejection <= 1:
                raise ValueError(f"eos_early_rejection must be in (0, 1], got {self.eos_early_rejection}")
            if self.remasking not in PROBABILITIES:
                raise ValueError("eos_early_rejection scales a probability confidence: use remasking "
                                 f"low_confidence, maskgit_plus or margin (got {self.remasking!r})")
        if self.gen_length <= 0:
            raise ValueError(f"gen_length must be positive, got {self.gen_length}")
        if not self.temperature >= 0:  # NaN too
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        # knob: (value, lowest, highest, the lowest itself excluded)
        ranges = {"block_length": (self.block_length, 1, None, False), "steps": (self.steps, 1, None, False),
                  "top_k": (self.top_k, 1, None, False), "top_p": (self.top_p, 0, 1, True),
                  "threshold": (self.threshold, 0, None, False), "factor": (self.factor, 0, None, True),
                  "eps": (self.eps, 0, 1, True), "alg_temp": (self.alg_temp, 0, None, True),
                  "editing_threshold": (self.editing_threshold, 0, None, False),
                  "max_post_steps": (self.max_post_steps, 0, None, False),
                  "vicinity": (self.vicinity, 0, None, False),
                  "cfg_scale": (self.cfg_scale, 0, None, False),
                  "entropy_bound": (self.entropy_bound, 0, None, True), "t_min": (self.t_min, 0, None, True),
                  "t_max": (self.t_max, 0, None, True), "stability_steps": (self.stability_steps, 0, None, False),
                  "confidence_stop": (self.confidence_stop, 0, None, True)}
        for knob, (value, low, high, open_low) in ranges.items():
            too_low = value is not None and (not value >= low or (open_low and value == low))  # NaN too
            if too_low or (value is not None and high is not None and value > high):
                bounds = f"{'>' if open_low else '>='} {low}" + (f" and <= {high}" if high is not None else "")
                raise ValueError(f"{knob} must be {bounds}, got {value}")
        if self.threshold is not None and self.factor is not None:
            raise ValueError("Set either threshold or factor, not both.")
        if self.remasking == "origin" and self.schedule != "dream":
            raise ValueError("remasking='origin' (independent per-position flips) needs schedule='dream'")
        return self

    def check(self, family, where: str = "sampling", prompt_length: int = 0,
              max_positions: int | None = None) -> "SamplingConfig":
        """The resolved config, every refusal of the family's sampler raised now, named by ``where`` (before any
        weights load), and the longest sequence it makes with a ``prompt_length``-token prompt checked against the
        model's ``max_positions``."""
        try:
            cfg = self.resolve(family).validate()
            plan_for(family)(cfg, family)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        total = prompt_length + cfg.gen_length
        if family.is_block_diffusion:
            block = family.block_size
            if family.noise == "uniform":  # canvases start after the prompt
                total = prompt_length + -(-cfg.gen_length // block) * block
            else:
                total = -(-total // block) * block  # the last block is decoded whole
            if cfg.gen_length % block:
                warnings.warn(f"{where}: gen_length {cfg.gen_length} is not a multiple of {family.name}'s block size "
                              f"{block}: the last block is decoded whole and the output cut to {cfg.gen_length} "
                              "tokens, as the official sampler does", stacklevel=2)
        if max_positions and total > max_positions:
            raise ValueError(f"{where}: a {prompt_length}-token prompt + gen_length {cfg.gen_length} needs {total} "
                             f"positions, more than the model's {max_positions} (max_position_embeddings); shorten "
                             "the prompts (data.max_prompt_length drops longer ones) or gen_length")
        return cfg


@dataclass
class SamplingOverrides:
    """Validation decoding: the rollout's settings with these replaced (None: as the rollout)."""

    gen_length: int | None = None  # tokens per answer
    temperature: float | None = 0.0  # 0 = greedy (the validation default)
    steps: int | None = None  # masked: total denoising steps; block families: per block; uniform: most per canvas (48)
    block_length: int | None = None  # masked: semi-AR block length
    threshold: float | None = None  # parallel decoding confidence threshold
    top_p: float | None = None  # nucleus sampling (1.0 = off)
    top_k: int | None = None  # top-k sampling
    remasking: Remasking = None  # confidence that picks positions
    cache: Cache = None  # masked: none | prefix | dual; block: block | none
    vicinity: int | None = None  # dual cache: positions recomputed on each side of the block

    def over(self, base: SamplingConfig) -> SamplingConfig:
        return replace(base, **{k: v for k, v in asdict(self).items() if v is not None})


def step_budget(config: SamplingConfig, family) -> int:
    """The most denoising steps a decoding with ``config`` can take: in total for masked families, per block for
    block families (threshold decoding commits at least one token per step)."""
    if family.noise == "uniform":
        return plan_uniform(config, family).steps
    config = config.resolve(family)
    dynamic = config.threshold is not None or config.factor is not None
    if family.is_block_diffusion:
        block = family.block_size
        if dynamic:
            return block
        return config.steps or (ascending_steps(block) if config.schedule == "ascending" else block)
    block = config.block_length or config.gen_length
    if dynamic:
        return config.gen_length
    if config.steps:
        return config.steps
    if config.schedule == "ascending":
        return ascending_steps(block) * (config.gen_length // block)
    return config.gen_length


def fast_decoding(family) -> dict:
    """``FAST_DECODING``'s ``SamplingConfig`` knobs for ``family``'s kind of decoding."""
    if family.noise != "mask":
        raise ValueError(f"{family.name}: no fast decoding for uniform-noise families (FAST_DECODING is for masked "
                         "and block diffusion)")
    return dict(FAST_DECODING["block" if family.is_block_diffusion else "masked"])


def schedule_length(config: SamplingConfig, family) -> int:
    """Scheduled steps of a fixed-schedule decoding of ``gen_length`` tokens, the numbering ``from_step``/``to_step``
    use: masked families' total steps; block families' steps per block times the blocks ``gen_length`` fills (a
    prompt that ends inside a block can add one more block at the end)."""
    if config.threshold is not None or config.factor is not None:
        raise ValueError("a threshold/factor decoding has no fixed step schedule")
    per = step_budget(config, family)
    return per * -(-config.gen_length // family.block_size) if family.is_block_diffusion else per


@dataclass
class Generation:
    """``sequences`` holds the generated region only ``[N, gen_length]``. ``step_map`` is the global step at which
    each token was fixed (block families: the k-th decoded block owns steps ``k * S ..``, S = steps per block, or the
    block size with a threshold) and ``block_step`` the step inside its block (-1: never generated, e.g. after an
    early stop, where the token is padding). ``states[k]`` is the generated region after step k when recorded;
    ``predictions[k]``/``confidences[k]`` the whole-canvas proposal of step k (decoded tokens kept) and the
    probability of each proposed token (0 where not proposed; block families propose for the current block only).
    ``replay_ids``/``replay_step`` (block families, ``[N, gen_length + block - 1]``): every decoded token from the
    first generated position with their block steps, the whole last block and the whole block of the stop token
    included (those tokens were decoded and seen by the other tokens of their block), padding / -1 after."""

    sequences: torch.Tensor
    step_map: torch.Tensor
    block_step: torch.Tensor
    nfe: int = 0  # model forward calls
    states: list[torch.Tensor] = field(default_factory=list)
    predictions: list[torch.Tensor] = field(default_factory=list)
    confidences: list[torch.Tensor] = field(default_factory=list)
    replay_ids: torch.Tensor | None = None
    replay_step: torch.Tensor | None = None
    entropy: torch.Tensor | None = None  # with record_entropy: [N, gen_length], 0 where not generated
    replay_entropy: torch.Tensor | None = None  # block families: the same on the replay view

    @property
    def lengths(self) -> torch.Tensor:
        return (self.step_map >= 0).sum(-1)


def plan_for(family):
    """The planner of ``family``'s sampler."""
    if family.noise == "uniform":
        return plan_uniform
    if family.causal_block is not None:
        return plan_causal
    return plan_block if family.is_block_diffusion else plan_masked


@dataclass(frozen=True)
class UniformPlan:
    steps: int
    entropy_bound: float = 0.1
    t_min: float = 0.4
    t_max: float = 0.8
    stability_steps: int = 1
    confidence_stop: float = 0.005


MASK_ONLY = ("block_length", "threshold", "factor", "alg_temp", "editing_threshold", "eos_early_rejection",
             "top_k", "top_p")  # knobs of the mask samplers that a uniform-noise canvas has no use for


def plan_uniform(cfg, family) -> UniformPlan:
    """The uniform-noise sampler's settings (``dare.sampling.uniform``); every setting it refuses raises here."""
    for knob in MASK_ONLY:
        if getattr(cfg, knob) is not None:
            raise ValueError(f"{family.name} decodes uniformly noised canvases: {knob} applies to the mask samplers "
                             "only (its knobs: steps, temperature, entropy_bound, t_min, t_max, stability_steps, "
                             "confidence_stop)")
    if cfg.cfg_scale or cfg.suppress_eos or not cfg.stop_at_eos:
        raise ValueError(f"{family.name}: cfg_scale, suppress_eos and stop_at_eos=False are not supported by the "
                         "uniform-noise sampler")
    if cfg.cache not in (None, "block") or cfg.vicinity:
        raise ValueError(f"{family.name} always caches its encoder's keys and values: cache must be 'block' (and "
                         "no vicinity)")
    given = {k: getattr(cfg, k) for k in ("entropy_bound", "t_min", "t_max", "stability_steps", "confidence_stop")}
    plan = UniformPlan(cfg.steps or 48, **{k: v for k, v in given.items() if v is not None})
    if plan.t_max <= plan.t_min:
        raise ValueError(f"t_max ({plan.t_max}) must be larger than t_min ({plan.t_min})")
    return plan


def plan_block(cfg, family) -> int:
    """Steps per block of a decoding with ``cfg``; every setting this sampler refuses raises here, before any model
    runs."""
    block = family.block_size
    if cfg.block_length not in (None, block):
        raise ValueError(f"{family.name} attends in blocks of {block}; block_length={cfg.block_length} needs a "
                         "checkpoint trained with that block size (set config.block_size)")
    cache_mode = cfg.cache or "block"
    if cache_mode not in ("block", "none"):
        raise ValueError(f"{family.name} is a block-diffusion family: cache must be 'block' or 'none'")
    if cfg.vicinity:
        raise ValueError(f"{family.name}: vicinity refreshes a masked family's dual cache (a block cache is exact)")
    steps = cfg.steps or (ascending_steps(block) if cfg.schedule == "ascending" else block)
    if steps > block:
        raise ValueError(f"steps per block ({steps}) is larger than the block size ({block})")
    return steps


def plan_masked(cfg, family) -> tuple[int, int]:
    """``(number of semi-AR blocks, total steps)`` of a decoding with ``cfg``; every setting this sampler refuses
    raises here, before any model runs."""
    length = cfg.gen_length
    block = cfg.block_length or length
    cache_mode = cfg.cache or "none"
    if cache_mode == "block":
        raise ValueError(f"{family.name} is a masked-diffusion family: cache must be 'none', 'prefix' or 'dual'")
    if length % block:
        raise ValueError(f"gen_length {length} is not divisible by block_length {block}")
    n_blocks = length // block
    steps = cfg.steps or (ascending_steps(block) * n_blocks if cfg.schedule == "ascending" else length)
    if steps > length:
        raise ValueError(f"steps ({steps}) is larger than the number of tokens to generate ({length})")
    if steps % n_blocks:
        raise ValueError(f"steps ({steps}) must be a multiple of the number of blocks ({n_blocks})")
    if cfg.editing_threshold is not None:
        raise ValueError("editing_threshold (LLaDA2.1 editing) applies to block-diffusion families only")
    if cfg.cfg_scale and cache_mode != "none":
        raise ValueError("classifier-free guidance needs cache='none'")
    if cfg.vicinity and cache_mode != "dual":
        raise ValueError(f"vicinity={cfg.vicinity} refreshes the dual cache around the block: set cache='dual'")
    return n_blocks, steps


def plan_causal(cfg, family) -> tuple[int, int]:
    """``(number of blocks, total steps)`` of a decoding against a causal context (``sampling/causal.py``); every
    setting that sampler refuses raises here, before any model runs."""
    length, block = cfg.gen_length, cfg.block_length or family.causal_block
    if length % block:
        raise ValueError(f"gen_length {length} is not divisible by block_length {block} ({family.name} decodes whole "
                         "blocks against its causal context)")
    if (cfg.cache or "prefix") != "prefix":
        raise ValueError(f"{family.name} denoises each block against the causal cache of what precedes it: cache must "
                         f"be 'prefix' (or unset), got {cfg.cache!r}")
    refused = {"schedule": cfg.schedule not in (None, "linear"), "cfg_scale": bool(cfg.cfg_scale),
               "factor": cfg.speculative and cfg.factor is not None,
               "record_states": cfg.speculative and cfg.record_states,
               "record_entropy": cfg.speculative and cfg.record_entropy,
               "editing_threshold": cfg.editing_threshold is not None, "vicinity": bool(cfg.vicinity),
               "alg_temp": cfg.alg_temp is not None, "eos_early_rejection": cfg.eos_early_rejection is not None}
    if any(refused.values()):
        names = ", ".join(k for k, v in refused.items() if v)
        raise ValueError(f"{family.name}'s causal-context sampler takes no {names} (its blocks commit LLaDA's even "
                         "split of their masks, or a threshold)")
    n_blocks = length // block
    steps = cfg.steps or length
    if steps > length or steps % n_blocks:
        raise ValueError(f"steps ({steps}) must be a multiple of the number of blocks ({n_blocks}) and at most "
                         f"gen_length ({length})")
    if block > 1 and steps // n_blocks < 2 and cfg.threshold is None and cfg.factor is None:
        raise ValueError(f"steps ({steps}) leave one step per block: the first token of a block takes its first step "
                         "and its masks need at least one more")
    return n_blocks, steps
