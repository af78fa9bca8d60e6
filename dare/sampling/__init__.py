"""Generation for every family: masked diffusion (LLaDA, Dream; semi-autoregressive blocks, Fast-dLLM prefix/dual
cache, confidence-threshold parallel decoding) and block diffusion (SDAR, LLaDA2; block-wise KV cache, static or
dynamic unmasking). Every sampler returns the trajectory (the step at which each token was fixed).

    out = generate(model, family, prompt_ids, prompt_mask, SamplingConfig(gen_length=256, steps=256))
"""

from dataclasses import asdict, dataclass, field, replace

import torch

from .primitives import CONFIDENCE, THRESHOLD_RULES

PROBABILITIES = ("low_confidence", "maskgit_plus", "margin")  # confidences that are probabilities
ENGINES = ("hf", "sglang")


@dataclass
class SamplingConfig:
    """Decoding knobs. ``steps``/``block_length`` default per family: masked diffusion = one step per token over
    one block of ``gen_length``; block diffusion = the model's block size and one step per block token."""

    gen_length: int = 128  # tokens to generate per prompt
    block_length: int | None = None  # masked: semi-AR block (divides gen_length); block families: model block size
    steps: int | None = None  # masked: total denoising steps; block families: steps per block
    temperature: float = 0.0  # 0 = greedy; else Gumbel-max sampling in float64
    top_k: int | None = None  # sample among the k most likely tokens (None = all)
    top_p: float | None = None  # nucleus sampling: the smallest set of tokens with this much probability (None = all)
    remasking: str | None = None  # confidence used to pick positions (CONFIDENCE, + "origin" for Dream); None = family's
    schedule: str | None = None  # tokens per step: "linear" (LLaDA even split), "dream" (floor(m*(1-s/t))) or "ascending" (2^j, CJ-GRPO's ASS; default steps log2(block+1)); None = family's
    eps: float = 1e-3  # Dream schedule: final noise level of linspace(1, eps, steps+1)
    alg_temp: float | None = None  # Dream: sample positions from softmax(conf/alg_temp) instead of top-n
    threshold: float | None = None  # parallel decoding: commit the positions threshold_rule admits (a probability; Dream then uses maskgit_plus)
    threshold_rule: str | None = None  # "one": all >= threshold, at least one | "schedule": all > threshold if the step's count pass, else the top count | "quota": top (share + carried), first always, rest if >= threshold; None = family's official (LLaDA one, Dream quota, SDAR/LLaDA2 schedule)
    factor: float | None = None  # Fast-dLLM dynamic parallel decoding: commit c_n >= 1 - factor/(n+1)
    cache: str | None = None  # masked: "none" (default), "prefix" or "dual" (Fast-dLLM); block: "block" (default) or "none"
    editing_threshold: float | None = None  # block families: LLaDA2.1 editing, overwrite decoded tokens above it
    max_post_steps: int = 16  # LLaDA2.1 editing: refinement steps after a block has no masks left
    cfg_scale: float = 0.0  # classifier-free guidance (masked diffusion, cache "none")
    suppress_eos: bool = False  # never propose EOS (LLaDA's logits_eos_inf)
    stop_at_eos: bool = True  # block families: a sequence is finished after the block holding its first stop token (EOS or turn end); tokens after it are padding
    eos_early_rejection: float | None = None  # CJ-GRPO's EOSER: EOS confidence x gamma rising from this to 1 over the steps
    engine: str = "hf"  # what decodes: hf (DARE's samplers in-process, every family) | sglang (SGLang's dLLM engine: block families, README "SGLang")
    record_states: bool = False  # also return the canvas after every step (masked families without cache: + each step's whole-canvas prediction and its probability, MDPO)

    def resolve(self, family) -> "SamplingConfig":
        """A copy with the family's defaults filled in (Dream: its linspace schedule and entropy confidence; with a
        threshold the confidence must be a probability: Dream's official confidence_threshold uses maskgit_plus)."""
        remasking = self.remasking or family.remasking
        if self.threshold is not None and not self.remasking and remasking not in PROBABILITIES:
            remasking = "maskgit_plus"
        return replace(self, schedule=self.schedule or family.schedule, remasking=remasking,
                       threshold_rule=self.threshold_rule or family.threshold_rule)

    def validate(self):
        known = sorted([*CONFIDENCE, "origin"])
        if self.remasking not in known:
            raise ValueError(f"Unknown remasking algorithm {self.remasking!r}; known: {known}")
        if self.schedule not in ("linear", "dream", "ascending"):
            raise ValueError(f"Unknown schedule {self.schedule!r}; known: ['ascending', 'dream', 'linear']")
        if self.eos_early_rejection is not None:
            if not 0 < self.eos_early_rejection <= 1:
                raise ValueError(f"eos_early_rejection must be in (0, 1], got {self.eos_early_rejection}")
            if self.remasking not in PROBABILITIES:
                raise ValueError("eos_early_rejection scales a probability confidence: use remasking "
                                 f"low_confidence, maskgit_plus or margin (got {self.remasking!r})")
        if self.engine not in ENGINES:
            raise ValueError(f"Unknown engine {self.engine!r}; known: {list(ENGINES)}")
        if self.cache not in (None, "none", "prefix", "dual", "block"):
            raise ValueError(f"Unknown cache {self.cache!r}; known: ['block', 'dual', 'none', 'prefix']")
        if self.threshold_rule not in THRESHOLD_RULES:
            raise ValueError(f"Unknown threshold_rule {self.threshold_rule!r}; known: {sorted(THRESHOLD_RULES)}")
        if self.gen_length <= 0:
            raise ValueError(f"gen_length must be positive, got {self.gen_length}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
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
        import warnings

        from .block import plan_block
        from .masked import plan_masked
        try:
            cfg = self.resolve(family).validate()
            (plan_block if family.is_block_diffusion else plan_masked)(cfg, family)
            if cfg.engine == "sglang":
                from ..engines.sglang import check_sglang
                check_sglang(cfg, family)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        total = prompt_length + cfg.gen_length
        if family.is_block_diffusion:
            block = family.block_size
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
    steps: int | None = None  # masked: total denoising steps; block families: steps per block
    block_length: int | None = None  # masked: semi-AR block length
    threshold: float | None = None  # parallel decoding confidence threshold
    top_p: float | None = None  # nucleus sampling (1.0 = off)
    top_k: int | None = None  # top-k sampling
    remasking: str | None = None  # confidence that picks positions
    cache: str | None = None  # masked: none | prefix | dual; block: block | none

    def over(self, base: SamplingConfig) -> SamplingConfig:
        return replace(base, **{k: v for k, v in asdict(self).items() if v is not None})


def step_budget(config: SamplingConfig, family) -> int:
    """The most denoising steps a decoding with ``config`` can take: in total for masked families, per block for
    block families (threshold decoding commits at least one token per step)."""
    from .primitives import ascending_steps
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

    @property
    def lengths(self) -> torch.Tensor:
        return (self.step_map >= 0).sum(-1)


def generate(model, family, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor | None = None,
             config: SamplingConfig | None = None, generator: torch.Generator | None = None,
             canvas: torch.Tensor | None = None, from_step: int = 0, to_step: int | None = None) -> Generation:
    """Decode ``gen_length`` tokens after each (left-padded) prompt with the family's sampler. A decoding with a
    fixed schedule can be resumed: ``canvas`` is the generated region so far (masks where undecoded) and only the
    scheduled steps ``from_step .. to_step - 1`` run (tree rollouts; ``schedule_length`` counts the steps)."""
    from ..models.family import max_positions  # here, not at the top: --help imports this module
    from .block import generate_block
    from .masked import generate_masked
    config = (config or SamplingConfig()).check(family, "sampling", prompt_ids.shape[1],
                                                max_positions(getattr(model, "config", None)))
    if prompt_mask is None:
        prompt_mask = torch.ones_like(prompt_ids)
    if bool((prompt_mask[:, 1:] < prompt_mask[:, :-1]).any()):
        raise ValueError("Prompts must be left-padded (padding before the prompt, generation follows it); got "
                         "right padding. With apply_chat_template pass tokenizer_kwargs={'padding_side': 'left'}.")
    with torch.no_grad():
        if canvas is not None and canvas.shape != (prompt_ids.shape[0], config.gen_length):
            raise ValueError(f"canvas must be [{prompt_ids.shape[0]}, {config.gen_length}], got {tuple(canvas.shape)}")
        if family.is_block_diffusion:
            return generate_block(model, family, prompt_ids, prompt_mask.long(), config, generator, canvas,
                                  from_step, to_step)
        return generate_masked(model, family, prompt_ids, prompt_mask.long(), config, generator, canvas, from_step,
                               to_step)


__all__ = ["Generation", "SamplingConfig", "SamplingOverrides", "generate", "schedule_length", "step_budget"]
