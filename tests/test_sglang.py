"""The sglang engine (dare/engines/sglang.py) without SGLang: DareBlock, the algorithm SGLang runs for us, decodes as
DARE's block sampler does (driven here by a loop with SGLang's contract: one block at a time, blocks aligned to
position 0, a row emitted once a step begins with no mask); requests carry every knob and a seed per completion;
SGLang's outputs become the Rollout the trainer reads; the trainer's server starts once, pushes the policy's weights
(LoRA merged) only when they changed; what SGLang cannot do is refused before any model loads.

The real engine is tested in tests/test_sglang_real.py, in SGLang's own environment."""

import copy
import functools
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from dare.algos import get_algorithm, known
from dare.engines import HFEngine, check_decoding, get_engine
from dare.engines.sglang import SGLangEngine, SGLangOptions, SGLangServer, requests, server_args, to_rollout
from dare.engines.sglang_plugin import STEPS_KEY, attach_steps, block_step, request_knobs
from dare.models import Family, tiny
from dare.sampling import SamplingConfig, step_budget

PROMPTS = [[{"role": "user", "content": "What is 12 plus 30?"}], [{"role": "user", "content": "Hi"}],
           [{"role": "user", "content": "Count to five, please, slowly."}]]


@functools.cache
def parts(name: str):
    """(tiny model, tokenizer, Family) of a family, built once per module."""
    model, tok = tiny(name)
    return model, tok, Family.from_pretrained(model.config, tok)


def scheduler_loop(model, family, prompt_ids: list[int], config, seed: int, records: list | None = None) -> list[int]:
    """SGLang's dLLM contract for one request: the canvas grows a block of masks at a time (blocks aligned to position
    0, the prompt's tail inside the first one), each forward's logits go to ``block_step``, the block is emitted once a
    step begins with no mask; generation ends at gen_length or the block holding a stop token (cut after it).
    ``records``: filled with the request's step records as SGLang returns them (``attach_steps``, sliced to the
    output tokens)."""
    block, ids, out = family.block_size, list(prompt_ids), []
    knobs = request_knobs(config.resolve(family), family, seed)
    req = SimpleNamespace(customized_info=None)
    while len(out) < config.gen_length:
        start = len(ids) // block * block
        canvas = torch.tensor(ids + [family.mask_id] * (start + block - len(ids)))[None]
        state = [None]
        for _ in range(block + 1):
            with torch.no_grad():
                logits = family.logits(model, canvas)[:, start:]
            part = canvas[:, start:].clone()
            done = block_step(part, logits, [knobs], state, family.mask_id)
            canvas[:, start:] = part
            if done[0]:
                break
        new = canvas[0, len(ids):].tolist()
        attach_steps([req], [new], None, state)  # what the hook does before SGLang appends the block
        ids += new
        out += new
        if config.stop_at_eos and any(t in family.stop_ids for t in new):
            break
    out = out[:config.gen_length]
    stops = [i for i, t in enumerate(out) if t in family.stop_ids] if config.stop_at_eos else []
    out = out[:stops[0] + 1] if stops else out
    if records is not None:
        records[:] = req.customized_info[STEPS_KEY][:len(out)]
    return out


GREEDY = [dict(), dict(steps=2), dict(threshold=0.05, threshold_rule="one"), dict(threshold=0.05),
          dict(threshold=0.05, threshold_rule="quota"), dict(factor=1.0), dict(schedule="ascending"),
          dict(remasking="margin"), dict(eos_early_rejection=0.5, steps=2)]


@pytest.mark.parametrize("name", ["sdar", "llada2"])
def test_dare_block_decodes_as_the_block_sampler(name):
    """Greedy decoding through DareBlock under SGLang's contract equals DARE's block sampler token for token, for
    every knob DareBlock takes: static schedules, threshold rules, Fast-dLLM factor, ascending steps, another
    confidence, EOS early rejection. Negative control: committing a whole block in one step changes the tokens."""
    model, tok, family = parts(name)
    engine = HFEngine(model, tok, family)
    ids = engine.encode(PROMPTS)
    for knobs in GREEDY:
        config = SamplingConfig(gen_length=12, temperature=0.0, cache="none", **knobs)
        expected = engine.generate(PROMPTS, 1, config, seed=0)
        outputs = []
        for row, prompt in enumerate(ids):
            want = expected.completion_ids[row][expected.completion_mask[row].bool()].tolist()
            records = []
            assert scheduler_loop(model, family, prompt, config, 0, records) == want, (knobs, row)
            outputs.append({"output_ids": want, "meta_info": {STEPS_KEY: records}})
        # the step records come back as the block sampler's: what cj-grpo, d2, tracerl, dipo and agrpo replay
        rollout = to_rollout(outputs, ids, tok, family, 12, 0.0, step_budget(config, family))
        for field in ("completion_ids", "completion_mask", "block_step", "step_map", "replay_ids", "replay_step"):
            assert torch.equal(getattr(rollout, field), getattr(expected, field)), (knobs, field)
    print(f"{name}: {len(GREEDY)} knob settings x {len(ids)} prompts equal, step records too")
    one_by_one, all_at_once = SamplingConfig(gen_length=12), SamplingConfig(gen_length=12, steps=1)
    assert any(scheduler_loop(model, family, p, one_by_one, 0) != scheduler_loop(model, family, p, all_at_once, 0)
               for p in ids)


