"""MMaDA (``dare.models.mmada``): LLaDA's architecture and keys over the vocabulary grown by MAGVIT-v2's codebook, a
picture read as ``<|mmu|> <|soi|> codes <|eoi|>`` ahead of the chat (MMaDA's understanding prompt), and SFT, LoRA, RL
and evaluation on picture rows with the tiny model."""

import json

import pytest
import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForCausalLM

from dare.data.images import IMAGE
from dare.models import Family, MMadaConfig, MMadaModelLM, pictures, readers, save_tiny, tiny
from dare.models.readers import image_tokenizer, square

MMADA = {"model_type": "mmada", "architectures": ["MMadaModelLM"], "vocab_size": 134656, "embedding_size": 134656,
         "new_vocab_size": 134656, "llm_vocab_size": 126464, "codebook_size": 8192, "num_vq_tokens": 1024,
         "num_new_special_tokens": 0}  # configs/mmada_demo.yaml's model.mmada keys


def prompt(tok, question="How many red shapes?"):
    return tok.apply_chat_template([{"role": "user", "content": f"{IMAGE}\n{question}"}], add_generation_prompt=True,
                                   tokenize=False)


def test_an_mmada_config_builds_lladas_keys_over_the_grown_vocabulary(shared_models, tmp_path):
    """LLaDA-8B's config with MMaDA's keys: LLaDA's published key list, the embedding and head 126464 + 8192 rows;
    the picture tokens default to LLaDA's reserved tokens that MMaDA uses (prompting_utils), 512 px pictures."""
    llada = shared_models / "LLaDA-8B-Instruct"
    official = {k: v for k, v in json.loads((llada / "config.json").read_text()).items() if k != "auto_map"}
    (tmp_path / "config.json").write_text(json.dumps({**official, **MMADA}))
    config = AutoConfig.from_pretrained(tmp_path)
    assert type(config) is MMadaConfig and config.resolution == 512 and readers.IMAGE == IMAGE
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    assert type(model) is MMadaModelLM
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    index = json.loads((llada / "model.safetensors.index.json").read_text())
    assert set(shapes) == set(index["weight_map"])
    assert shapes["model.transformer.wte.weight"] == shapes["model.transformer.ff_out.weight"] == (134656, 4096)
    reserved = json.loads((llada / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    names = {key: reserved[str(getattr(config, key))]["content"] for key in
             ("soi_token_id", "eoi_token_id", "t2i_token_id", "mmu_token_id")}
    assert names == {"soi_token_id": "<|reserved_token_0|>", "eoi_token_id": "<|reserved_token_1|>",
                     "t2i_token_id": "<|reserved_token_4|>", "mmu_token_id": "<|reserved_token_5|>"}
    # LLaDA's tokenizer ends at 126348: the codes are tokens 126349 .. 134540, inside the 134656 rows
    assert max(int(k) for k in reserved) + 1 == 126349 and 126349 + config.codebook_size <= config.vocab_size
    assert Family.from_pretrained(config).name == "mmada" and Family.from_pretrained(config).pictures


def test_a_picture_prompt_is_mmu_soi_codes_eoi_then_the_chat_without_its_placeholder():
    model, tok = tiny("mmada")
    config, reader = model.config, pictures(model.config)
    wide = Image.new("RGB", (60, 30), (200, 20, 20))
    ids = reader.prompt_ids(tok, prompt(tok), [wide])
    codes = image_tokenizer(config.vq_model_name).codes(square(wide, 64)[None])[0]
    assert ids[:2] == [config.mmu_token_id, config.soi_token_id] and ids[18] == config.eoi_token_id
    assert ids[2:18] == (codes + len(tok)).tolist() and config.num_vq_tokens == 16  # codes from the tokenizer's end
    assert len(tok) == 512 and config.vocab_size == config.llm_vocab_size + 8192 == 512 + 64 + 8192
    text = tok.apply_chat_template([{"role": "user", "content": "How many red shapes?"}], add_generation_prompt=True,
                                   tokenize=False)
    assert ids[19:] == tok(text, add_special_tokens=False).input_ids  # the chat as if the picture were not there
    assert reader.prompt_length(tok, prompt(tok), [wide]) == len(ids)  # counted without reading the picture
    assert reader.prompt_length(tok, text, []) == len(reader.prompt_ids(tok, text, [])) == len(ids) - 19
    # a wide picture is padded square with white, centred, then resized (dLLM-RL's RL transform)
    padded = Image.new("RGB", (60, 60), (255, 255, 255))
    padded.paste(wide, (0, 15))
    assert torch.equal(square(wide, 64), square(padded, 64))
    assert square(wide, 64).shape == (3, 64, 64) and square(wide, 64).min() >= -1 and square(padded, 64)[0, 0, 0] == 1
    other = reader.prompt_ids(tok, prompt(tok), [Image.new("RGB", (60, 30), (20, 20, 200))])
    assert other[2:18] != ids[2:18] and other[18:] == ids[18:]
    with pytest.raises(ValueError, match="one picture per prompt"):
        reader.prompt_ids(tok, prompt(tok) + IMAGE, [wide, wide])
    with pytest.raises(ValueError, match="1 <image> placeholder"):
        reader.prompt_ids(tok, prompt(tok), [])


def test_a_saved_tiny_mmada_reloads_with_its_image_tokenizer(tmp_path):
    from dare.models import load_pretrained

    folder = save_tiny("mmada", tmp_path / "m")
    model, tok, _ = load_pretrained(folder)
    assert type(model) is MMadaModelLM and model.config.vq_model_name == "tiny:magvit"
    original, original_tok = tiny("mmada")
    for key, value in original.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    picture = Image.new("RGB", (48, 48), (10, 200, 10))
    assert pictures(model.config).prompt_ids(tok, prompt(tok), [picture]) == \
        pictures(original.config).prompt_ids(original_tok, prompt(original_tok), [picture])


def test_sft_lora_rl_and_evaluation_run_on_pictures_with_tiny_mmada(tmp_path):
    """train_sft.py (full and LoRA), train_rl.py (d1, a KL reference) and evaluate's harness on the visual task with
    tiny:mmada: the pictures arrive as prompt tokens (no picture inputs in the batches), the loss covers only the
    answers, the weights move, and a rerun of the evaluation reuses its records."""
    import train_rl
    import train_sft
    from dare.data import SFTCollator, load_rows
    from dare.data.sft import SFTDataConfig, tokenize_dataset
    from dare.data.tasks import write_task
    from dare.engines import HFEngine
    from dare.eval import harness
    from dare.models import load_pretrained
    from dare.sampling import SamplingConfig

    data = write_task("shapes", str(tmp_path / "shapes.parquet"), 16)
    model, tok = tiny("mmada")
    family, reader = Family.from_pretrained(model.config, tok), pictures(model.config)
    config = SFTDataConfig(path=data, max_length=96, pad_to="longest")
    examples = tokenize_dataset(load_rows(data, images=True), tok, family, config, reader)
    batch = SFTCollator(family, config, reader)([examples[0], examples[1]])
    assert set(batch) == {"input_ids", "loss_mask", "attention_mask"}
    codes = (batch["input_ids"] >= 512).sum(-1)
    assert codes.tolist() == [16, 16] and not (batch["loss_mask"].bool() & (batch["input_ids"] >= 512)).any()

    sft = train_sft.Args(model="tiny:mmada", output_dir=str(tmp_path / "sft"), max_steps=2, save_steps=2,
                         per_device_train_batch_size=4, learning_rate=1e-2, warmup_steps=0.0)
    sft.data.path, sft.data.max_length, sft.data.pad_to = data, 96, "longest"
    train_sft.main(sft)
    trained = load_pretrained(str(tmp_path / "sft"))[0].state_dict()
    assert not torch.allclose(trained["model.transformer.wte.weight"], model.state_dict()[
        "model.transformer.wte.weight"])
    sft.output_dir, sft.lora.rank, sft.lora.alpha = str(tmp_path / "lora"), 4, 8
    train_sft.main(sft)
    assert set(load_pretrained(str(tmp_path / "lora" / "merged"))[0].state_dict()) == set(model.state_dict())

    rl = train_rl.args_class("d1")(model=str(tmp_path / "sft"), output_dir=str(tmp_path / "rl"), max_steps=2,
                                    save_steps=2, prompts_per_step=2, num_generations=4, micro_batch_size=4,
                                    rewards=["dare_test_rewards.length"], learning_rate=3e-2)
    rl.data.path, rl.rollout.gen_length, rl.rollout.temperature, rl.algo_config.beta = data, 8, 1.0, 0.1
    train_rl.main(rl)
    log = json.loads((tmp_path / "rl" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    assert [h["kl"] for h in log if "kl" in h][0] == 0.0
    assert all(h["grad_norm"] > 0 and h["completion_length"] > 0 for h in log if "kl" in h)

    engine = HFEngine(model, tok, family, max_batch_size=4)
    sampling = SamplingConfig(gen_length=6, steps=6, temperature=0.0)
    run = lambda: harness.evaluate_benchmarks(engine, ["task:shapes"], sampling, tmp_path / "eval", limit=4,
                                              batch_size=2, model_name="tiny:mmada")["task:shapes"]
    first, again = run(), run()
    assert (first["decoded"], again["decoded"], again["reused"]) == (4, 0, 4)


def test_every_algorithm_that_trains_llada_trains_mmada():
    """MMaDA's pictures are prompt tokens and its trunk is LLaDA's: the matrix gives it LLaDA's column."""
    from dare.algos import get_algorithm, known

    assert all(get_algorithm(n).supports("mmada") == get_algorithm(n).supports("llada") for n in known())


@pytest.mark.parametrize("algo", ["unigrpo", "maskgrpo"])
def test_the_multimodal_rl_methods_train_mmada_on_pictures(algo, tmp_path):
    """UniGRPO (MMaDA's own) and MaskGRPO on tiny:mmada and the visual task: two steps with inner iterations and a KL
    reference, on-policy at the first."""
    import train_rl
    from dare.data.tasks import write_task

    data = write_task("shapes", str(tmp_path / "shapes.parquet"), 16)
    args = train_rl.args_class(algo)(model="tiny:mmada", output_dir=str(tmp_path / "rl"), max_steps=2, save_steps=2,
                                      prompts_per_step=2, num_generations=4, micro_batch_size=4,
                                      rewards=["dare_test_rewards.length"], learning_rate=3e-2)
    args.data.path, args.rollout.gen_length, args.rollout.temperature = data, 8, 1.0
    args.algo_config.num_iterations, args.algo_config.beta = 2, 0.1
    train_rl.main(args)
    log = json.loads((tmp_path / "rl" / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    first = [h for h in log if "loss" in h][0]
    assert first["ratio"] == 1.0 and first["kl"] == 0.0 and first["grad_norm"] > 0


class Recording(torch.nn.Module):
    """The tiny model, keeping the ids of every call."""

    def __init__(self, model):
        super().__init__()
        self.model, self.calls = model, []

    def forward(self, input_ids, **kwargs):
        self.calls.append(input_ids.clone())
        return self.model(input_ids, **kwargs)


def test_drawing_prompts_are_mmadas_text_to_image_layout():
    model, tok = tiny("mmada")
    c, reader = model.config, pictures(model.config)
    p = reader.drawing_prompts(tok, ["a red square", "x " * 40], max_text_len=12)
    text = tok("a red square", add_special_tokens=False).input_ids
    row = p["ids"][0].tolist()
    head = [c.t2i_token_id, tok.bos_token_id, *text, tok.eos_token_id]
    assert row[:13] == [c.pad_token_id] * (13 - len(head)) + head and p["start"] == 14
    assert row[13:] == [c.soi_token_id] + [c.mask_token_id] * 16 + [c.eoi_token_id]
    assert p["attention_mask"][0].tolist() == [0] * (13 - len(head)) + [1] * (len(head) + 18)
    long = p["ids"][1].tolist()  # cut to the text width, still ending with EOS
    assert long[:2] == [c.t2i_token_id, tok.bos_token_id] and long[12] == tok.eos_token_id
    assert all(p["attention_mask"][1])
    assert p["uncond_ids"][0].tolist()[10:13] == [c.t2i_token_id, tok.bos_token_id, tok.eos_token_id]
    assert p["uncond_ids"][0].tolist()[13:] == row[13:] and (p["first"], p["size"]) == (512, 8192)


@pytest.mark.parametrize("guidance", [0.0, 3.5])
def test_maskgit_commits_codes_on_the_cosine_schedule_and_keeps_them(guidance):
    """Each step re-masks floor(L cos(pi/2 (s+1)/T)) codes (clamped to [1, still masked - 1]; float32, as MMaDA), never
    a committed one; the answer is the last step's samples, committed codes included; guidance reads the prompt without
    its text beside it, sharing the picture's current codes."""
    from dare.sampling.maskgit import DrawConfig, maskgit

    model, tok = tiny("mmada")
    reader, recording, steps = pictures(model.config), Recording(model), 6
    p = reader.drawing_prompts(tok, ["a red square", "two blue circles"], max_text_len=12)
    codes, committed = maskgit(recording, **p, mask_id=model.config.mask_token_id, config=DrawConfig(steps, guidance),
                               generator=torch.Generator().manual_seed(0))
    span = slice(p["start"], p["start"] + 16)
    calls = [c[:2] for c in recording.calls]
    assert len(calls) == steps and all(len(c) == (4 if guidance else 2) for c in recording.calls)
    if guidance:
        assert all(torch.equal(c[2:, :span.start], p["uncond_ids"][:, :span.start]) and
                   torch.equal(c[2:, span], c[:2, span]) for c in recording.calls)
    masked, left = [], 16
    for s in range(steps):
        target = int((16 * torch.cos(torch.tensor((s + 1) / steps) * torch.pi * 0.5)).floor())
        left = max(1, min(left - 1, target))
        masked.append(left)
    states = [c[:, span] for c in calls] + [None]
    assert [int((c == model.config.mask_token_id).sum(-1)[0]) for c in states[1:-1]] == masked[:-1]
    for before, after in zip(states[:-2], states[1:-1], strict=True):
        kept = before != model.config.mask_token_id
        assert torch.equal(after[kept], before[kept])  # a committed code never changes
    last = states[-2] != model.config.mask_token_id
    assert torch.equal((codes + 512)[last], states[-2][last]) and codes.min() >= 0 and codes.max() < 8192
    for s in range(1, steps):  # a code committed at step s is first seen unmasked in the model's input of step s + 1
        seen = states[s] != model.config.mask_token_id
        assert torch.equal(seen, committed < s)


def test_maskgits_confidence_noise_anneals_as_mmadas_compounding_factors():
    """MMaDA rebinds its temperature at every step: step s's scale is T0 x prod_{j <= s} (1 - (j + 1) / steps), not
    MaskGIT's T0 x (1 - (s + 1) / steps); the last step's is 0."""
    from dare.sampling.maskgit import noise_scales

    scales = noise_scales(2.0, 4)
    assert scales == pytest.approx([2.0 * 0.75, 2.0 * 0.75 * 0.5, 2.0 * 0.75 * 0.5 * 0.25, 0.0])
    assert scales[1] != pytest.approx(2.0 * 0.5)  # the un-compounded schedule


def test_guidance_on_an_empty_prompt_changes_nothing_and_the_codes_decode_to_pictures(tmp_path):
    """With no text, the prompt and its unconditioned twin are equal: (1 + g) c - g c = c, so guidance draws what no
    guidance draws from the same generator; the codes decode to pictures of the configured size, and evaluate.py's
    --draw writes one (a text model refuses in one line)."""
    import evaluate
    from dare.sampling.maskgit import DrawConfig, draw, maskgit

    model, tok = tiny("mmada")
    p = pictures(model.config).drawing_prompts(tok, ["", ""], max_text_len=12)
    runs = [maskgit(model, **p, mask_id=model.config.mask_token_id, config=DrawConfig(steps=4, guidance=g),
                    generator=torch.Generator().manual_seed(3))[0] for g in (0.0, 3.5)]
    assert torch.equal(*runs)
    drawn = draw(model, tok, ["a red square"], DrawConfig(steps=3), seed=0)
    assert len(drawn) == 1 and drawn[0].size == (64, 64) and drawn[0].mode == "RGB"
    out = tmp_path / "square.png"
    evaluate.main(evaluate.Args(model="tiny:mmada", prompt="a red square", draw=str(out), draw_steps=3))
    assert Image.open(out).size == (64, 64)
    with pytest.raises(ValueError, match="a llada model draws no pictures"):
        evaluate.main(evaluate.Args(model="tiny:llada", prompt="a red square", draw=str(out)))


def test_the_colours_task_asks_for_drawings_and_its_reward_reads_them():
    """Held-out questions never trained on; a row's reference drawing scores 1, the halves swapped 0, one half right
    0.5 (not accurate), anything but a picture 0; a malformed ground truth is refused naming the parts."""
    from dare.data.images import DrawPrompt, pictured_prompt
    from dare.data.tasks import make_task
    from dare.rewards import get_reward, score_for_source

    train, test = make_task("colours", 300, 0, "train"), make_task("colours", 30, 0, "test")
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in test}
    reward = get_reward(score_for_source("colours", "draw"))
    two = next(r for r in train if "," in r["reward_model"]["ground_truth"])
    truth = two["reward_model"]["ground_truth"]
    assert reward(two["extra_info"]["solution"], truth).score == 1.0
    (a, x), (b, y) = (part.split(":") for part in truth.split(","))
    assert reward(two["extra_info"]["solution"], f"{a}:{y},{b}:{x}").score == 0.0
    half = reward(two["extra_info"]["solution"], f"{a}:{x},{b}:{x}")
    assert (half.score, half.acc) == (0.5, 0.0)
    assert reward("The picture is red.", truth).score == 0.0 and reward("data:image/png;base64,AAAA", truth).score == 0
    with pytest.raises(ValueError, match="REGION:COLOUR"):
        reward(two["extra_info"]["solution"], "middle:red")
    assert pictured_prompt({**two, "prompt": two["prompt"]}) == DrawPrompt(two["prompt"][0]["content"])


def test_the_engine_draws_rollouts_that_evaluation_scores(tmp_path):
    """HFEngine.generate on DrawPrompts: n drawings a prompt, the prompt up to <|soi|>, the codes as completion ids in
    the codebook's rows, each code's commit step, the texts the decoded pictures (PNG data URIs); the same seed draws
    the same; the harness scores task:colours with the colours reward and reuses its records; a text model refuses."""
    from dare.data.images import DrawPrompt
    from dare.engines import HFEngine
    from dare.eval import harness
    from dare.rewards.pictures import picture_of
    from dare.sampling import SamplingConfig

    model, tok = tiny("mmada")
    engine = HFEngine(model, tok, Family.from_pretrained(model.config, tok), max_batch_size=3)
    config = SamplingConfig(steps=4, temperature=1.0)
    prompts = [DrawPrompt("Draw a picture that is all red."), DrawPrompt("Draw a picture that is all blue.")]
    rollout = engine.generate(prompts, 2, config, seed=0)
    assert rollout.completion_ids.shape == (4, 16) and rollout.prompt_ids[:, -1].eq(model.config.soi_token_id).all()
    assert rollout.completion_ids.min() >= 512 and rollout.completion_ids.max() < 512 + 8192
    assert rollout.step_map.min() >= 0 and rollout.step_map.max() == 3 and rollout.nfe == 4 * 2
    assert rollout.stopped(engine.family.stop_ids).all()  # a drawing is whole: never "unfinished" or truncated
    codes = rollout.completion_ids - 512
    shown = [picture_of(t) for t in rollout.texts]
    assert [p.get_flattened_data() for p in shown] == [
        p.get_flattened_data() for p in pictures(model.config).pictures_of(codes)]
    again = engine.generate(prompts, 2, config, seed=0)
    assert torch.equal(again.completion_ids, rollout.completion_ids) and again.texts == rollout.texts
    assert engine.encode(prompts)[0] == rollout.prompt_ids[0].tolist()
    out = harness.evaluate_benchmarks(engine, ["task:colours"], config, tmp_path, limit=3, batch_size=2,
                                      model_name="tiny:mmada")["task:colours"]
    assert out["decoded"] == 3 and 0.0 <= out["score"] <= 1.0 and "accuracy" in out
    rerun = harness.evaluate_benchmarks(engine, ["task:colours"], config, tmp_path, limit=3, batch_size=2,
                                        model_name="tiny:mmada")["task:colours"]
    assert (rerun["decoded"], rerun["reused"], rerun["score"]) == (0, 3, out["score"])
    text_model, text_tok = tiny("llada")
    text = HFEngine(text_model, text_tok, Family.from_pretrained(text_model.config, text_tok))
    with pytest.raises(ValueError, match="which draws none"):
        text.generate(prompts, 1, config)


def test_a_drawing_is_scored_over_the_codebooks_rows_at_every_columns_position():
    """The model a drawing's scorer is handed (PictureTokens.wrap of Rollout.reading): a code's log-probability is the
    log-softmax over the codebook's rows alone (MaskGIT's distribution), read at positions 0 .. L-1 padding included
    (as MaskGIT reads them); its config and parameters are the model's."""
    model, tok = tiny("mmada")
    reader = pictures(model.config)
    p = reader.drawing_prompts(tok, ["Draw a picture that is all red."])
    wrapped = reader.wrap(model, torch.tensor([p["first"], p["size"]]))
    assert wrapped.config is model.config and next(wrapped.parameters()) is next(model.parameters())
    ids = p["ids"].clone()
    ids[0, p["start"]:p["start"] + 16] = torch.arange(16) * 97 + 512  # some codes
    with torch.no_grad():
        ours = wrapped(input_ids=ids, attention_mask=p["attention_mask"]).logits.log_softmax(-1)
        plain = model(ids, attention_mask=p["attention_mask"], position_ids=torch.arange(ids.shape[1])[None]).logits
        shifted = model(ids, attention_mask=p["attention_mask"]).logits  # DARE's default: padding not counted
    window = slice(512, 512 + 8192)
    assert torch.allclose(ours[..., window], plain[..., window].log_softmax(-1), atol=1e-5)
    assert ours[..., :512].exp().max() == 0 and ours[..., 512 + 8192:].exp().max() == 0
    assert not torch.allclose(plain, shifted, atol=1e-4)  # the positions matter: the prompt is padded


def test_rl_trains_a_drawing_model_on_the_drawing_task(tmp_path, monkeypatch, capsys):
    """train_rl.py on task:colours with tiny:mmada: d1 and MaskGRPO roll out drawings with MaskGIT, score them with
    the colours reward, and train through the codebook's reading (its forward runs in old, reference and policy
    scoring); the rollout's codes fill the completion; an algorithm that replays the masked sampler's steps and a text
    model are refused before the weights load."""
    import train_rl
    from dare.data.tasks import write_task
    from dare.models import readers

    data = write_task("colours", str(tmp_path / "colours.parquet"), 16)
    calls = []
    forward = readers.Codebook.forward
    monkeypatch.setattr(readers.Codebook, "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))

    def run(algo, name, **kw):
        args = train_rl.args_class(algo)(**{**dict(model="tiny:mmada", output_dir=str(tmp_path / name), max_steps=2,
                                                   save_steps=2, prompts_per_step=2, num_generations=4,
                                                   micro_batch_size=4, learning_rate=3e-2), **kw})
        args.data.path, args.rollout.temperature, args.rollout.steps = data, 1.0, 4
        if algo != "tracerl":
            args.algo_config.beta = 0.1
        if algo == "maskgrpo":
            args.algo_config.num_iterations = 2
        return args

    for algo in ("d1", "maskgrpo"):
        train_rl.main(run(algo, algo))
        log = json.loads((tmp_path / algo / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
        first = [h for h in log if "loss" in h][0]
        assert first["completion_length"] == 16 and 0 < first["reward"] < 1 and first["grad_norm"] > 0
        assert first["kl"] == 0.0 and first.get("ratio", 1.0) == 1.0
        completions = (tmp_path / algo / "completions.jsonl").read_text()
        assert completions.count("data:image/png;base64,") >= 2  # a few logged completions a step
    assert len(calls) >= 8
    assert "  a step: maskgrpo, 2 prompts x 4 drawings; 16 training rows\n" in capsys.readouterr().out  # not tokens
    with pytest.raises(ValueError, match="tracerl replays the masked sampler's steps"):
        train_rl.main(run("tracerl", "tracerl"))
    with pytest.raises(ValueError, match="draws none"):
        train_rl.main(run("d1", "text", model="tiny:llada"))
