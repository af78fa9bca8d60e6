"""Images of multimodal rows: what a row may hold and how it is read, with one-line errors naming the row.

A row's ``images`` is a list, one entry per ``<image>`` placeholder in its prompt, in order. An entry is PNG / JPEG
bytes, ``{"bytes": ..., "path": ...}`` (what ``datasets.Image`` stores), a file path (relative to the data file's
folder unless absolute) or a ``data:image/...;base64,...`` URI (jsonl rows written by ``dare.data.tasks.write_task``).

    images = row_images(row, base=Path("data"), where="data/train.parquet row 12")
"""

import base64
import io
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .chat import encode

IMAGE = "<image>"  # where a picture stands in a prompt (LLaVA's and LLaDA-V's placeholder)

_URI = re.compile(r"data:image/[\w.+-]+;base64,(.*)", re.S)


def load_image(value, base: Path | None = None, where: str = "image"):
    """One image entry as an RGB ``PIL.Image``; a missing or unreadable one raises naming ``where``."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(value, Image.Image):
        return value.convert("RGB")
    value = image_bytes(value, base, where)
    try:
        image = Image.open(io.BytesIO(value))
        image.load()
    except (UnidentifiedImageError, OSError) as e:
        raise ValueError(f"{where}: the image cannot be read ({e})") from None
    return image.convert("RGB")


def image_bytes(value, base: Path | None = None, where: str = "image") -> bytes:
    """The encoded bytes of one image entry (a file read, a data URI decoded), unchecked."""
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            value = value["bytes"]
        elif value.get("path"):
            value = value["path"]
        else:
            raise ValueError(f"{where}: an image entry needs 'bytes' or 'path', got keys {sorted(value)}")
    if isinstance(value, str) and (uri := _URI.fullmatch(value.strip())):
        value = base64.b64decode(uri.group(1))
    if isinstance(value, str):
        path = Path(value) if base is None or Path(value).is_absolute() else base / value
        if not path.is_file():
            raise FileNotFoundError(f"{where}: image file {str(path)!r} not found")
        value = path.read_bytes()
    if not isinstance(value, (bytes, bytearray)):
        raise ValueError(f"{where}: an image is bytes, a path, a data URI or {{'bytes', 'path'}}, got "
                         f"{type(value).__name__}")
    return bytes(value)


def image_base(path: str | None) -> Path | None:
    """The folder a data source's relative image paths start from: a file's folder, a folder itself, else none."""
    if not path or ":" in path and not Path(path).exists():
        return None
    local = Path(path)
    return local if local.is_dir() else local.parent


def row_image_bytes(row: dict, base: Path | None = None, where: str = "row") -> list[bytes]:
    """The encoded bytes of ``row``'s image entries (files read once), in order."""
    entries = row.get("images") or []
    if not isinstance(entries, (list, tuple)):
        entries = [entries]
    return [image_bytes(e, base, f"{where} image {i}") for i, e in enumerate(entries)]


def row_images(row: dict, prompt: str, base: Path | None = None, where: str = "row") -> list:
    """The images of ``row`` as RGB ``PIL.Image``s, checked against the ``<image>`` placeholders of its ``prompt``
    text (one image each, in order)."""
    raw = row_image_bytes(row, base, where)
    wanted = prompt.count(IMAGE)
    if wanted != len(raw):
        raise ValueError(f"{where}: the prompt has {wanted} {IMAGE} placeholder(s) but the row holds {len(raw)} "
                         "image(s)")
    return [load_image(b, where=f"{where} image {i}") for i, b in enumerate(raw)]


@dataclass(frozen=True, eq=False)
class PicturePrompt:
    """A prompt (text or chat messages) with its pictures (PIL, one per ``<image>``, in order): what the engines
    decode and the rollouts keep, passed through algorithms and trainers like any prompt."""

    prompt: str | list
    pictures: tuple


@dataclass(frozen=True)
class DrawPrompt:
    """A request to draw ``text`` as a picture (a model that draws: MMaDA), what a drawing task's rows decode to: the
    engine's completion is the picture's codes, its text the picture as a PNG data URI."""

    text: str


