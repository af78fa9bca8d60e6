"""RL prompts in the reference parquet schema (``prompt`` chat messages, ``reward_model.ground_truth``,
``data_source``, ``extra_info``) or any file / hub dataset whose columns the config names.

Every row becomes ``{"prompt": messages, "ground_truth": str, "data_source": str, "extra_info": dict}``. A row its
default reward cannot score (no ground truth; code tests of no known format or that do not parse) is dropped with
a printed count per file and reason; ``strict`` makes it an error that names the row and the column instead.
"""

from collections import defaultdict
from dataclasses import dataclass

from ..rewards import answer_instruction, unscorable
from .images import IMAGE, encode_pictured, image_base, is_drawing, load_image, pictured_prompt, row_image_bytes
from .loading import LocalDir, get_field, has_field, load_rows
from .sft import as_messages


@dataclass
class RLDataConfig:
    path: str = "openai/gsm8k:main"  # parquet/jsonl/json file or folder, hub name, or task:NAME; a,b = both
    # read the public datasets (dare/data/public.py) from their local copies here, e.g. ../shared/data/rl
    local_dir: LocalDir = None
    split: str = "train"  # hub datasets only
    eval_path: str | None = None  # held-out prompts for periodic validation (None: no validation); a,b = both
    eval_split: str = "test"  # split of a hub eval dataset
    prompt_key: str = "prompt"  # text or a list of chat messages; a.b = nested
    # column holding the ground truth the reward compares with; None: the first of ANSWER_KEYS a file has (DARE's
    # reference schema, then TRL's usual columns)
    answer_key: str | None = None
    # column naming each row's source (its default reward); "": every row is source "default"; a file without the
    # column is source "default" too
    source_key: str = "data_source"
    extra_key: str = "extra_info"  # optional dict handed to the reward (numbers, puzzle, tests...)
    system_prompt: str | None = None  # prepended as a system message to plain-text prompts
    max_prompt_length: int = 512  # prompts longer than this (tokens, chat template applied) are dropped
    # auto: ask for the format the row's default reward scores where the prompt does not (\boxed{} for math); none:
    # prompts as they are (the reference's bare questions); other text: appended (after a newline) to every prompt
    answer_instruction: str = "auto"
    limit: int | None = None  # use only the first N training rows
    eval_limit: int | None = None  # use only the first N validation rows
    strict: bool = False  # refuse a file with a row the reward cannot score (default: drop such rows and say so)


def prompt_rows(path: str, split: str, config: RLDataConfig, limit: int | None = None,
                images: bool = False) -> list[dict]:
    """Rows of one source, or of several joined by commas (``a.parquet,b.parquet``), in order. ``images``: rows may
    hold pictures (a model that reads them): a row's ``images`` become their encoded bytes, checked readable and one
    per ``<image>`` of its prompt (``dare.data.images``); otherwise such rows are refused."""
    out = []
    for part in path.split(","):
        out += _rows(part.strip(), split, config, images)
    return out[:limit] if limit else out


ANSWER_KEYS = ("reward_model.ground_truth", "ground_truth", "answer", "solution")


def answer_key(row: dict, config: RLDataConfig) -> str:
    """The ground-truth column: ``config.answer_key``, or the first of ``ANSWER_KEYS`` the row has."""
    if config.answer_key:
        return config.answer_key
    found = next((key for key in ANSWER_KEYS if has_field(row, key)), None)
    if found is None:
        raise ValueError(f"no ground-truth column among {sorted(row)}: the reward needs one of {list(ANSWER_KEYS)}, "
                         "or name yours with --data.answer-key")
    return found


