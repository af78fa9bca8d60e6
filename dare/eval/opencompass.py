"""OpenCompass model class for every DARE family (optional extra; docs/evaluation.md "OpenCompass": installing it
beside trl).

In an OpenCompass config:

    from dare.eval.opencompass import DARECompassModel
    models = [dict(type=DARECompassModel, abbr="llada-8b", path="GSAI-ML/LLaDA-8B-Instruct", max_out_len=256,
                   batch_size=8, sampling=dict(steps=256, block_length=8), elbo_samples=32, run_cfg=dict(num_gpus=1))]

With ``engine="sglang"`` (block families, in SGLang's environment; ``options=dict(...)`` takes the engine's options,
``dare.engines.sglang.SGLangOptions``) the generation benchmarks decode on SGLang and no model is loaded in-process
(``get_ppl`` then refuses: it needs the model's logits).

``generate`` decodes with DARE's samplers (the family's chat template; OpenCompass's HUMAN/BOT/SYSTEM turns become
chat turns), ``get_ppl`` is the per-token negative ELBO of each text after its first ``mask_length`` tokens
(lower = likelier, as OpenCompass expects; ``dare.eval.loglik``: masked or uniform noise), ``get_token_len``
counts tokenizer tokens.
"""

from dataclasses import fields

import torch
from opencompass.models.base import BaseModel
from opencompass.registry import MODELS

from ..engines import get_engine, make_engine
from ..models.loading import load_config, load_weights
from ..sampling import SamplingConfig
from .loglik import elbo_of_ids

ROLES = {"HUMAN": "user", "BOT": "assistant", "SYSTEM": "system"}


def to_messages(prompt) -> list[dict]:
    """An OpenCompass prompt (a string or a PromptList of {role, prompt} turns) as chat messages."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    messages = []
    for turn in prompt:
        if isinstance(turn, str):
            messages.append({"role": "user", "content": turn})
        elif "role" in turn:
            messages.append({"role": ROLES.get(turn["role"], "user"), "content": turn.get("prompt", "")})
    return messages


@MODELS.register_module()
class DARECompassModel(BaseModel):
    is_api = False

    def __init__(self, path: str, max_seq_len: int = 4096, tokenizer_only: bool = False, meta_template=None,
                 sampling: dict | None = None, elbo_samples: int = 32, dtype: str = "auto", seed: int = 0,
                 engine: str = "hf", options: dict | None = None, **kwargs):
        super().__init__(path=path, max_seq_len=max_seq_len, tokenizer_only=tokenizer_only,
                         meta_template=meta_template)
        known = {f.name for f in fields(SamplingConfig)}
        unknown = set(sampling or {}) - known
        if unknown:
            hint = " (the engine is its own argument: engine=...)" if "engine" in unknown else ""
            raise ValueError(f"unknown sampling keys {sorted(unknown)}{hint}; known: {sorted(known)}")
        self.sampling, self.elbo_samples, self.seed = dict(sampling or {}), elbo_samples, seed
        kind, self.model = get_engine(engine), None
        config, self.tokenizer, self.family = load_config(path)
        # the engine's refusals before any weights load; the sampler's, which depend on gen_length, at each generate
        kind.check(SamplingConfig(**self.sampling).resolve(self.family), self.family)
        own = kind.option_names()
        if set(options or {}) - own:
            raise ValueError(f"unknown options {sorted(set(options) - own)}; the {engine} engine's: {sorted(own)}")
        settings = kind.options(**(options or {})) if kind.options else None
        if settings is not None:
            kind.check_options(settings, self.family)  # options the family cannot take, before the weights load
        if kind.needs_weights:
            dtype = dtype if dtype == "auto" else getattr(torch, dtype)
            self.model = load_weights(path, config, dtype).to("cuda" if torch.cuda.is_available() else "cpu").eval()
        self.engine = make_engine(engine, path, self.tokenizer, self.family, model=self.model, options=settings)

    def generate(self, inputs: list, max_out_len: int, **kwargs) -> list[str]:
        config = SamplingConfig(**{"gen_length": max_out_len, **self.sampling})
        return self.engine.generate([to_messages(p) for p in inputs], 1, config, seed=self.seed).texts

    def get_token_len(self, prompt: str) -> int:
        return len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def get_ppl(self, inputs: list[str], mask_length: list[int] | None = None) -> list[float]:
        if self.model is None:
            raise NotImplementedError("get_ppl scores with the model's own logits: use engine hf for perplexity "
                                      "benchmarks")
        ids = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in inputs]
        cuts = [min(mask_length[i] if mask_length else 0, len(x) - 1) for i, x in enumerate(ids)]
        elbo = elbo_of_ids(self.model, self.family, [x[:c] for x, c in zip(ids, cuts, strict=True)],
                           [x[c:] for x, c in zip(ids, cuts, strict=True)], self.elbo_samples, self.seed)
        return [float(-e / (len(x) - c)) for e, x, c in zip(elbo, ids, cuts, strict=True)]
