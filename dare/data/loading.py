"""Rows from a local parquet / jsonl / json file (or a folder of them), a hub dataset name, or a generated task."""

from pathlib import Path

from .public import PUBLIC
from .tasks import make_task

_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json"}


TASK_ROWS = {"train": 10_000, "test": 500}  # rows drawn from a generated task per split


def load_rows(path: str, split: str = "train", local_dir: str | None = None) -> "datasets.Dataset":  # noqa: F821
    """A local file (parquet/jsonl/json), a folder of such files, a hub dataset name (``name`` or ``name:config``),
    or ``task:<name>``: rows of a generated task (``dare.data.tasks``; 10,000 for ``train``, 500 held-out questions
    for ``test``, seed 0). A public dataset the recipes use (``dare.data.public``) arrives in the reference schema,
    read from its local copy in ``local_dir`` when that is given."""
    import datasets  # here, not at the top: --help imports this module

    local = Path(path)
    if path in PUBLIC:
        public = PUBLIC[path]
        if local_dir:
            return load_rows(str(public.local(split, local_dir)))
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
        rows = datasets.load_dataset(kinds.pop(), data_files=files, split="train")
    elif local.suffix in _BUILDERS:
        if not local.exists():
            raise FileNotFoundError(f"Dataset file not found: {path}")
        if local.stat().st_size == 0:
            raise ValueError(f"Dataset {path} is empty")
        rows = datasets.load_dataset(_BUILDERS[local.suffix], data_files=str(local), split="train")
    else:
        name, _, config = path.partition(":")
        rows = datasets.load_dataset(name, config or None, split=split)
    if len(rows) == 0:
        raise ValueError(f"Dataset {path} is empty")
    return rows


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
