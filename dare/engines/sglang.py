"""The ``sglang`` engine: block-diffusion rollouts and evaluation on SGLang's offline ``Engine`` (SDAR, SDAR-MoE,
LLaDA2.x), in SGLang's own environment (docs/sglang.md "SGLang engine"; ``requirements-sglang.txt``).

    engine = SGLangEngine("path/to/sdar", tokenizer, family, SGLangOptions())
    rollout = engine.generate(prompts, n=8, config=SamplingConfig(temperature=1.0), seed=0)

It decodes with ``DareBlock`` (``dare/engines/sglang_plugin.py``): DARE's block sampler inside SGLang's scheduler, so
every knob of a block-family ``SamplingConfig`` means what it means on ``hf`` and greedy tokens agree. What SGLang
cannot give is refused by ``SGLangEngine.check`` before any model loads: the masked families (SGLang's dLLM framework
serves block diffusion only), LLaDA2.1 editing, recorded states, and decoding without the KV cache. The step that
committed each token comes back (``DareBlock``'s records: ``block_step``, ``step_map`` and the replay view, as the hf
block sampler gives them), so the trajectory algorithms roll out here; what needs DARE's own sampler (recorded
canvases, hints, resumes) declares it (``Algorithm.needs_sampler``).

A trainer holds an ``SGLangServer``: the engine starts at the first rollout (on this process's GPU, or
``--sglang.gpu``), receives the policy's weights (LoRA merged) whenever the optimiser has stepped since, and, when
colocated with training on a GPU, releases its memory between rollouts.
"""

import importlib.util
import json
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ..data.chat import left_pad
from ..lora import merged_weights
from ..sampling import SamplingConfig, step_budget
from .base import Engine, Rollout, check_decoding, check_prompts, decode_completions, digest, identity, register_engine
from .sglang_plugin import NAME, STEPS_KEY, knobs_carrier, request_knobs

# SGLang's dLLM config hardcodes the mask id of each architecture (sglang/srt/dllm/config.py), whatever config.json says
SGLANG_MASK_IDS = {"SDARForCausalLM": 151669, "SDARMoeForCausalLM": 151669, "LLaDA2MoeModelLM": 156895}
PUSH_BYTES = 1 << 29  # weights pushed to the engine in chunks of about this many bytes


@dataclass
class SGLangOptions:
    """The SGLang engine of ``train_rl.py --rollout-engine sglang`` / ``evaluate.py --engine sglang``."""

    mem_fraction: float = 0.4  # share of the GPU for SGLang's weights + KV cache (colocated: leave room for training)
    max_running_requests: int = 256  # requests decoded together (SGLang's dLLM default is 1)
    gpu: int | None = None  # GPU of the engine (None: this process's own GPU, colocated with training)
    tp: int = 1  # tensor-parallel GPUs of the engine (from gpu on)
    # colocated on a GPU: free the engine's memory while training (needs torch_memory_saver)
    release_memory: bool = True
    server_args: str = "{}"  # JSON of further sglang ServerArgs, e.g. '{"attention_backend": "triton"}'


def served_config(model_path: str, family):
    """The config of the checkpoint SGLang will serve, refused (before SGLang or any weights load) if SGLang cannot
    serve it as DARE decodes: a ``tiny:`` name, another architecture, another mask id than SGLang fixes."""
    from transformers import AutoConfig
    if model_path.startswith("tiny:"):
        raise ValueError("engine sglang serves a checkpoint (a local folder or hub name), not a tiny: model; "
                         "save one with dare.models.save_tiny")
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=False)
    check_checkpoint(config, family)
    return config


def check_checkpoint(model_config, family) -> str:
    """The architecture SGLang will serve for ``model_config``; refused if SGLang cannot serve it as DARE decodes."""
    architecture = (getattr(model_config, "architectures", None) or [type(model_config).__name__])[0]
    if architecture not in SGLANG_MASK_IDS:
        raise ValueError(f"engine sglang: SGLang serves {sorted(SGLANG_MASK_IDS)} as diffusion models, not "
                         f"{architecture!r}")
    if family.mask_id != SGLANG_MASK_IDS[architecture]:
        raise ValueError(f"engine sglang: SGLang fixes {architecture}'s mask token to id "
                         f"{SGLANG_MASK_IDS[architecture]}, this checkpoint's is {family.mask_id}")
    return architecture


