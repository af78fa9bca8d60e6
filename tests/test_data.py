"""SFT data: loading local files, chat formatting, EOS padding per family, clear errors."""

import json
import warnings

import pytest
import torch
from conftest import SHARED

from dare.data import SFTCollator, SFTDataConfig, get_field, load_rows, tokenize_sft
from dare.data.sft import as_sft_rows, tokenize_dataset
from dare.models import Family, tiny

ROWS = [{"q": "What is 2+3?", "a": "2+3=5. #### 5", "meta": {"src": "toy"}},
        {"q": "Name a colour.", "a": "Blue.", "meta": {"src": "toy"}}]


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def family_of(name):
    model, tok = tiny(name)
    return tok, Family.from_pretrained(model.config, tok)


@pytest.mark.parametrize("name", ["llada", "dream", "sdar", "llada2"])
def test_example_layout_and_masks(name, jsonl):
    tok, fam = family_of(name)
    cfg = SFTDataConfig(path=jsonl, prompt_key="q", response_key="a", max_length=64)
    rows = load_rows(jsonl)
    ex = tokenize_sft(rows[0], tok, fam, cfg)
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                     tokenize=True, return_dict=True)["input_ids"]
    assert ex["input_ids"][:ex["prompt_length"]] == prompt
    response = ex["input_ids"][ex["prompt_length"]:]
    turn_end = [i for i in fam.stop_ids if i != fam.eos_id]
    assert response[-1] == fam.eos_id and response[-2] == turn_end[0]
    assert tok.decode(response[:-2]) == "2+3=5. #### 5"
    batch = SFTCollator(fam, cfg)([ex, tokenize_sft(rows[1], tok, fam, cfg)])
    ids, loss, attn = batch["input_ids"], batch["loss_mask"], batch["attention_mask"]
    assert ids.shape == (2, 64) and (ids[0, len(ex["input_ids"]):] == fam.pad_id).all()
    assert not loss[0, :ex["prompt_length"]].any()
    if name == "llada2":  # pads excluded from attention and loss
        assert loss[0].sum() == len(response) and attn[0].sum() == len(ex["input_ids"])
    else:  # the EOS tail is trained on and attended
        assert loss[0].sum() == 64 - ex["prompt_length"] and attn.all()


@pytest.mark.parametrize("name,tail", [("llada2", True), ("llada", False)])
def test_eos_tail_overrides_the_familys_recipe(name, tail, jsonl):
    """data.eos_tail trains the EOS run after the response (attended, in the loss) for a family whose recipe leaves
    it as padding, and makes it padding for one that trains it."""
    tok, fam = family_of(name)
    cfg = SFTDataConfig(path=jsonl, prompt_key="q", response_key="a", max_length=64, eos_tail=tail)
    ex = tokenize_sft(load_rows(jsonl)[0], tok, fam, cfg)
    batch = SFTCollator(fam, cfg)([ex])
    trained = 64 - ex["prompt_length"] if tail else len(ex["input_ids"]) - ex["prompt_length"]
    assert int(batch["loss_mask"][0].sum()) == trained
    assert int(batch["attention_mask"][0].sum()) == (64 if tail else len(ex["input_ids"]))


def test_pad_to_longest_and_nested_keys(jsonl):
    tok, fam = family_of("sdar")
    cfg = SFTDataConfig(path=jsonl, prompt_key="q", response_key="a", pad_to="longest", max_length=512)
    examples = [tokenize_sft(r, tok, fam, cfg) for r in load_rows(jsonl)]
    batch = SFTCollator(fam, cfg)(examples)
    assert batch["input_ids"].shape[1] == max(len(e["input_ids"]) for e in examples)
    assert get_field({"a": {"b": 3}}, "a.b") == 3