def encode_pictured(tokenizer, reader, prompts: list, lengths: bool = False) -> list:
    """``dare.data.chat.encode`` for prompts some of which are ``PicturePrompt``s, read by the model's ``reader``
    (``dare.models.pictures``): LLaDA-V's each ``<image>`` becomes its picture's placeholders, numbered from 0 in each
    prompt (``batch_pictures`` renumbers them over a batch); MMaDA's, its picture's tokens; a ``DrawPrompt``, its
    text-to-image prompt up to ``<|soi|>``. ``lengths``: only each prompt's number of ids (MMaDA's without reading its
    picture)."""
    out = []
    for prompt in prompts:
        if isinstance(prompt, DrawPrompt):
            if not hasattr(reader, "drawing_prompts"):
                raise ValueError(f"a drawing task ({prompt.text[:40]!r}...) for a model that draws none (MMaDA does)")
            laid = reader.drawing_prompts(tokenizer, [prompt.text])
            ids = laid["ids"][0, :laid["start"]].tolist()  # up to <|soi|>: the rollout's prompt
            out.append(len(ids) if lengths else ids)
            continue
        if not isinstance(prompt, PicturePrompt):
            ids = encode(tokenizer, [prompt])[0]
            out.append(len(ids) if lengths else ids)
            continue
        text = prompt.prompt if isinstance(prompt.prompt, str) else tokenizer.apply_chat_template(
            prompt.prompt, add_generation_prompt=True, tokenize=False)
        read = reader.prompt_length if lengths else reader.prompt_ids
        out.append(read(tokenizer, text, prompt.pictures))
    return out


def batch_pictures(reader, ids, pictures: list) -> tuple:
    """Rows' ids whose placeholders number each row's own features from 0, and each row's pictures (rows of one prompt
    may share one list object: its features are computed once) -> the ids renumbered over the batch's distinct
    picture lists, and the model's picture inputs for them (``reader``: ``dare.models.pictures``; none without
    pictures)."""
    ids, lists = number_pictures(ids, pictures)
    return ids, reader([p for _, _, own in lists for p in own]) if lists else {}


def number_pictures(ids, pictures: list) -> tuple:
    """``batch_pictures`` without reading: the renumbered ids and the distinct picture lists as ``(first feature,
    features, pictures)`` in feature order (what ``used_pictures`` takes)."""
    ids, first_of, lists, total = ids.clone(), {}, [], 0
    for row, own in enumerate(pictures):
        slots = ids[row] < 0
        if id(own) not in first_of:
            first_of[id(own)] = total
            count = int(slots.sum())
            if count:
                lists.append((total, count, own))
            total += count
        ids[row, slots] -= first_of[id(own)]
    return ids, lists


def used_pictures(reader, ids, lists: list) -> dict:
    """The model's picture inputs for rows ``ids`` of a batch numbered by ``number_pictures`` (a micro-batch of a
    rollout, whose ids may sit in several tensors: they stay as they are): the pictures those rows use, and
    ``picture_at``, the batch's numbers of their features (none if they use none)."""
    feature, images, at = -ids - 1, [], []
    for first, count, own in lists:
        if bool(((ids < 0) & (feature >= first) & (feature < first + count)).any()):
            images += own
            at.append(torch.arange(first, first + count))
    return {**reader(images), "picture_at": torch.cat(at)} if images else {}


def is_drawing(row: dict) -> bool:
    """Whether a row asks for a drawing (``extra_info.task`` ``draw``: its solution is a picture)."""
    return (row.get("extra_info") or {}).get("task") == "draw"


def drawing_text(prompt) -> str:
    """What a drawing row asks to draw: its prompt text, or its last message's."""
    return prompt if isinstance(prompt, str) else prompt[-1]["content"]


def pictured_prompt(row: dict):
    """What an engine decodes for an RL or benchmark row: its prompt, with its pictures (``row["images"]``, encoded
    bytes) as a ``PicturePrompt`` when it has any; a drawing task's row (``extra_info.task`` ``draw``) as a
    ``DrawPrompt`` of its last message."""
    if is_drawing(row):
        prompt = row["prompt"]
        return DrawPrompt(drawing_text(prompt))
    if not row.get("images"):
        return row["prompt"]
    return PicturePrompt(row["prompt"], tuple(load_image(b) for b in row["images"]))


def holds_images(rows) -> bool:
    """Whether a ``datasets.Dataset`` has an ``images`` column with an image in it (read from the Arrow column,
    without decoding any)."""
    if "images" not in rows.column_names:
        return False
    import pyarrow as pa
    import pyarrow.compute as pc

    column = rows.data.column("images")
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        lengths = pc.list_value_length(column)
        return bool(pc.max(lengths).as_py() or 0)
    return column.null_count < len(column)


def png(image) -> bytes:
    """A ``PIL.Image`` as PNG bytes."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def data_uri(data: bytes) -> str:
    """PNG bytes as a ``data:image/png;base64,`` URI (a jsonl row's image)."""
    return "data:image/png;base64," + base64.b64encode(data).decode()
