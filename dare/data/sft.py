"""SFT examples: a chat-formatted prompt and the response the model learns to write.

Each example becomes ``prompt_ids + response_ids + turn terminator + EOS`` (the family's chat template renders the
prompt with the generation prompt; e.g. LLaDA: ``... <|eot_id|><|endoftext|>``), then the collator right-pads with
EOS, so a model learns to close its turn as the chat template expects (the upstream models' chat format).

Packing (``pack=True``): the collator places the examples of each micro-batch, in order, each into the first row with
room (first fit; an example is never split), in rows of at most ``max_length`` tokens (padded to ``max_length``, or
with ``pad_to="longest"`` to the fullest row), and adds ``segment_ids`` (the example's index in the micro-batch, -1 on
padding) and ``position_ids`` (0 at each example's first token; ``Family.logits`` derives the same from the segments).
Attention, noise and normalisers stay per example (``dare.objectives``), so a packed batch has the loss of the same
examples unpacked; the micro-batch still counts examples, so a recipe's batch sizes keep their meaning, and packing
only saves work when several examples fit in a row (sdpa still scores every pair of a row, across examples too:
``bench/bench_packing.py``). EOS: a packed row has no per-example EOS tail. Every family
trains each example's own turn terminator and EOS (they end its response) and never the padding after the last
example: LLaDA2 loses nothing (it never trained its pads); LLaDA, Dream and SDAR learn to end their answer but no longer
to fill the rest of a fixed-length canvas with EOS (upstream's EOS padding), and their answer-length normaliser is the
response length. Decoding cuts a completion at its first stop token; keep ``pack=False`` for the upstream recipe.
"""

import warnings
from dataclasses import dataclass, replace

import torch

from ..diffusion import recipe_for, sft_masks
from .images import batch_pictures, drawing_text, is_drawing, load_image, row_image_bytes, row_images
from .loading import LocalDir, get_field, has_field