def test_truncation_modes(jsonl):
    tok, fam = family_of("llada")
    rows = load_rows(jsonl)
    full = tokenize_sft(rows[0], tok, fam, SFTDataConfig(prompt_key="q", response_key="a", max_length=512))
    short = len(full["input_ids"]) - 3
    with pytest.raises(ValueError, match="exceeds max_length"):
        tokenize_sft(rows[0], tok, fam, SFTDataConfig(prompt_key="q", response_key="a", max_length=short))
    right = tokenize_sft(rows[0], tok, fam, SFTDataConfig(prompt_key="q", response_key="a", max_length=short,
                                                          truncation="right"))
    assert right["input_ids"] == full["input_ids"][:short] and right["truncated"]
    left = tokenize_sft(rows[0], tok, fam, SFTDataConfig(prompt_key="q", response_key="a", max_length=short,
                                                         truncation="left"))
    assert left["input_ids"] == full["input_ids"][3:] and left["prompt_length"] == full["prompt_length"] - 3
    second = tokenize_sft(rows[1], tok, fam, SFTDataConfig(prompt_key="q", response_key="a", max_length=512))
    assert len(second["input_ids"]) < len(full["input_ids"])
    cfg = SFTDataConfig(prompt_key="q", response_key="a", max_length=len(second["input_ids"]), truncation="right")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tokenize_dataset(rows, tok, fam, cfg)
    assert any("1 of 2 examples were truncated" in str(w.message) for w in caught)


def test_clear_errors(jsonl, tmp_path):
    tok, fam = family_of("dream")
    rows = load_rows(jsonl)
    with pytest.raises(KeyError, match="'question' not found in meta"):
        tokenize_sft(rows[0], tok, fam, SFTDataConfig(prompt_key="meta.question", response_key="a"))
    with pytest.raises(KeyError, match="'answer' not found"):
        tokenize_sft(rows[0], tok, fam, SFTDataConfig(prompt_key="q", response_key="answer"))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(Exception, match="empty|Empty|no data|doesn't contain"):
        load_rows(str(empty))
    with pytest.raises(FileNotFoundError, match="not found"):
        load_rows(str(tmp_path / "missing.parquet"))


def test_real_gsm8k_sft_file():
    path = SHARED / "data" / "sft" / "train" / "gsm8k_train.parquet"
    if not path.exists():
        pytest.skip(f"{path} not found (../shared is absent)")
    tok, fam = family_of("llada")
    rows, cfg = as_sft_rows(load_rows(str(path)), SFTDataConfig(path=str(path), max_length=1024))
    assert (cfg.prompt_key, cfg.response_key) == ("extra_info.question", "extra_info.answer")  # found, no flags
    ex = tokenize_sft(rows[0], tok, fam, cfg)
    text = tok.decode(ex["input_ids"])
    assert "Natalia sold clips" in text and text.endswith("#### 72<|eot_id|><|endoftext|>")
    messages = tokenize_sft(rows[0], tok, fam, SFTDataConfig(prompt_key="prompt", response_key="extra_info.answer",
                                                             max_length=1024))
    assert "output the final answer" in tok.decode(messages["input_ids"])  # the chat-message column works too
    assert torch.tensor(ex["input_ids"]).max() < len(tok)


def hub_serving(monkeypatch, served: dict):
    """``datasets.load_dataset`` answering from ``served`` {(name, config, split): rows} as the hub would, and failing
    as an offline machine does for anything else (no network here: the conversion is what is under test)."""
    import datasets
    real = datasets.load_dataset

    def load_dataset(name, config=None, split=None, **kwargs):
        if "data_files" in kwargs:  # a local file
            return real(name, config, split=split, **kwargs)
        if (name, config, split) not in served:
            raise ConnectionError(f"Couldn't reach '{name}' on the Hub (LocalEntryNotFoundError)")
        return datasets.Dataset.from_list(served[name, config, split])
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


def test_public_datasets_read_alike_from_the_hub_and_from_the_local_copy(monkeypatch):
    """Recipes name the public datasets by hub name; --data.local-dir reads the reference's copy instead. The same
    keys must read both: SFT's extra_info.question / extra_info.answer and RL's prompt and ground truth."""
    from dare.data import RLDataConfig, prompt_rows
    if not (SHARED / "data").is_dir():
        pytest.skip("../shared is absent")
    sft_copy = load_rows("openai/gsm8k:main", "train", str(SHARED / "data" / "sft")).select(range(6))
    math_copy = load_rows("HuggingFaceH4/MATH-500", "test", str(SHARED / "data" / "rl")).select(range(6))
    hub_serving(monkeypatch, {  # the hub's own columns: GSM8K's answer ends "#### 72", MATH-500 has answer + solution
        ("openai/gsm8k", "main", "train"): [{"question": r["extra_info"]["question"],
                                             "answer": r["extra_info"]["answer"]} for r in sft_copy],
        ("HuggingFaceH4/MATH-500", None, "test"): [{"problem": r["prompt"][0]["content"], "solution": "...",
                                                   "answer": r["reward_model"]["ground_truth"]} for r in math_copy]})
    hub = load_rows("openai/gsm8k:main", "train")
    for key in ("extra_info.question", "extra_info.answer", "reward_model.ground_truth"):
        assert [get_field(r, key) for r in hub] == [get_field(r, key) for r in sft_copy], key
    for name, split in [("openai/gsm8k:main", "train"), ("HuggingFaceH4/MATH-500", "test")]:
        from_hub = prompt_rows(name, split, RLDataConfig(), limit=6)
        from_copy = prompt_rows(name, split, RLDataConfig(local_dir=str(SHARED / "data" / "rl")), limit=6)
        assert [(r["prompt"], r["ground_truth"], r["data_source"]) for r in from_hub] == \
            [(r["prompt"], r["ground_truth"], r["data_source"]) for r in from_copy], name
    assert from_hub[0]["prompt"][-1]["content"].endswith("\\boxed{}.")  # the reward's format asked for, both ways