def server_args(model_path: str, model_config, family, options: SGLangOptions, algorithm_config: str,
                gpu: int | None = None) -> dict:
    """Keyword arguments of ``sglang.Engine`` for a DARE checkpoint (``algorithm_config``: path of the YAML file)."""
    overrides = {}
    rope = getattr(model_config, "rope_parameters", None) or {}
    if "rope_theta" in rope and getattr(model_config, "rope_theta", None) is None:
        overrides["rope_theta"] = rope["rope_theta"]  # SGLang's SDAR reads only the top-level key (default 10000)
    args = {"model_path": model_path, "dllm_algorithm": NAME, "dllm_algorithm_config": algorithm_config,
            "skip_tokenizer_init": True, "trust_remote_code": True,
            "dtype": str(model_config.dtype).removeprefix("torch.") if getattr(model_config, "dtype", None) else "auto",
            "mem_fraction_static": options.mem_fraction, "max_running_requests": options.max_running_requests,
            "tp_size": options.tp, "enable_memory_saver": options.release_memory and torch.cuda.is_available(),
            "json_model_override_args": json.dumps(overrides), "random_seed": 0, "log_level": "error",
            "enable_custom_logit_processor": True}  # how requests' custom_params reach DareBlock (knobs_carrier)
    if torch.cuda.is_available():
        args["base_gpu_id"] = options.gpu if options.gpu is not None else (gpu or 0)
    else:  # SGLang's plain-PyTorch path: slow, for trying things and for the tests
        args.update(device="cpu", attention_backend="torch_native", disable_cuda_graph=True, max_total_tokens=16384)
    return {**args, **json.loads(options.server_args)}


def requests(prompt_ids: list[list[int]], n: int, config, family, seed: int | None) -> tuple[list, list]:
    """``(input_ids, sampling_params)`` of SGLang requests: each prompt ``n`` times (prompt-major), each request with
    its own seed and DARE's decoding knobs (``custom_params``)."""
    base = 0 if seed is None else seed
    params = {"max_new_tokens": config.gen_length, "stop_token_ids": list(family.stop_ids),
              "ignore_eos": not config.stop_at_eos, "skip_special_tokens": False}
    ids = [p for p in prompt_ids for _ in range(n)]
    return ids, [{**params, "custom_params": request_knobs(config, family, (base * 1_000_003 + i) % 2 ** 63)}
                 for i in range(len(ids))]


