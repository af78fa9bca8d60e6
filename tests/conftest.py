from pathlib import Path

import pytest
import torch

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FAMILIES = ("llada", "dream", "sdar", "sdar_moe", "llada2")
BLOCK_FAMILIES = ("sdar", "sdar_moe", "llada2")


def pytest_configure(config):
    # The test models are tiny: one intra-op thread is as fast as two and does not collapse when the cores are
    # shared (two spinning OpenMP threads on a busy 2-core machine made a 64x128 matmul take 10 ms, not 30 us).
    torch.set_num_threads(1)


@pytest.fixture
def shared_models() -> Path:
    path = SHARED / "models"
    if not path.is_dir():
        pytest.skip(f"official configs not found at {path} (../shared is absent)")
    return path