@dataclass
class SFTDataConfig:
    path: str = "openai/gsm8k:main"  # parquet/jsonl/json file or folder, hub name, or task:NAME
    # read the public datasets (dare/data/public.py) from their local copies here, e.g. ../shared/data/sft
    local_dir: LocalDir = None
    split: str = "train"  # hub datasets only
    # column holding the prompt (text or a list of chat messages; a.b = nested); None: found from the columns (the
    # formats of sft_format: TRL's prompt/completion and messages, DARE's task and reference schemas)
    prompt_key: str | None = None
    # column holding the response text (a drawing row: its picture); None: found with the prompt's
    response_key: str | None = None
    # the final answer the rewards compare with (only for train_sft.py --eval-generate)
    answer_key: str = "reward_model.ground_truth"
    system_prompt: str | None = None  # prepended as a system message when the prompt is plain text
    max_length: int = 1024  # prompt + response tokens per example
    # an example longer than max_length: "error", or cut the response ("right") / prompt ("left")
    truncation: str = "error"
    # "max_length" (upstream: the EOS tail teaches the model to end) or "longest" in the batch
    pad_to: str = "max_length"
    # several examples per max_length row, each attended and noised on its own; no EOS tail (dare/data/sft.py)
    pack: bool = False
    # train the EOS run after each response (true: LLaDA's way, which teaches a model to fill the canvas after its
    # stop; false: padding, as LLaDA-V, LLaDA2 and DiffusionGemma train); None: the family's recipe. A tiny model
    # trained from scratch needs it to decode a canvas (a LLaDA-V checkpoint learnt it as LLaDA-Instruct)
    eos_tail: bool | None = None
    limit: int | None = None  # use only the first N rows
    eval_path: str | None = None  # held-out examples (same formats and keys as path): eval_loss every eval_steps
    eval_split: str = "test"  # split of a hub eval dataset (task:<name>: test = the held-out questions)
    eval_limit: int | None = None  # use only the first N held-out rows

    def __post_init__(self):
        for name, allowed in (("pad_to", ("max_length", "longest")), ("truncation", ("error", "right", "left"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"data.{name} must be one of {allowed}, got {getattr(self, name)!r}")


def as_messages(prompt, system_prompt):
    if isinstance(prompt, str):
        return ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
            [{"role": "user", "content": prompt}]
    messages = [dict(m) for m in prompt]
    if not messages or not all("role" in m and "content" in m for m in messages):
        raise ValueError(f"A prompt must be text or a list of {{role, content}} messages, got {prompt!r:.200}")
    return messages


# (name, prompt column, response column) of the formats read without key flags, in the order they are tried; TRL's
# conversational rows (``messages``, or ShareGPT's ``conversations``) become prompt/completion rows first
SFT_FORMATS = (("prompt-completion (TRL)", "prompt", "completion"),
               ("task (DARE's task:NAME rows)", "prompt", "extra_info.solution"),
               ("reference (question / answer in extra_info)", "extra_info.question", "extra_info.answer"))


def sft_format(row: dict) -> tuple[str, str, str]:
    """``(format, prompt key, response key)`` of a row read without key flags, or a one-line error naming its columns
    and the formats accepted."""
    for found in SFT_FORMATS:
        if has_field(row, found[1]) and has_field(row, found[2]):
            return found
    accepted = "; ".join(f"{name}: {p!r} + {r!r}" for name, p, r in SFT_FORMATS)
    raise ValueError(f"Cannot tell the SFT format of columns {sorted(row)}: accepted are conversational (TRL): "
                     f"'messages' (or ShareGPT 'conversations'); {accepted}; or name yours with --data.prompt-key and "
                     "--data.response-key")


def conversation_turns(batch: dict) -> dict:
    """Conversational rows (``messages``: role/content dicts, ShareGPT's from/value read too) as one prompt/completion
    row per assistant turn, the conversation before it as the prompt (LLaDA's multi-turn SFT: every assistant turn is
    learned, each from its own history)."""
    from trl.data_utils import maybe_convert_to_chatml  # here: --help imports this module and trl takes seconds

    prompts, completions = [], []
    for messages in batch["messages"]:
        messages = maybe_convert_to_chatml({"messages": [dict(m) for m in messages]})["messages"]
        for turn, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            if turn == 0:
                raise ValueError("A conversation opens with an assistant turn: nothing before it to learn it from")
            prompts.append(messages[:turn])
            completions.append(message["content"])
    return {"prompt": prompts, "completion": completions}


def completion_text(response, key: str) -> str:
    """The response as text: a string, or TRL's conversational completion (one assistant message)."""
    if isinstance(response, list) and len(response) == 1 and isinstance(response[0], dict) and \
            response[0].get("role") == "assistant":
        response = response[0].get("content")
    if not isinstance(response, str):
        raise ValueError(f"Column {key!r} must hold text or one assistant message, got {type(response).__name__}")
    return response


def as_sft_rows(rows, config: SFTDataConfig):
    """``(rows, config)`` ready for ``tokenize_sft``: conversations cut into prompt/completion rows and the keys found
    from the columns, unless given."""
    if config.prompt_key and config.response_key:
        return rows, config
    if config.prompt_key or config.response_key:
        raise ValueError("--data.prompt-key and --data.response-key go together: give both, or neither to have the "
                         "format found from the columns")
    if "conversations" in rows.column_names and "messages" not in rows.column_names:
        rows = rows.rename_column("conversations", "messages")
    if "messages" in rows.column_names:
        rows = rows.map(conversation_turns, batched=True, remove_columns=rows.column_names, desc="assistant turns")
    _, prompt, response = sft_format(rows[0])
    return rows, replace(config, prompt_key=prompt, response_key=response)


def tokenize_sft(row: dict, tokenizer, family, config: SFTDataConfig, reader=None, base=None) -> dict:
    """``{"input_ids", "prompt_length", "response_length"}`` for one row; ``truncated`` says whether it was cut. With
    a picture ``reader`` (``dare.models.pictures``; ``base``: the folder image paths are relative to), each ``<image>``
    of the prompt becomes its picture's placeholders (numbered from 0 in the example; the collator renumbers them in
    the batch) and ``images`` keeps the row's picture entries. A drawing row (``is_drawing``) is the reader's
    ``drawing_example`` of its picture."""
    if is_drawing(row):
        return drawing_example(row, tokenizer, config, reader, base)
    prompt = get_field(row, config.prompt_key)
    response = completion_text(get_field(row, config.response_key), config.response_key)
    messages = as_messages(prompt, config.system_prompt)
    extra = {}
    if reader is None:
        prompt_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"]
    else:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        where = f"a row of prompt {text[:60]!r}"
        raw = row_image_bytes(row, base, where)  # kept as bytes: the collator decodes them again
        images = row_images({"images": raw}, text, where=where)
        prompt_ids = reader.prompt_ids(tokenizer, text, images)
        extra = {"images": raw}
    turn_end = [i for i in family.stop_ids if i != family.eos_id][:1]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + turn_end + [family.eos_id]
    excess = len(prompt_ids) + len(response_ids) - config.max_length
    truncated = excess > 0
    if truncated:
        if config.truncation == "error":
            raise ValueError(f"Example of {len(prompt_ids)} prompt + {len(response_ids)} response tokens exceeds "
                             f"max_length={config.max_length}; raise max_length or set truncation to right/left")
        if config.truncation == "left" and extra.get("images"):
            raise ValueError(f"An example of {len(prompt_ids)} prompt + {len(response_ids)} response tokens exceeds "
                             f"max_length={config.max_length}, and cutting its prompt would cut a picture: raise "
                             "max_length or truncate right")
        if config.truncation == "right" and excess < len(response_ids):
            response_ids = response_ids[:-excess]
        elif config.truncation == "left" and excess < len(prompt_ids):
            prompt_ids = prompt_ids[excess:]
        else:  # nothing of the response would be left to learn from: the example is dropped (and counted)
            return {"input_ids": [], "prompt_length": 0, "response_length": 0, "truncated": True, **extra}
    return {"input_ids": prompt_ids + response_ids, "prompt_length": len(prompt_ids),
            "response_length": len(response_ids), "truncated": truncated, **extra}


def drawing_example(row: dict, tokenizer, config: SFTDataConfig, reader, base=None) -> dict:
    """A drawing row's example: its text-to-image prompt, then the codes of its picture (the response column: an
    image entry, e.g. a data URI) and ``<|eoi|>`` (``PictureTokens.drawing_example``)."""
    text = drawing_text(get_field(row, config.prompt_key))
    if not hasattr(reader, "drawing_example"):
        raise ValueError(f"a drawing row ({text[:40]!r}...) for a model that draws none (MMaDA does)")
    picture = load_image(get_field(row, config.response_key), base, where=f"the drawing of {text[:60]!r}")
    example = reader.drawing_example(tokenizer, text, picture)
    if len(example["input_ids"]) > config.max_length:
        raise ValueError(f"a drawing example is {len(example['input_ids'])} tokens (its text area, then the picture's "
                         f"codes), more than max_length={config.max_length}: raise data.max_length")
    return {**example, "truncated": False}


class SFTCollator:
    """Right-pads tokenized examples with EOS and adds ``loss_mask`` / ``attention_mask`` from the family's recipe
    (LLaDA/Dream/SDAR train on the EOS tail; LLaDA2 excludes it from attention and loss); with ``config.pack``, packs
    them (module docstring)."""

    def __init__(self, family, config: SFTDataConfig, reader=None):
        """``reader`` (``dare.models.pictures``): examples with pictures get ``pixel_values`` / ``image_sizes``, their
        placeholders renumbered over the batch."""
        self.family, self.config, self.recipe, self.reader = family, config, recipe_for(family), reader
        if config.eos_tail is not None:
            self.recipe = replace(self.recipe, mask_pads=config.eos_tail)

    def __call__(self, examples: list[dict]) -> dict:
        if any("uncond_ids" in e for e in examples):
            return self.drawings(examples)
        if self.config.pack:
            if any(e.get("images") for e in examples):
                raise ValueError("data.pack does not take pictures: unset it")
            return self.pack(examples)
        batch = self.pad(examples)
        if self.reader is None or not self.reader.features:  # MMaDA's pictures are tokens: nothing to decode again
            return batch
        # the batch's pictures in order, each row's placeholders renumbered after the rows before it
        own = [[load_image(x, where=f"example {r} of the batch") for x in e.get("images") or []]
               for r, e in enumerate(examples)]
        batch["input_ids"], inputs = batch_pictures(self.reader, batch["input_ids"], own)
        return {**batch, **inputs}

    def pad(self, examples: list[dict]) -> dict:
        prompt = torch.tensor([e["prompt_length"] for e in examples])
        response = torch.tensor([e["response_length"] for e in examples])
        if self.family.noise == "uniform":  # whole canvases after the prompt, EOS-filled (Google's canvas chunker)
            canvas = self.family.block_size
            response = -(-response // canvas) * canvas
        longest = int((prompt + response).max())
        length = max(self.config.max_length, longest) if self.config.pad_to == "max_length" else longest
        ids = torch.full((len(examples), length), self.family.pad_id, dtype=torch.long)
        for r, e in enumerate(examples):
            ids[r, len(e["input_ids"]):prompt[r] + response[r]] = self.family.eos_id
            ids[r, :len(e["input_ids"])] = torch.tensor(e["input_ids"])
        loss_mask, attention_mask = sft_masks(prompt, response, length, self.recipe)
        return {"input_ids": ids, "loss_mask": loss_mask, "attention_mask": attention_mask}

    def drawings(self, examples: list[dict]) -> dict:
        """Drawing examples (``drawing_example``, all of one length): the codes are trained (not ``<|eoi|>``), the
        text's padding is out of the attention, and ``uncond_ids`` / ``uncond_attention_mask`` hold each row without
        its text (the trainer drops the text of some: ``dare.diffusion.DRAWING_TEXT_DROPOUT``)."""
        if self.config.pack or not all("uncond_ids" in e for e in examples):
            raise ValueError("drawing examples are neither packed nor mixed with text ones: unset data.pack, or train "
                             "drawings and text in separate runs")
        ids = torch.tensor([e["input_ids"] for e in examples])
        prompt, response = examples[0]["prompt_length"], examples[0]["response_length"]
        attention = torch.ones_like(ids)
        attention[:, :prompt] = torch.tensor([e["prompt_attention"] for e in examples])
        uncond, uncond_attention = ids.clone(), attention.clone()
        uncond[:, :prompt] = torch.tensor([e["uncond_ids"] for e in examples])
        uncond_attention[:, :prompt] = torch.tensor([e["uncond_attention"] for e in examples])
        loss_mask = torch.zeros_like(ids)
        loss_mask[:, prompt:prompt + response - 1] = 1
        return {"input_ids": ids, "loss_mask": loss_mask, "attention_mask": attention, "uncond_ids": uncond,
                "uncond_attention_mask": uncond_attention}

    def pack(self, examples: list[dict]) -> dict:
        rows, room = [], []  # the examples of each row, the tokens left in it
        for n, e in enumerate(examples):
            size = len(e["input_ids"])
            if size > self.config.max_length:
                raise ValueError(f"An example of {size} tokens does not fit a packed row of max_length="
                                 f"{self.config.max_length} (tokenize_sft truncates or refuses it)")
            r = next((r for r, left in enumerate(room) if left >= size), len(rows))
            if r == len(rows):
                rows.append([])
                room.append(self.config.max_length)
            rows[r].append(n)
            room[r] -= size
        width = self.config.max_length if self.config.pad_to == "max_length" else self.config.max_length - min(room)
        ids = torch.full((len(rows), width), self.family.pad_id, dtype=torch.long)
        segment_ids = torch.full_like(ids, -1)
        loss_mask, position_ids = torch.zeros_like(ids), torch.zeros_like(ids)
        for r, row in enumerate(rows):
            start = 0
            for n in row:
                e, end = examples[n], start + len(examples[n]["input_ids"])
                ids[r, start:end] = torch.tensor(e["input_ids"])
                segment_ids[r, start:end] = n
                position_ids[r, start:end] = torch.arange(end - start)
                loss_mask[r, start + e["prompt_length"]:end] = 1  # the response with its own turn end and EOS
                start = end
        return {"input_ids": ids, "loss_mask": loss_mask, "attention_mask": (segment_ids >= 0).long(),
                "segment_ids": segment_ids, "position_ids": position_ids}


def tokenize_dataset(rows, tokenizer, family, config: SFTDataConfig, reader=None, base=None):
    """Tokenize every row (datasets.map keeps a cache; ``reader`` / ``base``: pictures, as ``tokenize_sft``); warns
    with the count of truncated examples and drops, with their count, those that truncation would empty (right: a
    prompt that alone fills max_length)."""
    rows, config = as_sft_rows(rows, config)
    columns = rows.column_names
    drawings = sum(map(is_drawing, ({"extra_info": e} for e in rows["extra_info"]))) if "extra_info" in columns else 0
    if 0 < drawings < len(rows):
        raise ValueError(f"{drawings} of {len(rows)} rows are drawings (extra_info.task 'draw'): train drawings and "
                         "text in separate runs")
    out = rows.map(lambda r: tokenize_sft(r, tokenizer, family, config, reader, base), remove_columns=columns,
                   desc="tokenizing")
    cut = sum(out["truncated"])
    kept = out.filter(lambda r: r["response_length"] > 0)
    if len(kept) < len(out):
        left = "response" if config.truncation == "right" else "prompt"
        warnings.warn(f"{len(out) - len(kept)} of {len(out)} examples dropped: cut to max_length={config.max_length}"
                      f" from the {config.truncation} they would keep no {left}", stacklevel=2)
        if not len(kept):
            raise ValueError(f"no example fits max_length={config.max_length}: raise data.max_length")
    if cut > len(out) - len(kept):
        warnings.warn(f"{cut - (len(out) - len(kept))} of {len(out)} examples were truncated to "
                      f"max_length={config.max_length}", stacklevel=2)
    return kept
