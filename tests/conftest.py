import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
FAMILIES = ("llada", "dream", "sdar", "sdar_moe", "llada2", "nemotron_diffusion")
BLOCK_FAMILIES = ("sdar", "sdar_moe", "llada2")


def load_script(path: Path, name: str):
    """A script that is not a package module (recipes/...) imported as ``name``, once per session."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def pytest_configure(config):
    # The test models are tiny: one intra-op thread is as fast as two and does not collapse when the cores are
    # shared (two spinning OpenMP threads on a busy 2-core machine made a 64x128 matmul take 10 ms, not 30 us).
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def hub_mode(monkeypatch):
    """``dare.hub.before_loading`` turns the process offline when the hub cannot be reached (every test machine
    without a network): undone after each test, so no test sees another's mode."""
    import datasets.config
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", huggingface_hub.constants.HF_HUB_OFFLINE)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", datasets.config.HF_HUB_OFFLINE)
    if "HF_HUB_OFFLINE" in os.environ:
        monkeypatch.setenv("HF_HUB_OFFLINE", os.environ["HF_HUB_OFFLINE"])
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.fixture(scope="module")
def models() -> dict:
    """``{family name: (tiny model, Family)}`` for every family, once per test module."""
    from dare.models import Family, tiny
    out = {}
    for name in FAMILIES:
        model, tok = tiny(name)
        out[name] = (model, Family.from_pretrained(model.config, tok))
    return out


@pytest.fixture
def shared_models() -> Path:
    path = SHARED / "models"
    if not path.is_dir():
        pytest.skip(f"official configs not found at {path} (../shared is absent)")
    return path


MARGINS = []


@pytest.fixture
def margin():
    """``margin(line)``: a learning test's distance from its threshold, shown in every run's summary (a passing test's
    own output is hidden), so a margin that shrinks on some machine is seen before it fails."""
    return MARGINS.append


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # a pytest-xdist worker: its margins go to the controller
        session.config.workeroutput["margins"] = list(MARGINS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: collect each worker's margins for the summary."""
    MARGINS.extend(getattr(node, "workeroutput", {}).get("margins", []))


def pytest_terminal_summary(terminalreporter):
    if MARGINS:
        terminalreporter.section("learning-test margins")
        for line in MARGINS:
            terminalreporter.write_line(line)