def test_public_dataset_errors_name_the_flag(monkeypatch, tmp_path):
    import huggingface_hub.constants

    from dare import hub
    hub_serving(monkeypatch, {})
    monkeypatch.setattr(hub, "reachable", lambda: True)  # a hub that answers, but not for this name
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(OSError, match=r"hub dataset openai/gsm8k:main \(split train\) could not be loaded "
                                      r"\(ConnectionError: .*\); with a local copy "
                                      r"\(gsm8k_1.parquet/gsm8k_train.parquet\) give its folder as --data-dir"):
        load_rows("openai/gsm8k:main", "train")
    monkeypatch.setattr(hub, "reachable", lambda: False)  # no network: offline mode, and the name is not cached
    with pytest.raises(OSError, match=r"hub dataset openai/gsm8k:main: not in the local hub cache .* cannot be "
                                      r"reached .*; with a local copy \(gsm8k_1.parquet/gsm8k_train.parquet\) give"):
        load_rows("openai/gsm8k:main", "train")
    with pytest.raises(FileNotFoundError, match=r"openai/gsm8k:main, split 'test': no local copy in .* \(looked for "
                                                r".*/test/gsm8k_1.parquet, .*/gsm8k_1.parquet, "
                                                r".*/test/gsm8k_test.parquet"):
        load_rows("openai/gsm8k:main", "test", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no public hub copy of the reference's sudoku-n20000_1.parquet"):
        load_rows("sudoku", "train")


def test_math_train_rows_take_the_answer_from_the_solutions_last_box():
    from dare.data.public import PUBLIC
    row = PUBLIC["DigitalLearningGmbH/MATH-lighteval"].convert(
        {"problem": "What is $1+1$?", "solution": "We add: $\\boxed{1}$ no, $1+1=\\boxed{2}$.", "level": "Level 1"})
    assert row["reward_model"]["ground_truth"] == "2" and row["data_source"] == "math"
    assert row["extra_info"] == {"task": "math", "question": "What is $1+1$?",
                                 "answer": "We add: $\\boxed{1}$ no, $1+1=\\boxed{2}$."}


def test_right_truncation_drops_examples_whose_prompt_fills_max_length_and_says_so():
    import datasets

    from dare.data.sft import SFTDataConfig, tokenize_dataset
    from dare.models.loading import load_config
    _, tokenizer, family = load_config("tiny:llada")
    rows = datasets.Dataset.from_list([{"q": "short?", "a": "yes"}, {"q": "long " * 200, "a": "no"}])
    data = SFTDataConfig(prompt_key="q", response_key="a", max_length=64, truncation="right")
    with pytest.warns(UserWarning, match="1 of 2 examples dropped: cut to max_length=64 from the right"):
        out = tokenize_dataset(rows, tokenizer, family, data)
    assert len(out) == 1 and out[0]["response_length"] > 0
    with pytest.raises(ValueError, match="no example fits max_length=64"):
        tokenize_dataset(rows.select([1]), tokenizer, family, data)


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4."}]
FORMATS = {  # one row of each format read without key flags: (row, [(prompt messages, response) learned])
    "prompt-completion": ({"prompt": "2+2?", "completion": "4."}, [([{"role": "user", "content": "2+2?"}], "4.")]),
    "conversational prompt-completion": ({"prompt": CHAT[1:2], "completion": CHAT[2:3]}, [(CHAT[1:2], "Hello.")]),
    "messages": ({"messages": CHAT}, [(CHAT[:2], "Hello."), (CHAT[:4], "4.")]),
    "sharegpt": ({"conversations": [{"from": m["role"], "value": m["content"]} for m in CHAT]},
                 [(CHAT[:2], "Hello."), (CHAT[:4], "4.")]),
    "task": ({"prompt": CHAT[1:2], "reward_model": {"ground_truth": "4"}, "extra_info": {"solution": "Hello."}},
             [(CHAT[1:2], "Hello.")]),
    "reference": ({"extra_info": {"question": "2+2?", "answer": "4."}},
                  [([{"role": "user", "content": "2+2?"}], "4.")]),
}


@pytest.mark.parametrize("kind", list(FORMATS))
def test_sft_formats_are_found_from_the_columns(kind, tmp_path):
    """TRL's standard and conversational formats (a multi-turn conversation: one example per assistant turn, its
    history as the prompt), DARE's task rows and the reference schema train with no key flag."""
    row, expected = FORMATS[kind]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    tok, fam = family_of("llada")
    examples = tokenize_dataset(load_rows(str(path)), tok, fam, SFTDataConfig(max_length=128))
    assert len(examples) == len(expected)
    for example, (messages, response) in zip(examples, expected, strict=True):
        prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]
        ids = example["input_ids"]
        assert ids[:example["prompt_length"]] == prompt
        assert tok.decode(ids[example["prompt_length"]:-2]) == response


