import numpy as np
import pytest

from tests.harness import FIXTURES
from training import data


def write_idx_dir(root, splits: dict[str, tuple[np.ndarray, np.ndarray]]):
    """root holding each split's (images, labels) as the gzipped IDX files data.load reads."""
    for part, (images, labels) in splits.items():
        data.write_idx(root / f"{data.FILES[part + '_images']}.gz", images)
        data.write_idx(root / f"{data.FILES[part + '_labels']}.gz", labels.astype(np.uint8))
    return root


@pytest.fixture(scope="session")
def idx_dir(tmp_path_factory, mnist_fixture):
    """A data directory of gzipped IDX files cut from the fixture: 800 'train' and 200 'test' images."""
    images, labels = mnist_fixture
    return write_idx_dir(
        tmp_path_factory.mktemp("idx"), {"train": (images[:800], labels[:800]), "test": (images[800:], labels[800:])}
    )


@pytest.fixture(scope="session")
def data_dirs(idx_dir, tmp_path_factory):
    """The campaign's data folders: MNIST's idx_dir and the Fashion-MNIST fixture as both 'train' and 'test'."""
    with np.load(FIXTURES / "fashion_test_200.npz") as f:
        fashion = f["images"], f["labels"]
    root = tmp_path_factory.mktemp("fashion")
    return {"mnist": idx_dir, "fashion-mnist": write_idx_dir(root, {"train": fashion, "test": fashion})}


@pytest.fixture(scope="session")
def few_of_each_class(tmp_path_factory, mnist_fixture) -> dict[str, object]:
    """Data directories of the first 6 test images of each class (60, in file order) of the MNIST and the
    Fashion-MNIST fixtures, as both 'train' and 'test': by dataset name."""
    with np.load(FIXTURES / "fashion_test_200.npz") as f:
        fashion = f["images"], f["labels"]
    dirs = {}
    for name, (images, labels) in {"mnist": mnist_fixture, "fashion-mnist": fashion}.items():
        keep = np.sort(np.concatenate([np.flatnonzero(labels == c)[:6] for c in range(10)]))
        split = images[keep], labels[keep]
        dirs[name] = write_idx_dir(tmp_path_factory.mktemp(name), {"train": split, "test": split})
    return dirs