def to_rollout(outputs: list[dict], prompt_ids: list[list[int]], tokenizer, family, gen_length: int,
               seconds: float, slot: int | None = None) -> Rollout:
    """SGLang's outputs (``output_ids`` through the first stop token, at most ``gen_length``) as a ``Rollout``:
    completions padded with the family's pad id to ``gen_length``, and the decoding steps ``DareBlock`` recorded
    (``decoding_records``; ``slot``: the global steps each block owns, ``step_budget``, as the hf block sampler
    numbers them), or -1 where an output carries none."""
    rows = [o["output_ids"] for o in outputs]
    if any(len(r) > gen_length for r in rows):
        raise ValueError(f"SGLang returned more than gen_length={gen_length} tokens")
    completion = torch.full((len(rows), gen_length), family.pad_id, dtype=torch.long)
    generated = torch.zeros_like(completion, dtype=torch.bool)
    for i, r in enumerate(rows):
        completion[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        generated[i, :len(r)] = True
    mask, texts = decode_completions(tokenizer, family, completion, generated)
    prompts, prompt_mask = left_pad(prompt_ids, family.pad_id)
    block_step, step_map = torch.full_like(completion, -1), torch.full_like(completion, -1)
    replay_ids = torch.full((len(rows), gen_length + family.block_size - 1), family.pad_id, dtype=torch.long)
    replay_step = torch.full_like(replay_ids, -1)
    recorded = [o.get("meta_info", {}).get(STEPS_KEY) for o in outputs]
    for i, (output, record) in enumerate(zip(rows, recorded, strict=True)):
        if record is None:
            continue
        ids, steps, blocks = decoding_records(record, output)
        n = len(output)  # at most gen_length (refused above)
        block_step[i, :n] = torch.tensor(steps[:n], dtype=torch.long)
        if slot is not None:
            step_map[i, :n] = torch.tensor([b * slot + j for b, j in zip(blocks[:n], steps[:n], strict=True)])
        replay_ids[i, :len(ids)], replay_step[i, :len(ids)] = torch.tensor(ids), torch.tensor(steps)
    replay = any(r is not None for r in recorded)
    return Rollout(prompts, prompt_mask, completion, mask, step_map, block_step, texts, 0, seconds,
                   replay_ids=replay_ids if replay else None, replay_step=replay_step if replay else None)


def decoding_records(record: list, output: list[int]) -> tuple[list[int], list[int], list[int]]:
    """``(ids, steps, blocks)`` of every token ``DareBlock`` decoded for one request, from its ``meta_info`` record
    (per output token: the ``(ids, steps)`` of the block it starts, else None): the emitted blocks joined, the
    whole block of the stop token and the whole last block included (the replay view of the hf block sampler), each
    token's block-local step and its block's index."""
    ids, steps, blocks = [], [], []
    for value in record:
        if value is not None:
            blocks += [blocks[-1] + 1 if blocks else 0] * len(value[0])
            ids += value[0]
            steps += value[1]
    if ids[:len(output)] != list(output):
        raise RuntimeError("SGLang's step records do not match its output tokens")
    return ids, steps, blocks


def cpu_import_shim() -> None:
    """Without CUDA, SGLang's rotary embedding still imports ``vllm._custom_ops`` (never calling it): where vllm is not
    installed, a stub module on the path that SGLang's spawned processes inherit lets the import pass."""
    if torch.cuda.is_available() or importlib.util.find_spec("vllm") is not None:
        return
    stub = Path(tempfile.mkdtemp(prefix="dare-sglang-cpu-")) / "vllm"
    stub.mkdir()
    (stub / "__init__.py").write_text("")
    (stub / "_custom_ops.py").write_text("def rotary_embedding(*args, **kwargs):\n    raise NotImplementedError\n")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(stub.parent), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(stub.parent))  # spawned processes start from the parent's sys.path


