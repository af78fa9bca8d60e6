"""The engine contract: what every rollout / evaluation backend returns (``Rollout``), the class it subclasses
(``Engine``: its checks, how a script opens it, how a trainer serves the policy through it), the registry scripts
pick engines from by name, and the run-identity hashes an evaluation fingerprint records."""

import hashlib
import json
from dataclasses import dataclass, field, fields, replace
from typing import ClassVar

import torch

from ..data.chat import encode
from ..registry import Registry
from ..sampling.primitives import after_first

COMPLETION_SIDE = ("completion_ids", "completion_mask", "step_map", "block_step", "replay_ids", "replay_step", "given",
                   "entropy", "replay_entropy")


@dataclass
class Rollout:
    """Prompt-major: row ``i * n + k`` is sample k of prompt i. ``completion_mask`` covers the generated tokens up to
    and including the first stop token; ``step_map``/``block_step`` record when each token was fixed (-1: not
    generated). ``texts`` are the completions decoded up to (not including) the first stop token."""

    prompt_ids: torch.Tensor  # [N, P] left-padded
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor  # [N, R]
    completion_mask: torch.Tensor
    step_map: torch.Tensor
    block_step: torch.Tensor
    texts: list[str]
    nfe: int = 0  # model forward calls, summed over micro-batches
    seconds: float = 0.0
    states: list[torch.Tensor] = field(default_factory=list)  # with record_states: the canvas after each step
    predictions: list[torch.Tensor] = field(default_factory=list)  # each step's whole-canvas prediction
    confidences: list[torch.Tensor] = field(default_factory=list)  # probability of each predicted token
    replay_ids: torch.Tensor | None = None  # block families [N, R + block - 1]: decoded tokens, last and stop blocks
    replay_step: torch.Tensor | None = None  # their block-local steps (-1: not decoded)
    records: dict = field(default_factory=dict)  # algorithm-specific rollout records (e.g. a tree's inner nodes)
    given: torch.Tensor | None = None  # [N, R] bool: positions whose token the caller supplied (inpainted hints)
    stats: dict = field(default_factory=dict)  # an algorithm's rollout metrics {name: (sum, count)}, logged
    entropy: torch.Tensor | None = None  # with record_entropy: [N, R] the entropy each token was drawn with
    replay_entropy: torch.Tensor | None = None  # block families: the same on the replay view
    # a family that reads pictures: each row's prompt's pictures (PIL; a prompt's rows share one list), its prompt
    # ids numbering their features from 0 (dare.data.images.batch_pictures renumbers them over a batch)
    pictures: list | None = None
    # what scoring these rows hands the model (the reader's ``wrap``): a drawing's {"codebook": [first, size]}
    reading: dict | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.completion_mask.sum())

    def select(self, rows: list[int]) -> "Rollout":
        """These rows, in this order (forward counts and time stay the whole rollout's: its cost)."""
        if self.records:
            raise ValueError(f"a rollout with records ({', '.join(self.records)}) cannot be cut into rows")
        index = torch.tensor(rows, dtype=torch.long, device=self.prompt_ids.device)
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        tensors = ("prompt_ids", "prompt_mask") + COMPLETION_SIDE
        return replace(self, **{k: pick(getattr(self, k)) for k in tensors}, texts=[self.texts[i] for i in rows],
                       **{k: [pick(t) for t in getattr(self, k)] for k in ("states", "predictions", "confidences")},
                       pictures=None if self.pictures is None else [self.pictures[i] for i in rows])

    def stopped(self, stop_ids) -> torch.Tensor:
        """``[N]`` bool: the completions that reached a stop token (the others were cut off by the length limit); a
        drawing (``reading``: its codes fill the picture) is always whole."""
        if self.reading is not None:
            return torch.ones(len(self.completion_ids), dtype=torch.bool, device=self.completion_ids.device)
        return torch.isin(self.completion_ids, torch.tensor(stop_ids, device=self.completion_ids.device)).any(-1)

    @staticmethod
    def join(parts: list["Rollout"], pad_id: int) -> "Rollout":
        """The rows of several rollouts, one after the other: prompts left-padded to the widest (``pad_id``, mask 0),
        completion-side tensors right-padded (ids ``pad_id``, masks 0, steps -1: never decoded); forward counts, time
        and statistics add up."""
        if len(parts) == 1:
            return parts[0]
        if any(p.states or p.predictions or p.confidences or p.records for p in parts):
            raise ValueError("rollouts with recorded states or records cannot be joined row by row")
        fill = {"completion_ids": pad_id, "replay_ids": pad_id, "step_map": -1, "block_step": -1, "replay_step": -1}

        def cat(name, left=False):
            tensors = [getattr(p, name) for p in parts]
            if any(t is None for t in tensors):
                if name != "given" or all(t is None for t in tensors):
                    return None
                tensors = [torch.zeros(p.completion_ids.shape, dtype=torch.bool, device=p.completion_ids.device)
                           if t is None else t for p, t in zip(parts, tensors, strict=True)]
            width = max(t.shape[1] for t in tensors)
            value = pad_id if name == "prompt_ids" else fill.get(name, 0)
            pads = [(width - t.shape[1], 0) if left else (0, width - t.shape[1]) for t in tensors]
            return torch.cat([torch.nn.functional.pad(t, pad, value=value) for t, pad in zip(tensors, pads,
                                                                                                 strict=True)])
        stats = {}
        for part in parts:
            for name, (total, count) in part.stats.items():
                old = stats.get(name, (0.0, 0.0))
                stats[name] = (old[0] + total, old[1] + count)
        pictures = None if parts[0].pictures is None else [x for p in parts for x in p.pictures]
        return replace(parts[0], prompt_ids=cat("prompt_ids", True), prompt_mask=cat("prompt_mask", True),
                       **{name: cat(name) for name in COMPLETION_SIDE}, texts=[t for p in parts for t in p.texts],
                       nfe=sum(p.nfe for p in parts), seconds=sum(p.seconds for p in parts), stats=stats,
                       pictures=pictures, reading=parts[0].reading)

    def overwrite(self, rows: list[int], other: "Rollout", picks: list[int]) -> "Rollout":
        """This rollout with its rows ``rows`` replaced by ``other``'s rows ``picks`` (completions of the same prompts:
        the prompt side stays; forward counts and time add up)."""
        if self.states or self.predictions or self.records or other.states or other.records:
            raise ValueError("rollouts with recorded states or records cannot be spliced row by row")
        out = replace(self, texts=list(self.texts), nfe=self.nfe + other.nfe, seconds=self.seconds + other.seconds)
        if out.given is None and other.given is not None:
            out.given = torch.zeros(self.completion_ids.shape, dtype=torch.bool, device=self.completion_ids.device)
        for name in COMPLETION_SIDE:
            mine, theirs = getattr(out, name), getattr(other, name)
            if mine is None or theirs is None:
                continue
            mine = mine.clone()
            mine[rows] = theirs[picks].to(mine.dtype)
            setattr(out, name, mine)
        for row, pick in zip(rows, picks, strict=True):
            out.texts[row] = other.texts[pick]
        return out

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds if self.seconds else 0.0


