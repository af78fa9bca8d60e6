"""Rows from a local parquet / jsonl / json file (or a folder of them), a hub dataset name, or a generated task."""

from pathlib import Path
from typing import Annotated

import tyro

from .. import hub
from .images import holds_images
from .public import PUBLIC
from .tasks import make_task

_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


# the type of a data section's local_dir: its flag --data.local-dir is also --data-dir, evaluate.py's name for it
LocalDir = Annotated[str | None, tyro.conf.arg(aliases=("--data-dir",))]

TASK_ROWS = {"train": 10_000, "test": 500}  # rows drawn from a generated task per split


def load_rows(path: str, split: str = "train", local_dir: str | None = None,
              images: bool = False) -> "datasets.Dataset":  # noqa: F821
    """A local file (parquet/jsonl/json), a folder of such files, a hub dataset name (``name`` or ``name:config``),
    or ``task:<name>``: rows of a generated task (``dare.data.tasks``; 10,000 for ``train``, 500 held-out questions
    for ``test``, seed 0). A public dataset the recipes use (``dare.data.public``) arrives in the reference schema,
    read from its local copy in ``local_dir`` when that is given. Rows that hold images (``dare.data.images``) are
    refused unless the caller reads them (``images``): a text model would train on their placeholders."""
    import datasets  # here, not at the top: --help imports this module

    local = Path(path)
    if path in PUBLIC:
        public = PUBLIC[path]
        if local_dir and not public.raw_local:
            return load_rows(str(public.local(split, local_dir)))
        if local_dir:  # the hub's own files: converted as hub rows are
            raw = read_files("parquet", [str(public.local(split, local_dir))], path)
            rows = datasets.Dataset.from_list([public.convert(r) for r in raw])
        else:
            rows = datasets.Dataset.from_list(public.download(split))
    elif path.startswith("task:"):
        if split not in TASK_ROWS:
            raise ValueError(f"{path}: split must be one of {sorted(TASK_ROWS)}, got {split!r}")
        rows = datasets.Dataset.from_list(make_task(path[5:], TASK_ROWS[split], 0, split))
    elif local.is_dir():
        files = sorted(str(f) for f in local.iterdir() if f.suffix in _BUILDERS)
        if not files:
            raise ValueError(f"No .parquet/.jsonl/.json files in {path}")
        kinds = {_BUILDERS[Path(f).suffix] for f in files}
        if len(kinds) > 1:
            raise ValueError(f"{path} mixes file kinds {sorted(kinds)}; keep one kind per folder")
        rows = read_files(kinds.pop(), files, path)
    elif local.suffix in _BUILDERS:
        if not local.exists():
            raise FileNotFoundError(f"Dataset file not found: {path}")
        if local.stat().st_size == 0:
            raise ValueError(f"Dataset {path} is empty")
        rows = read_files(_BUILDERS[local.suffix], [str(local)], path)
    else:
        name, _, config = path.partition(":")
        hub.before_loading()
        try:
            rows = datasets.load_dataset(name, config or None, split=split)
        except (OSError, ConnectionError) as e:
            raise hub.missing("dataset", path, e) from e
    if len(rows) == 0:
        raise ValueError(f"Dataset {path} is empty")
    if not images and holds_images(rows):
        raise ValueError(f"Dataset {path} holds images (its 'images' column): this run reads text only (DARE's "
                         "scripts do not feed pictures yet; LLaDA-V's model reads them: dare/models/llada_v.py)")
    return rows


def read_files(builder: str, files: list[str], path: str) -> "datasets.Dataset":  # noqa: F821
    """``datasets`` reading local files, its failures (a damaged parquet, bytes that are not UTF-8, a line that is
    not JSON) as one line naming the file."""
    import datasets
    import pyarrow

    if builder == "parquet":
        import pyarrow.parquet
        for file in files:
            try:
                if pyarrow.parquet.read_metadata(file).num_rows == 0:
                    raise ValueError(f"Dataset {file} is empty (a parquet file with no rows)")
            except pyarrow.ArrowException as e:
                raise ValueError(f"{file} is not a readable parquet file ({e})") from None
    for file in files if builder == "json" else []:
        with open(file, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(f"{file}:{number} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return datasets.load_dataset(builder, data_files=files, split="train")
    except (datasets.exceptions.DatasetGenerationError, pyarrow.ArrowException) as e:
        cause = e.__cause__ or e.__context__ or e
        raise ValueError(f"{path}: cannot be read as {builder} ({type(cause).__name__}: {cause})") from None


def get_field(row: dict, key: str):
    """``row["a"]["b"]`` for the dotted key ``"a.b"``, with an error that names what is missing."""
    value = row
    for i, part in enumerate(key.split(".")):
        keys = list(value.keys()) if hasattr(value, "keys") else []
        if part not in keys:
            where = ".".join(key.split(".")[:i]) or "the row"
            raise KeyError(f"Column {key!r}: {part!r} not found in {where} (available: {sorted(keys)})")
        value = value[part]
    return value


def has_field(row: dict, key: str) -> bool:
    """Whether ``get_field(row, key)`` finds the dotted key."""
    try:
        get_field(row, key)
    except KeyError:
        return False
    return True
