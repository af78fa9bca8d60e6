"""DARE's diffusion models in EleutherAI's lm-evaluation-harness: the model class ``dare``, registered with lm-eval.

    python -m dare.eval.lm_harness --model dare --tasks gsm8k --num_fewshot 5 --batch_size 8 \\
        --model_args pretrained=GSAI-ML/LLaDA-8B-Instruct,gen_length=256,steps=256,block_length=32
    python -m dare.eval.lm_harness --model dare --tasks arc_easy --batch_size 8 \
        --model_args pretrained=GSAI-ML/LLaDA-8B-Base,mc_num=128

``python -m dare.eval.lm_harness`` is lm-eval's own command line (``lm_eval``: every flag, task and output of it)
with this class registered first: lm-eval 0.4.13 finds models only in its registry and has no plugin entry point,
so plain ``lm_eval --model dare`` cannot see it. In Python, ``import dare.eval.lm_harness`` and call
``lm_eval.simple_evaluate(model="dare", ...)``.

* ``generate_until`` decodes with DARE's engine and samplers, every ``SamplingConfig`` knob a model argument (they
  decide the decoding, as in LLaDA's own lm-eval class: a task's ``max_gen_toks`` or ``temperature`` does not change
  a canvas laid out in blocks), batched by ``batch_size``, and cuts the text at the first of the request's ``until``
  strings (a diffusion canvas is decoded whole; the stop applies to the text).
* ``loglikelihood`` is the diffusion ELBO of the continuation (``dare.eval.loglik``: ``mc_num`` Monte-Carlo samples
  with stratified mask counts and a fixed seed, as LLaDA's own lm-eval path scores multiple-choice tasks); for a
  one-token continuation the only mask count is 1, so the value is the exact ``log p(token | context, [MASK])``.
  ``is_greedy`` is exact for one-token continuations of masked families (the masked position's argmax) and False
  otherwise.
* A model that reads pictures (LLaDA-V) runs lm-eval's multimodal generation tasks (``chartqa``, ``mmmu_val``...):
  each request's pictures (lm-eval's ``visual``) decode with its context as a ``PicturePrompt``.
* The engine's options are model arguments too, by their field names (the hf engine's ``compile=true`` and
  ``compile_mode``: compiled decoding; SGLang's ``mem_fraction``, ``tp``, ...).
"""

from dataclasses import fields

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm.auto import tqdm

from ..data.images import IMAGE, PicturePrompt
from ..engines import check_decoding, get_engine, make_engine
from ..models.loading import load_config, load_weights, max_positions
from ..sampling import SamplingConfig
from .loglik import elbo_of_ids

KNOBS = {f.name: f.type for f in fields(SamplingConfig)}


