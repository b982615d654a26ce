"""benchmarks.drawn_pairs runs end to end on a few fixture pairs and writes its report (a smoke test:
the figures themselves come from the full run)."""

import io
import json

import numpy as np
from PIL import Image

from benchmarks import drawn_pairs


def test_drawn_pairs_writes_its_report(api_url, mnist_fixture, tmp_path, monkeypatch):
    digits, classes = mnist_fixture
    images = np.zeros((4, 36, 36), np.uint8)  # two fixture digits, 4 px apart either way, on 36x36
    images[:, 2:30, 2:30] = digits[:4]
    images[:, 6:34, 6:34] = np.maximum(images[:, 6:34, 6:34], digits[4:8])
    labels = np.stack([classes[:4], classes[4:8]], axis=1)

    def fixture_pairs(name, data_dir, limit):
        files = []
        for x in images[:limit]:
            buffer = io.BytesIO()
            Image.fromarray(x).save(buffer, "PNG")
            files.append(buffer.getvalue())
        return files, labels[:limit]

    monkeypatch.setattr(drawn_pairs, "test_set", fixture_pairs)
    drawn_pairs.main(["--url", api_url, "--limit", "4", "--out", str(tmp_path / "drawn")])
    result = json.loads((tmp_path / "drawn.json").read_text())
    assert result["pairs"] == 4 and result["as_is_36"]["images"] == result["drawn_216"]["images"] == 4
    assert 0 <= result["drawn_216"]["accuracy"] <= 1 and result["drawn_216_median_ms"] > 0
    assert "drawn 216x216" in (tmp_path / "drawn.md").read_text()
    drawn = Image.open(io.BytesIO(drawn_pairs.drawn_large(fixture_pairs("multimnist", None, 1)[0][0])))
    assert drawn.size == (216, 216) and np.asarray(drawn).mean() > 128  # black ink on white paper