class Engine:
    """A backend that decodes: ``generate(prompts, n, config, seed) -> Rollout`` (prompts are chats or strings).
    A subclass registers itself with ``@register_engine(name)``; scripts open it with ``make_engine`` and trainers
    hold its ``server`` (``serving(policy, version)`` yields an engine with the policy's current weights)."""

    name: ClassVar[str] = ""
    own_samplers: ClassVar[bool] = False  # decodes with DARE's samplers: recorded canvases, hints, resumes
    records_steps: ClassVar[bool] = False  # returns the step that committed each token (step maps, replay view)
    needs_weights: ClassVar[bool] = True  # decodes the in-process model: the script loads the weights for it
    options: ClassVar[type | None] = None  # its settings (a dataclass): a section of the scripts' flags, by name

    tokenizer = family = None
    max_batch_size: int = 64

    @classmethod
    def option_names(cls) -> set[str]:
        """The fields of its ``options`` (none when it has no options)."""
        return {f.name for f in fields(cls.options)} if cls.options is not None else set()

    @classmethod
    def check(cls, config, family) -> None:
        """Refuse, naming the knob, what this engine cannot decode (``config`` resolved for ``family``)."""

    @classmethod
    def check_options(cls, options, family) -> None:
        """Refuse, before the weights load, ``options`` (its ``options`` dataclass) that ``family`` cannot take."""

    @classmethod
    def open(cls, model_name: str, tokenizer, family, *, model=None, options=None, max_batch_size: int = 64,
             gpu: int | None = None) -> "Engine":
        """The engine an evaluation decodes with (``model``: the loaded weights, for engines that need them)."""
        raise NotImplementedError

    @classmethod
    def server(cls, model_name: str, tokenizer, family, *, options=None, max_batch_size: int = 64):
        """What a trainer holds: ``serving(policy, version)`` (a context yielding an engine decoding with
        ``policy``'s weights of optimiser step ``version``), ``sync_seconds`` (the last weight copy) and ``close()``."""
        raise NotImplementedError

    def encode(self, prompts: list) -> list[list[int]]:
        return encode(self.tokenizer, prompts)

    def generate(self, prompts: list, n: int = 1, config=None, seed: int | None = None, **resume) -> Rollout:
        raise NotImplementedError

    def identity(self) -> dict:
        """What an evaluation's fingerprint records of the engine and its model: its name and ``identity`` below."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the engine holds (processes, GPU memory)."""


ENGINES = Registry("engine", __package__)
register_engine = ENGINES.register


def check_decoding(engine: type[Engine], config, family, where: str, prompt_length: int = 0,
                   max_positions: int | None = None, options=None):
    """``config`` resolved for ``family`` with every refusal of the family's sampler and of ``engine`` (and of its
    ``options``) raised now, named by ``where`` (see ``SamplingConfig.check``)."""
    if options is not None:
        engine.check_options(options, family)
    config = config.check(family, where, prompt_length, max_positions)
    try:
        engine.check(config, family)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return config


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
    texts = [tokenizer.decode(c[m & ~s], skip_special_tokens=True)
             for c, m, s in zip(completion, mask, is_stop, strict=True)]
    return mask.long(), texts


def digest(obj) -> str:
    return hashlib.blake2b(json.dumps(obj, sort_keys=True, default=str).encode(), digest_size=8).hexdigest()


def weights_digest(model) -> str:
    """blake2b over every tensor's name, dtype, shape and bytes (about 1 GB/s on one CPU core)."""
    h = hashlib.blake2b(digest_size=8)
    for name, tensor in model.state_dict().items():
        h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        h.update(tensor.detach().reshape(-1).view(torch.uint8).cpu().numpy())
    return h.hexdigest()


def identity(config, weights: str) -> dict:
    """What a fingerprint records of a model: its hub revision, ``weights`` (a digest of them) and a digest of its
    ``config``'s settings (not where it was read from)."""
    settings = {k: v for k, v in config.to_dict().items() if k not in ("_name_or_path", "transformers_version")}
    return {"revision": getattr(config, "_commit_hash", None), "weights": weights, "config": digest(settings)}
