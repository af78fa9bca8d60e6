from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FAMILIES = ("llada", "dream", "sdar", "sdar_moe", "llada2")
BLOCK_FAMILIES = ("sdar", "sdar_moe", "llada2")


def pytest_configure(config):
    torch.set_num_threads(2)


@pytest.fixture
def shared_models() -> Path:
    path = SHARED / "models"
    if not path.is_dir():
        pytest.skip(f"official configs not found at {path} (../shared is absent)")
    return path