def test_an_unknown_sft_format_names_its_columns(jsonl, tmp_path):
    tok, fam = family_of("llada")
    with pytest.raises(ValueError, match=r"Cannot tell the SFT format of columns \['a', 'meta', 'q'\]: .+'messages'"):
        tokenize_dataset(load_rows(jsonl), tok, fam, SFTDataConfig())
    with pytest.raises(ValueError, match="prompt-key and --data.response-key go together"):
        tokenize_dataset(load_rows(jsonl), tok, fam, SFTDataConfig(prompt_key="q"))
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"messages": CHAT[2:]}) + "\n")
    with pytest.raises(ValueError, match="opens with an assistant turn"):
        tokenize_dataset(load_rows(str(path)), tok, fam, SFTDataConfig())


@pytest.mark.parametrize("column", ["reward_model", "ground_truth", "answer", "solution"])
def test_rl_prompts_take_trls_columns_with_no_key_flags(column, tmp_path):
    """TRL's prompt-only rows (a prompt, text or messages, and a column the reward reads) need no flag: the ground
    truth is the first of DARE's reference column and TRL's usual ones; a file without ``data_source`` is source
    "default"; a file with none of them names its columns."""
    from dare.data import RLDataConfig, prompt_rows
    truth = {"ground_truth": "4"} if column == "reward_model" else "4"
    path = tmp_path / "rl.jsonl"
    path.write_text(json.dumps({"prompt": CHAT[3:4] if column == "answer" else "2+2?", column: truth}) + "\n")
    (row,) = prompt_rows(str(path), "train", RLDataConfig(answer_instruction="none"))
    assert row["ground_truth"] == "4" and row["data_source"] == "default"
    assert row["prompt"] == [{"role": "user", "content": "2+2?"}]
    path.write_text(json.dumps({"prompt": "2+2?", "final": "4"}) + "\n")
    with pytest.raises(ValueError, match=r"rl.jsonl: no ground-truth column among \['final', 'prompt'\]"):
        prompt_rows(str(path), "train", RLDataConfig())


def test_left_pad_equals_trls_pad():
    """dare.data.chat.left_pad (the prompts of every engine, without importing trl) is trl's ``pad`` with
    ``padding_side="left"``: the ids right-aligned after ``pad_id`` and a mask of 1 on each real token."""
    import random

    from trl.trainer.utils import pad

    from dare.data.chat import left_pad
    rng = random.Random(0)
    for _ in range(50):
        rows = [[rng.randrange(100) for _ in range(rng.randrange(1, 9))] for _ in range(rng.randrange(1, 6))]
        ids, mask = left_pad(rows, 7)
        assert torch.equal(ids, pad([torch.tensor(r) for r in rows], 7, padding_side="left"))
        assert torch.equal(mask, pad([torch.ones(len(r), dtype=torch.long) for r in rows], 0, padding_side="left"))
    assert left_pad([[5, 6], [9]], 0)[0].tolist() == [[5, 6], [0, 9]]
