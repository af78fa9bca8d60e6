"""Preference pairs (prompt, chosen, rejected) for offline preference optimisation (VRPO): loading, generated pairs
for tests and benches, and the collator that lays a micro-batch out for the likelihood estimators.

    pairs = pair_rows("HuggingFaceH4/ultrafeedback_binarized", "train_prefs", PreferenceDataConfig())
    pairs = pair_rows("task:addition", "train", config, limit=256)   # generated: chosen right, rejected wrong

``chosen`` / ``rejected`` hold text, or a chat conversation ending with the assistant's answer (UltraFeedback
binarized): the prompt is then the conversation before that answer (the same for both; ``prompt_key`` is not read).
``task:<name>`` paths generate pairs from ``dare.data.tasks``: chosen = the reference solution, rejected = the same
text with a near-miss answer (sums: off by one or by a wrong carry of ten; arithmetic: off by 1..9; sudoku: one cell
changed), so magnitude alone never tells the two apart. Questions are split as the tasks split them
(``dare.data.tasks.split_of``), so a split starting with ``test`` (the held-out pairs) shares no question with the
training pairs or the RL training prompts.
"""

import random
from dataclasses import dataclass

import torch

from .chat import encode, left_pad
from .loading import get_field, load_rows
from .sft import as_messages
from .tasks import TASKS, split_of


@dataclass
class PreferenceDataConfig:
    path: str = "HuggingFaceH4/ultrafeedback_binarized"  # parquet/jsonl/json file or folder, hub name, task:NAME
    split: str = "train_prefs"  # hub datasets; task:<name>: a split starting with "test" is the held-out one
    eval_path: str | None = None  # held-out pairs: validation margin and accuracy (None: no validation)
    eval_split: str = "test_prefs"  # the split of eval_path
    prompt_key: str = "prompt"  # text or chat messages; not read when chosen/rejected are conversations
    chosen_key: str = "chosen"  # the preferred response: text, or a conversation ending with it
    rejected_key: str = "rejected"  # the dispreferred response, in the same form
    system_prompt: str | None = None  # prepended as a system message to plain-text prompts
    max_prompt_length: int = 512  # longer prompts keep their last tokens (DARE: left truncation)
    max_response_length: int = 512  # longer responses keep their first tokens; R of normalise=padded_length
    limit: int | None = None  # use only the first N training pairs (task:<name>: how many to generate, default 256)
    eval_limit: int | None = None  # use only the first N held-out pairs (task:<name>: default 64)
    swap: bool = False  # train on (rejected, chosen), evaluate on the true pairs: a negative control (the margin falls)


def pair_rows(path: str, split: str, config: PreferenceDataConfig, limit: int | None = None,
              swap: bool = False) -> list[dict]:
    """``{"prompt": messages, "chosen": str, "rejected": str, "index": i}`` for every pair of one source, or of
    several joined by commas, in order; ``swap``: chosen and rejected exchanged."""
    out = []
    for part in path.split(","):
        part = part.strip()
        if part.startswith("task:"):
            out += make_pairs(part[5:], limit or (64 if split.startswith("test") else 256), split)
        else:
            out += _rows(part, split, config)
    out = out[:limit] if limit else out
    if swap:
        out = [{**row, "chosen": row["rejected"], "rejected": row["chosen"]} for row in out]
    return [{**row, "index": i} for i, row in enumerate(out)]


def _rows(path: str, split: str, config: PreferenceDataConfig) -> list[dict]:
    out = []
    for i, row in enumerate(load_rows(path, split)):
        try:
            context, chosen = _answer(get_field(row, config.chosen_key), config.chosen_key)
            other, rejected = _answer(get_field(row, config.rejected_key), config.rejected_key)
            if context != other:
                raise ValueError(f"columns {config.chosen_key!r} and {config.rejected_key!r} continue different "
                                 "conversations")
            prompt = context or as_messages(get_field(row, config.prompt_key), config.system_prompt)
        except (KeyError, ValueError) as e:
            raise ValueError(f"{path}, row {i}: {e.args[0]}") from None
        out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return out


def _answer(value, key: str) -> tuple[list[dict], str]:
    """``(conversation before the answer, answer text)`` of a text or a conversation ending with the answer."""
    if isinstance(value, str):
        return [], value
    if value is None:  # a file's rows share one schema: a row without the column reads None
        raise ValueError(f"no response in column {key!r}")
    messages = [dict(m) for m in value] if isinstance(value, (list, tuple)) else []
    if not messages or not all("role" in m and "content" in m for m in messages):
        raise ValueError(f"column {key!r} must hold text or a list of {{role, content}} messages, got {value!r:.200}")
    if messages[-1]["role"] != "assistant":
        raise ValueError(f"column {key!r}: the conversation must end with the assistant's answer, not "
                         f"{messages[-1]['role']!r}")
    return messages[:-1], messages[-1]["content"]