def test_dare_block_samples_with_each_requests_seed():
    """Sampled decoding (temperature 1, top-k): a request's seed reproduces its completion; other seeds differ."""
    model, tok, family = parts("sdar")
    prompt = HFEngine(model, tok, family).encode(PROMPTS[:1])[0]
    config = SamplingConfig(gen_length=12, temperature=1.0, top_k=50)
    draws = [scheduler_loop(model, family, prompt, config, seed) for seed in (1, 2, 3, 1)]
    assert draws[0] == draws[3] and len({tuple(d) for d in draws}) == 3


def test_requests_carry_the_knobs_and_a_seed_per_completion():
    model, tok, family = parts("sdar")
    config = check_decoding(SGLangEngine, SamplingConfig(gen_length=24, temperature=0.7, top_p=0.9), family, "rollout")
    ids, params = requests([[5, 6], [7]], 3, config, family, seed=11)
    assert ids == [[5, 6]] * 3 + [[7]] * 3
    assert [p["max_new_tokens"] for p in params] == [24] * 6 and params[0]["stop_token_ids"] == list(family.stop_ids)
    knobs = [p["custom_params"] for p in params]
    assert len({k["seed"] for k in knobs}) == 6 and knobs[0]["temperature"] == 0.7 and knobs[0]["top_p"] == 0.9
    assert knobs[0]["steps"] == family.block_size and knobs[0]["block"] == family.block_size
    assert requests([[5]], 1, config, family, 11)[1] == requests([[5]], 1, config, family, 11)[1]
    assert not requests([[5]], 1, replace(config, stop_at_eos=False), family, 0)[1][0]["stop_token_ids"] or \
        requests([[5]], 1, replace(config, stop_at_eos=False), family, 0)[1][0]["ignore_eos"]


def test_outputs_become_the_rollout_the_trainer_reads():
    """SGLang returns each completion through its first stop token (included), at most gen_length tokens."""
    model, tok, family = parts("sdar")
    words = tok("seven eight", add_special_tokens=False)["input_ids"][:3]
    outputs = [{"output_ids": words + [family.eos_id]}, {"output_ids": (words * 9)[:6]}]
    rollout = to_rollout(outputs, [[5, 6, 7], [8]], tok, family, 6, 0.5)
    n = len(words)
    assert rollout.completion_mask.sum(-1).tolist() == [n + 1, 6]
    assert rollout.texts[0] == tok.decode(words, skip_special_tokens=True)
    assert rollout.completion_ids[0, n + 1:].eq(family.pad_id).all() and rollout.prompt_mask.tolist()[1] == [0, 0, 1]
    assert (rollout.step_map == -1).all() and rollout.seconds == 0.5
    with pytest.raises(ValueError, match="more than gen_length"):
        to_rollout([{"output_ids": words * 9}], [[5]], tok, family, 6, 0.1)


class RecordingEngine:
    """Stands in for the SGLang process (not installed here): records what the server asks of it."""

    def __init__(self, model_path, tokenizer, family, options, gpu):
        self.calls, self.pushed = ["start"], []

    def push_weights(self, named):
        self.pushed.append(dict(named))
        self.calls.append("push")

    def close(self):
        self.calls.append("close")


def test_server_starts_once_and_pushes_only_changed_weights(tmp_path):
    from dare.lora import LoraArgs, apply_lora
    from dare.models import save_tiny
    model, tok, family = parts("sdar")
    policy = apply_lora(tiny("sdar")[0], LoraArgs(rank=2))
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            p.data.fill_(0.01)
    folder = save_tiny("sdar", tmp_path / "sdar", vocab_size=151936, mask_token_id=151669)  # SGLang's SDAR mask id
    server = SGLangServer(folder, tok, replace(family, mask_id=151669), SGLangOptions(), RecordingEngine)
    for version in (0, 0, 1):
        with server.serving(policy, version) as engine:
            pass
    assert engine.calls == ["start", "push", "push"]
    first = engine.pushed[0]
    assert set(first) == set(tiny("sdar")[0].state_dict())  # official names, no adapter keys
    merged = policy.merge_and_unload().state_dict()
    assert max((first[k] - merged[k]).abs().max().item() for k in first) < 1e-6
    server.close()
    assert engine.calls[-1] == "close" and server.engine is None
    with server.serving(policy, 1) as restarted:  # a new engine reads the checkpoint: the same version is pushed again
        pass
    assert restarted is not engine and restarted.calls == ["start", "push"]


