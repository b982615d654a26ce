"""Shared fixtures: the committed MNIST slice and the repository paths. No network, no ../shared."""
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="session")
def mnist_fixture() -> tuple[np.ndarray, np.ndarray]:
    """The first 1,000 MNIST test images (uint8 (1000, 28, 28)) and labels (int64 (1000,))."""
    with np.load(FIXTURES / "mnist_test_1000.npz") as f:
        return f["images"], f["labels"].astype(np.int64)
