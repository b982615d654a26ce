import numpy as np
import pytest

from training import data


@pytest.fixture(scope="session")
def idx_dir(tmp_path_factory, mnist_fixture):
    """A data directory of gzipped IDX files cut from the fixture: 800 'train' and 200 'test' images."""
    images, labels = mnist_fixture
    root = tmp_path_factory.mktemp("idx")
    parts = {"train": slice(0, 800), "test": slice(800, 1000)}
    for part, sl in parts.items():
        data.write_idx(root / f"{data.FILES[part + '_images']}.gz", images[sl])
        data.write_idx(root / f"{data.FILES[part + '_labels']}.gz", labels[sl].astype(np.uint8))
    return root