def _value(text: str):
    """A model argument as lm-eval passes it (already typed, or a string) -> int / float / bool / None / str."""
    if not isinstance(text, str):
        return text
    if text.lower() in ("none", "null"):
        return None
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@register_model("dare")
class DARELM(LM):
    def __init__(self, pretrained: str, batch_size: int | str | None = 8, mc_num: int = 32, mc_seed: int = 0,
                 dtype: str = "auto", device: str | None = None, engine: str = "hf", seed: int = 0,
                 attn_implementation: str = "sdpa", max_batch_size: int | None = None, **knobs):
        super().__init__()
        kind = get_engine(engine)
        own = kind.option_names()
        unknown = sorted(set(knobs) - set(KNOBS) - own)
        if unknown:
            raise ValueError(f"unknown model argument(s) {unknown}; DARE's are pretrained, batch_size, mc_num, "
                             f"mc_seed, dtype, device, engine, seed, attn_implementation, the sampling knobs "
                             f"{sorted(KNOBS)} and the {engine} engine's options {sorted(own)}")
        options = kind.options(**{k: _value(v) for k, v in knobs.items() if k in own}) if own else None
        self.sampling = SamplingConfig(**{k: _value(v) for k, v in knobs.items() if k not in own})
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 8  # lm-eval's --batch_size; "auto": 8
        self.mc_num, self.mc_seed, self.seed = int(mc_num), int(mc_seed), int(seed)
        self.pretrained = pretrained
        config, self.tokenizer, self.family = load_config(pretrained)
        self.max_positions = max_positions(config)
        check_decoding(kind, self.sampling, self.family, "model_args", 0, self.max_positions, options)
        if not device or (device.startswith("cuda") and not torch.cuda.is_available()):
            device = "cuda" if torch.cuda.is_available() else "cpu"  # lm-eval's --device defaults to cuda
        torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
        self._device = torch.device(device)
        self.model = load_weights(pretrained, config, torch_dtype, attn_implementation).to(self._device).eval()
        self.engine = make_engine(engine, pretrained, self.tokenizer, self.family, model=self.model, options=options,
                                  max_batch_size=self.batch_size)
        self.MULTIMODAL = self.family.pictures  # lm-eval hands picture tasks (chartqa, mmmu...) only to such a model

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return self.pretrained.replace("/", "__")

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        return self.tokenizer.chat_template if chat_template else None

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = []
        if any(len(r.args) > 2 and (r.args[2] or {}).get("visual") for r in requests):
            raise NotImplementedError("loglikelihood with pictures: DARE scores picture tasks by generation "
                                      "(generate_until tasks such as chartqa)")
        for context, continuation, *_ in (r.args for r in requests):
            spaces = len(context) - len(context.rstrip(" "))  # lm-eval's convention: the space goes with the answer
            context, continuation = context[:len(context) - spaces], context[len(context) - spaces:] + continuation
            pairs.append((self._ids(context), self._ids(continuation)))
        out = []
        for start in tqdm(range(0, len(pairs), self.batch_size), disable=disable_tqdm, desc="ELBO"):
            chunk = pairs[start:start + self.batch_size]
            values = elbo_of_ids(self.model, self.family, [c for c, _ in chunk], [x for _, x in chunk],
                                 samples=self.mc_num, seed=self.mc_seed)
            out += [(float(v), self._greedy(c, x)) for v, (c, x) in zip(values, chunk, strict=True)]
        return out

    @torch.no_grad()
    def _greedy(self, context: list[int], continuation: list[int]) -> bool:
        """Whether the continuation is the model's argmax: for one token of a masked family, its masked position's."""
        if len(continuation) != 1 or self.family.block_size:
            return False
        ids = torch.tensor([context + [self.family.mask_id]], device=self._device)
        logits = self.family.logits(self.model, ids)[0, -1]
        return int(logits.argmax()) == continuation[0]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("loglikelihood_rolling (perplexity tasks) needs a left-to-right likelihood; a "
                                  "diffusion LM gives an ELBO of a continuation: use loglikelihood or "
                                  "generate_until tasks")

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for start in tqdm(range(0, len(requests), self.batch_size), disable=disable_tqdm, desc="generate_until"):
            chunk = [r.args for r in requests[start:start + self.batch_size]]
            rollout = self.engine.generate([with_pictures(*args) for args in chunk], 1, self.sampling,
                                           seed=self.seed + start)
            for (_, kwargs, *_), text in zip(chunk, rollout.texts, strict=True):
                until = kwargs.get("until") or []
                out.append(cut(text, [until] if isinstance(until, str) else until))
        return out


def with_pictures(context: str, kwargs: dict, aux: dict | None = None):
    """A request's prompt: its context, or with the pictures of a multimodal task (lm-eval's ``visual``) a
    ``PicturePrompt``, an ``<image>`` put first for each picture the context does not place (as lm-eval's own
    multimodal models do)."""
    pictures = (aux or {}).get("visual") or []
    pictures = pictures if isinstance(pictures, list) else [pictures]
    if not pictures:
        return context
    missing = max(len(pictures) - context.count(IMAGE), 0)
    return PicturePrompt(IMAGE * missing + context, tuple(p.convert("RGB") for p in pictures))


def cut(text: str, until: list[str]) -> str:
    """``text`` up to the first occurrence of any stop string."""
    ends = [text.find(stop) for stop in until if stop and stop in text]
    return text[:min(ends)] if ends else text


if __name__ == "__main__":
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