@register_engine("sglang")
class SGLangEngine(Engine):
    """``generate(prompts, n, config, seed) -> Rollout`` on an ``sglang.Engine`` serving ``model_path``."""

    needs_weights = False  # SGLang loads the checkpoint itself
    records_steps = True  # DareBlock's step records (dare/engines/sglang_plugin.py)
    options = SGLangOptions

    @classmethod
    def check(cls, config, family) -> None:
        """Refuse, naming the knob, what SGLang cannot decode as DARE does."""
        if not family.is_block_diffusion or family.noise != "mask":
            raise ValueError(f"engine sglang: SGLang's dLLM framework serves masked block-diffusion models only "
                             f"(SDAR, SDAR-MoE, LLaDA2.x); {family.name} decodes with engine hf")
        refused = {"editing_threshold": (config.editing_threshold is not None, "LLaDA2.1 editing"),
                   "record_states": (config.record_states, "the canvas after every step"),
                   "record_entropy": (config.record_entropy, "the entropy each token was drawn with"),
                   "cache": (config.cache == "none", "decoding without the KV cache"),
                   "cfg_scale": (config.cfg_scale != 0.0, "classifier-free guidance"),
                   "remasking": (config.remasking == "origin", "Dream's independent flips")}
        for knob, (asked, what) in refused.items():
            if asked:
                raise ValueError(f"engine sglang: {knob} ({what}) is decoded by DARE's own sampler only; use "
                                 "engine hf")

    @classmethod
    def open(cls, model_name, tokenizer, family, *, model=None, options=None, max_batch_size=64, gpu=None):
        return cls(model_name, tokenizer, family, options, gpu)

    @classmethod
    def server(cls, model_name, tokenizer, family, *, options=None, max_batch_size=64):
        return SGLangServer(model_name, tokenizer, family, options, cls)

    def __init__(self, model_path: str, tokenizer, family, options: SGLangOptions | None = None,
                 gpu: int | None = None):
        self.config = served_config(model_path, family)
        self.tokenizer, self.family, self.options = tokenizer, family, options or SGLangOptions()
        self.model_path, self.max_batch_size = model_path, self.options.max_running_requests
        try:
            import sglang
        except ImportError:
            raise ValueError("engine sglang: SGLang is not installed in this environment; it needs its own "
                             "(docs/sglang.md, requirements-sglang.txt)") from None
        cpu_import_shim()
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="dare-sglang-", delete=False) as f:
            f.write(f"block_size: {family.block_size}\n")  # the checkpoint's, not SGLang's per-architecture default
        self._yaml = f.name
        self.engine = sglang.Engine(**server_args(model_path, self.config, family, self.options, self._yaml, gpu))
        self._carrier = knobs_carrier()

    def generate(self, prompts: list, n: int = 1, config=None, seed: int | None = None, **resume) -> Rollout:
        if any(v not in (None, 0) for v in resume.values()):
            raise ValueError(f"engine sglang cannot resume a partial decoding ({sorted(resume)}); use engine hf")
        config = check_decoding(SGLangEngine, config or SamplingConfig(), self.family, "sampling")
        ids, params = requests(self.encode(prompts), n, config, self.family, seed)
        check_prompts(ids)
        start = time.perf_counter()
        outputs = self.engine.generate(input_ids=ids, sampling_params=params,
                                       custom_logit_processor=[self._carrier] * len(ids))
        return to_rollout(outputs, ids, self.tokenizer, self.family, config.gen_length, time.perf_counter() - start,
                          step_budget(config, self.family))

    def push_weights(self, named_tensors) -> None:
        """Load ``(name, tensor)`` pairs (official key names) into the served model, in chunks, in one update."""
        def check(result, what):
            ok, message = (result[0], result[1]) if isinstance(result, tuple) else (True, "")
            if not ok:
                raise RuntimeError(f"SGLang {what} failed: {message}")

        check(self.engine.begin_weight_update(), "begin_weight_update")
        chunk, size = [], 0
        for name, tensor in named_tensors:
            chunk.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= PUSH_BYTES:
                check(self.engine.update_weights_from_tensor(chunk, flush_cache=False), "update_weights_from_tensor")
                chunk, size = [], 0
        if chunk:
            check(self.engine.update_weights_from_tensor(chunk, flush_cache=False), "update_weights_from_tensor")
        check(self.engine.end_weight_update(), "end_weight_update")
        self.engine.flush_cache()  # the prefix cache holds K/V of the old weights

    def release(self):
        self.engine.release_memory_occupation()

    def resume(self):
        self.engine.resume_memory_occupation()

    def identity(self) -> dict:
        """What the evaluation fingerprint records of the served weights: the folder's files, by name and size."""
        files = sorted(p for p in Path(self.model_path).glob("*") if p.suffix in (".safetensors", ".json", ".bin"))
        files = digest([(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files])
        return {"engine": self.name, **identity(self.config, files)}

    def close(self):
        self.engine.shutdown()
        os.unlink(self._yaml)


class SGLangServer:
    """A trainer's sglang engine (the ``InProcessEngine`` contract): started at the first rollout, given the policy's
    weights whenever they changed, its GPU memory released between rollouts when colocated with training."""

    def __init__(self, model_path: str, tokenizer, family, options: SGLangOptions | None = None, engine_class=None):
        served_config(model_path, family)  # refused now, not at the first rollout
        self.model_path, self.tokenizer, self.family = model_path, tokenizer, family
        self.options = options or SGLangOptions()
        self.engine_class = engine_class or SGLangEngine
        self.engine, self.version, self.sync_seconds = None, None, 0.0  # sync_seconds: the last weight push
        self.colocated = self.options.release_memory and self.options.gpu is None and torch.cuda.is_available()

    @contextmanager
    def serving(self, policy, version: int):
        if self.engine is None:
            gpu = torch.cuda.current_device() if torch.cuda.is_available() else None
            self.engine = self.engine_class(self.model_path, self.tokenizer, self.family, self.options, gpu)
        elif self.colocated:
            self.engine.resume()
            self.version = None  # resumed weights are not restored: push them again
        self.sync_seconds = 0.0
        if version != self.version:
            start = time.perf_counter()
            self.engine.push_weights(merged_weights(policy))
            self.version, self.sync_seconds = version, time.perf_counter() - start
        try:
            yield self.engine
        finally:
            if self.colocated:
                self.engine.release()

    def close(self):
        if self.engine is not None:
            self.engine.close()
            self.engine, self.version = None, None  # a later serving starts from the checkpoint: push again