def test_what_sglang_cannot_do_is_refused():
    model, tok, llada = parts("llada")
    with pytest.raises(ValueError, match="block-diffusion models only.*llada decodes with engine hf"):
        check_decoding(SGLangEngine, SamplingConfig(), llada, "rollout")
    model, tok, llada2 = parts("llada2")
    for knob, value in (("editing_threshold", 0.9), ("record_states", True), ("cache", "none")):
        with pytest.raises(ValueError, match=f"rollout: engine sglang: {knob}"):
            check_decoding(SGLangEngine, SamplingConfig(**{knob: value}), llada2, "rollout")
    SGLangEngine.check(SamplingConfig(temperature=1.0, threshold=0.9).resolve(llada2), llada2)
    with pytest.raises(ValueError, match="Unknown engine 'vllm'"):
        get_engine("vllm")
    refused = [a for a in known() if get_algorithm(a).needs_sampler]
    assert refused == ["d-treerpo", "igpo", "justgrpo", "mdpo"]
    replaying = [a for a in known() if get_algorithm(a).needs_steps]  # served by DareBlock's step records
    assert replaying == ["agrpo", "cj-grpo", "d2", "dipo", "tracerl"]

    class Unrecorded(SGLangEngine):  # an engine that returns no steps
        records_steps = False

    for name in known():
        algo = get_algorithm(name)()
        if name in refused:
            with pytest.raises(ValueError, match=f"rollout-engine sglang: {name} needs .* use --rollout-engine hf"):
                algo.check_engine(SGLangEngine)
        else:
            algo.check_engine(SGLangEngine)
        if name in replaying:
            with pytest.raises(ValueError, match=f"{name} needs the step at which each token was decoded"):
                algo.check_engine(Unrecorded)


def test_server_arguments_for_a_checkpoint():
    """The engine's arguments: DareBlock, the block size file, SGLang's own environment knobs, the RoPE base SGLang's
    SDAR reads only at the top level of the config, and the user's extra ServerArgs last."""
    model, tok, family = parts("sdar")
    config = copy.deepcopy(model.config)
    config.dtype = torch.bfloat16  # as a saved bf16 checkpoint's config reads
    args = server_args("folder", config, family, SGLangOptions(server_args='{"max_total_tokens": 4096}'), "b.yaml")
    assert args["dllm_algorithm"] == "DareBlock" and args["dllm_algorithm_config"] == "b.yaml"
    assert args["max_running_requests"] == 256 and args["skip_tokenizer_init"] and args["max_total_tokens"] == 4096
    assert '"rope_theta": 1000000.0' in args["json_model_override_args"] and args["dtype"] == "bfloat16"


def test_scripts_refuse_sglang_before_loading_anything(tmp_path, monkeypatch):
    import evaluate
    import train_rl
    from dare.config import parse
    from dare.models import loading

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before the refusal")

    monkeypatch.setattr(loading, "load_weights", no_weights)
    common = ["--model", "tiny:sdar", "--data.path", "task:addition", "--rollout-engine", "sglang",
              "--output-dir", str(tmp_path)]
    for algo, message in (("d-treerpo", "d-treerpo needs decodings resumed from shared partial canvases"),
                          ("cj-grpo", "serves a checkpoint .* not a tiny: model")):  # cj-grpo: steps recorded
        with pytest.raises(ValueError, match=message):
            train_rl.main(parse(train_rl.args_class(algo), ["--algo", algo, *common]))
    from dare.models import save_tiny
    common[1] = save_tiny("sdar", tmp_path / "sdar")  # a checkpoint with another mask id than SGLang fixes
    with pytest.raises(ValueError, match="fixes SDARForCausalLM's mask token to id 151669"):
        train_rl.main(parse(train_rl.args_class("d1"), ["--algo", "d1", *common]))
    with pytest.raises(ValueError, match="block-diffusion models only"):
        evaluate.main(parse(evaluate.Args, ["--model", "tiny:llada", "--engine", "sglang", "--prompt", "Hi"],
                            config=(evaluate.tyro.conf.OmitArgPrefixes,)))


def test_without_sglang_the_engine_says_where_it_lives(tmp_path):
    pytest.importorskip("transformers")
    try:
        import sglang  # noqa: F401
        pytest.skip("SGLang is installed here: tests/test_sglang_real.py runs it")
    except ImportError:
        pass
    from dare.engines.sglang import SGLangEngine
    from dare.models import save_tiny
    model, tok, family = parts("sdar")
    folder = save_tiny("sdar", tmp_path / "sdar", vocab_size=151936, mask_token_id=151669)
    with pytest.raises(ValueError, match="SGLang is not installed in this environment.*docs/sglang\\.md"):
        SGLangEngine(folder, tok, replace(family, mask_id=151669))
    with pytest.raises(ValueError, match="fixes SDARForCausalLM's mask token to id 151669, this checkpoint's is 1"):
        SGLangEngine(save_tiny("sdar", tmp_path / "plain"), tok, family)