# --------------------------------------------------------------------------------------------- generated pairs

def _wrong_number(row, rng, candidates):
    value = int(row["reward_model"]["ground_truth"])
    wrong = rng.choice([v for v in candidates(value) if v != value])
    solution = row["extra_info"]["solution"]
    return solution.replace(f"= {value}.", f"= {wrong}.").replace(f"\\boxed{{{value}}}", f"\\boxed{{{wrong}}}")


def _wrong_grid(row, rng):
    truth = row["reward_model"]["ground_truth"]
    cell = rng.randrange(len(truth))
    wrong = truth[:cell] + rng.choice([d for d in "1234" if d != truth[cell]]) + truth[cell + 1:]
    return row["extra_info"]["solution"].replace(truth, wrong)


def _near_miss(value: int) -> list[int]:
    """Off by one, or the tens digit off by one (a dropped or spurious carry)."""
    return [v for v in (value - 1, value + 1, value - 10, value + 10) if v >= 0]


WRONG = {"addition": lambda row, rng: _wrong_number(row, rng, _near_miss),
         "sum4": lambda row, rng: _wrong_number(row, rng, _near_miss),
         "arithmetic": lambda row, rng: _wrong_number(row, rng, lambda v: range(v - 9, v + 10)), "sudoku": _wrong_grid}


def make_pairs(name: str, n: int, split: str = "train", seed: int = 0) -> list[dict]:
    """``n`` generated pairs of task ``name``: a split starting with ``test`` draws from the held-out questions."""
    if name not in WRONG:
        raise ValueError(f"No generated preference pairs for task {name!r}; known: {sorted(WRONG)}")
    rng, out = random.Random(f"pairs-{name}-{split}-{seed}"), []
    wanted = "test" if split.startswith("test") else "train"
    while len(out) < n:
        row = TASKS[name](rng, len(out), split)
        if split_of(row["prompt"][-1]["content"]) == wanted:
            out.append({"prompt": row["prompt"], "chosen": row["extra_info"]["solution"],
                        "rejected": WRONG[name](row, rng)})
    return out


# --------------------------------------------------------------------------------------------------- collator

class PreferenceCollator:
    """Tokenises m pairs into 2m rows — the m chosen responses first, then the m rejected ones — in the estimators'
    batch contract (``dare.likelihood``): ``prompt_ids``/``prompt_mask`` left-padded (the chat template applied),
    ``completion_ids``/``completion_mask`` right-padded (response + turn terminator + EOS, as SFT trains),
    ``loss_mask`` = ``completion_mask`` and an ``attention_mask`` that attends no padding. Also ``index`` (the pairs'
    dataset indices, which seed their noise), ``padded_length`` (R = max_response_length for every row) and
    ``truncated`` (1 for a pair cut to the length limits)."""

    def __init__(self, tokenizer, family, config: PreferenceDataConfig):
        if config.max_prompt_length < 1 or config.max_response_length < 1:
            raise ValueError(f"max_prompt_length and max_response_length must be >= 1, got "
                             f"{config.max_prompt_length} and {config.max_response_length}")
        self.tokenizer, self.family, self.config = tokenizer, family, config
        self.turn_end = [i for i in family.stop_ids if i != family.eos_id][:1]

    def __call__(self, pairs: list[dict]) -> dict:

        config, pad = self.config, self.family.pad_id
        encoded = encode(self.tokenizer, [p["prompt"] for p in pairs])
        cut = [len(ids) > config.max_prompt_length for ids in encoded]
        prompts = [ids[-config.max_prompt_length:] for ids in encoded]
        responses = []
        for key in ("chosen", "rejected"):
            for i, p in enumerate(pairs):
                ids = self.tokenizer(p[key], add_special_tokens=False)["input_ids"] + self.turn_end
                ids.append(self.family.eos_id)
                cut[i] |= len(ids) > config.max_response_length
                responses.append(ids[:config.max_response_length])
        prompt_ids, prompt_mask = left_pad(prompts + prompts, pad)
        length = max(map(len, responses))
        completion_ids = torch.full((len(responses), length), pad, dtype=torch.long)
        completion_mask = torch.zeros_like(completion_ids)
        for r, c in enumerate(responses):
            completion_ids[r, :len(c)], completion_mask[r, :len(c)] = torch.tensor(c), 1
        return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
                "completion_mask": completion_mask, "loss_mask": completion_mask.clone(),
                "attention_mask": torch.cat([prompt_mask, completion_mask], 1),
                "padded_length": torch.full((len(responses),), float(config.max_response_length)),
                "index": torch.tensor([p["index"] for p in pairs]), "truncated": torch.tensor(cut, dtype=torch.float)}
