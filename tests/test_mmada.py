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
    assert Family.from_pretrained(config).name == "mmada" and Family.from_pretrained(config).pictures


def test_a_picture_prompt_is_mmu_soi_codes_eoi_then_the_chat_without_its_placeholder():
    model, tok = tiny("mmada")
    config, reader = model.config, pictures(model.config)
    wide = Image.new("RGB", (60, 30), (200, 20, 20))
    ids = reader.prompt_ids(tok, prompt(tok), [wide])
    codes = image_tokenizer(config.vq_model_name).codes(square(wide, 64)[None])[0]
    assert ids[:2] == [config.mmu_token_id, config.soi_token_id] and ids[18] == config.eoi_token_id
    assert ids[2:18] == (codes + config.llm_vocab_size).tolist() and config.num_vq_tokens == 16
    assert all(512 <= i < 512 + 8192 for i in ids[2:18]) and config.vocab_size == 512 + 8192
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
