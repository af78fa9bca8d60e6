"""notebooks/quickstart.ipynb cannot rot: it runs top to bottom (nbclient, a real kernel) with shortened parameters
from a working directory outside the repository, as in Colab (every path comes from the setup cell's ROOT); its setup
cell clones and installs only outside a checkout; notebooks/quickstart_executed.ipynb is the same notebook with
outputs (regenerate it with ``python notebooks/execute.py``)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"
EXECUTED = ROOT / "notebooks" / "quickstart_executed.ipynb"


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def tags(cell):
    return cell.get("metadata", {}).get("tags", [])


def texts(cell) -> str:
    return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", []))


def test_quickstart_notebook_runs_top_to_bottom_from_another_directory(tmp_path, monkeypatch):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if "parameters" in tags(cell):
            cell.source += f"\nSFT_STEPS, RL_STEPS, QUESTIONS = 40, 2, 8\nOUT = {str(tmp_path / 'out')!r}"
    elsewhere = tmp_path / "elsewhere"  # the kernel's working directory: not the repository, not notebooks/
    elsewhere.mkdir()
    # the kernel finds the checkout as an installed clone does (importable dare); no GPU: the last cell skips
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(elsewhere)}}).execute()
    cells = code_cells(nb)
    assert f"DARE checkout: {ROOT}" in texts(cells[0])  # found, not cloned
    assert (tmp_path / "out" / "curve.png").exists() and (tmp_path / "out" / "summary.md").exists()
    outputs = [o for c in cells for o in c.get("outputs", [])]
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {}) for o in outputs)
    assert "JetLM/SDAR-1.7B-Chat, d1, 50 steps" in texts(cells[-2])  # the GPU recipe, found from ROOT, parses
    assert "No GPU in this runtime" in texts(cells[-1])
    assert not list(elsewhere.iterdir()), "the notebook wrote into the working directory"


def test_setup_cell_clones_and_installs_only_outside_a_checkout(tmp_path, monkeypatch):
    setup = code_cells(nbformat.read(NOTEBOOK, as_version=4))[0]
    assert "setup" in tags(setup) and re.search(r"^REPO_URL = 'https://", setup.source, re.M)
    calls = []

    def run(cmd, check):  # a stand-in for git and pip: "clones" this checkout's requirements
        calls.append(cmd)
        if cmd[:2] == ["git", "clone"]:
            Path(cmd[-1]).mkdir(parents=True)
            (Path(cmd[-1]) / "requirements.txt").write_text((ROOT / "requirements.txt").read_text())

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("DARE_ROOT", raising=False)
    monkeypatch.chdir(ROOT / "notebooks")  # inside a checkout: found, nothing run
    scope = {}
    exec(setup.source, scope)
    assert scope["ROOT"] == ROOT and calls == []

    monkeypatch.chdir(tmp_path)  # a fresh runtime: no checkout around, dare not findable
    monkeypatch.setenv("DARE_ROOT", str(tmp_path / "nothing"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(RuntimeError, match="Set REPO_URL"):  # the placeholder URL: a clear message, nothing run
        exec(setup.source, {})
    assert calls == []
    with pytest.raises(RuntimeError, match="restart the runtime"):  # numpy is imported in this process
        exec(re.sub(r"^REPO_URL = '[^']*'", "REPO_URL = 'https://example.org/dare.git'", setup.source, flags=re.M), {})
    clone = tmp_path / "home" / "dare"
    assert calls[0] == ["git", "clone", "--depth", "1", "https://example.org/dare.git", str(clone)]
    assert calls[1][1:6] == ["-m", "pip", "install", "-q", "-r"]
    assert not any(line.startswith("torch==") for line in Path(calls[1][6]).read_text().splitlines())  # runtime's torch
    assert calls[2][1:] == ["-m", "pip", "install", "-q", "-e", str(clone)]


def test_no_cell_uses_a_path_relative_to_the_working_directory():
    for cell in code_cells(nbformat.read(NOTEBOOK, as_version=4))[1:]:
        assert not re.search(r"""['"](\.\./|\./)?(recipes|outputs|notebooks|shared)/""", cell.source), cell.source


def test_executed_copy_has_the_same_cells_and_their_outputs():
    source, done = (nbformat.read(p, as_version=4) for p in (NOTEBOOK, EXECUTED))
    assert [(c.cell_type, c.source) for c in done.cells] == [(c.cell_type, c.source) for c in source.cells], \
        "notebooks/quickstart_executed.ipynb is stale: run python notebooks/execute.py"
    cells = code_cells(done)
    assert all(c.execution_count for c in cells)
    assert not [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert all(c.outputs for c in cells if "parameters" not in tags(c))
    assert any("image/png" in o.get("data", {}) for c in cells for o in c.outputs)
    assert "held-out greedy accuracy" in "".join(str(o.get("data", {})) for c in cells for o in c.outputs)
    assert str(ROOT) not in nbformat.writes(done)  # no machine-specific paths