def _rows(path: str, split: str, config: RLDataConfig, images: bool = False) -> list[dict]:
    out, dropped = [], defaultdict(list)
    rows = load_rows(path, split, config.local_dir, images=images)
    base = image_base(path) if images else None
    try:
        answer = answer_key(rows[0], config)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    sourced = bool(config.source_key) and has_field(rows[0], config.source_key)
    for i, row in enumerate(rows):
        try:
            truth = get_field(row, answer)
            prompt = as_messages(get_field(row, config.prompt_key), config.system_prompt)
            source = str(get_field(row, config.source_key)) if sourced else "default"
            pictures = checked_pictures(row, prompt, base, f"row {i}") if images else []
        except (KeyError, ValueError, FileNotFoundError) as e:
            raise ValueError(f"{path}, row {i}: {e}") from None
        extra = (row.get(config.extra_key) if config.extra_key else None) or {}
        why = unscorable(truth, source, {**extra, "prompt": prompt})
        if why:
            if config.strict:
                raise ValueError(f"{path}, row {i}: {why} (column {answer!r}); the reward cannot score "
                                 "it (without data.strict such rows are dropped)")
            dropped[why].append(i)
            continue
        row = {"prompt": prompt, "ground_truth": str(truth), "data_source": source, "extra_info": extra}
        if pictures:
            row["images"] = pictures
        out.append(instruct(row, config.answer_instruction))
    if dropped:
        count = sum(map(len, dropped.values()))
        listed = lambda rows: ", ".join(map(str, rows[:8])) + (", ..." if len(rows) > 8 else "")
        reasons = "; ".join(f"{len(rows)} {why} (rows {listed(rows)})" for why, rows in dropped.items())
        print(f"{path}: dropped {count} of {len(out) + count} rows the reward cannot score: {reasons}")
    return out


def checked_pictures(row: dict, prompt: list, base, where: str) -> list[bytes]:
    """The encoded bytes of ``row``'s pictures, each readable, one per ``<image>`` of its ``prompt`` messages."""
    pictures = row_image_bytes(row, base, where)
    text = "".join(m["content"] for m in prompt if isinstance(m.get("content"), str))
    if text.count(IMAGE) != len(pictures):
        raise ValueError(f"the prompt has {text.count(IMAGE)} {IMAGE} placeholder(s) but the row holds "
                         f"{len(pictures)} image(s)")
    for k, data in enumerate(pictures):
        load_image(data, where=f"{where} image {k}")
    return pictures


def instruct(row: dict, mode: str = "auto") -> dict:
    """``row`` with the answer-format instruction (see ``RLDataConfig.answer_instruction``) appended to its last
    user message."""
    users = [i for i, m in enumerate(row["prompt"]) if m.get("role") == "user"]
    if mode == "none" or not users:
        return row
    last = row["prompt"][users[-1]]
    text = answer_instruction(last["content"], row["data_source"], row["extra_info"].get("task")) \
        if mode == "auto" else "\n" + mode
    if not text:
        return row
    prompt = [dict(m) for m in row["prompt"]]
    prompt[users[-1]]["content"] = last["content"] + text
    return {**row, "prompt": prompt}


def fitting_prompts(tokenizer, path: str, split: str, config: RLDataConfig, limit: int | None,
                    reader=None) -> tuple[list[dict], int]:
    """The rows of ``path`` whose prompt fits ``config.max_prompt_length`` tokens (chat template applied, a picture
    counted as the placeholders it takes: ``reader``, ``dare.models.pictures``, of a model that reads pictures; the
    others dropped and counted), and the longest of them."""
    rows = prompt_rows(path, split, config, limit, images=reader is not None)
    lengths = encode_pictured(tokenizer, reader, [pictured_prompt(r) for r in rows], lengths=True)
    kept = [(r, n) for r, n in zip(rows, lengths, strict=True) if n <= config.max_prompt_length]
    if len(kept) < len(rows):
        print(f"{path}: dropped {len(rows) - len(kept)} of {len(rows)} prompts longer than "
              f"{config.max_prompt_length} tokens")
    if not kept:
        raise ValueError(f"{path}: no prompt fits data.max_prompt_length={config.max_prompt_length}")
    return [r for r, _ in kept], max(n for _, n in kept)


def check_drawings(rows: list[dict], algorithm) -> None:
    """Drawing rows (``extra_info.task`` ``draw``) take the algorithms that score a completion by masking it: one that
    replays the masked sampler's steps is refused in one line (a drawing is decoded by MaskGIT)."""
    if any(is_drawing(r) for r in rows) and (
            algorithm.needs_steps or algorithm.needs_sampler):
        why = algorithm.needs_sampler or algorithm.needs_steps
        raise ValueError(f"{algorithm.name} replays the masked sampler's steps ({why}); drawings are decoded by "
                         "MaskGIT: train them with an algorithm that masks completions (d1, maskgrpo, unigrpo, ...)")
