"""Write notebooks/quickstart_executed.ipynb: quickstart.ipynb run top to bottom with its own parameters, so a reader
sees the results without running it. Regenerate it after editing the notebook (tests/test_notebook.py checks that the
two have the same cells):

    python notebooks/execute.py                 # ~4 minutes on 2 CPU cores

It runs as a fresh runtime would: the kernel starts in a temporary folder outside the repository (the setup cell
finds the checkout; nothing is cloned or installed), with no GPU visible (the last cell reports that it skips the
real-model run); progress bars are collapsed and the checkout's path is written as ``<DARE>``.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[1]


def tidy(nb) -> None:
    """Outputs as a reader should see them: consecutive stream chunks joined with progress-bar redraws (``\\r``)
    collapsed to their last state, and the checkout's absolute path written as ``<DARE>``."""
    def local(text: str) -> str:
        return text.replace(str(ROOT), "<DARE>").replace(f"{ROOT.parent}/shared", "<DARE>/../shared")

    for cell in nb.cells:
        merged = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream" \
                    and merged[-1]["name"] == out["name"]:
                merged[-1]["text"] += out["text"]
            else:
                merged.append(out)
        for out in merged:
            if out.get("output_type") == "stream":
                lines = [line.rstrip("\r").split("\r")[-1] if "\r" in line else line for line in out["text"].split("\n")
                         if line.rstrip("\r").split("\r")[-1] or "\r" not in line]  # a redrawn line: its last state
                out["text"] = local("\n".join(lines))
            for kind, value in out.get("data", {}).items():
                if kind.startswith("text/") and isinstance(value, str):
                    out["data"][kind] = local(value)
        if "outputs" in cell:
            cell["outputs"] = merged


def main(source: Path, target: Path, timeout: int) -> None:
    nb = nbformat.read(source, as_version=4)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "CUDA_VISIBLE_DEVICES": ""}
    os.environ.update(env)  # the kernel inherits them
    with tempfile.TemporaryDirectory() as elsewhere:
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                                resources={"metadata": {"path": elsewhere}}).execute()
    tidy(nb)
    nbformat.validate(nb)
    nbformat.write(nb, target)
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=ROOT / "notebooks" / "quickstart.ipynb")
    parser.add_argument("--target", type=Path, default=ROOT / "notebooks" / "quickstart_executed.ipynb")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = parser.parse_args()
    main(args.source, args.target, args.timeout)
