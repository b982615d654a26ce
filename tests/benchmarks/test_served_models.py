"""benchmarks.served_models runs against the test server on a few fixture images per model and writes its
report (a smoke test: the figures come from the full run on the test sets)."""

import json

import numpy as np

from benchmarks import served_models
from tests.harness import encode


def test_served_models_writes_its_report(api_url, mnist_fixture, tmp_path, monkeypatch):
    digits, classes = mnist_fixture[0][:12], mnist_fixture[1][:12]

    def fixture_set(name, data_dir, limit):
        """Fixture digits at each model's input size: centred on 40x40 for affine, paired on 36x36 for
        multimnist (as drawn_pairs' smoke test does), as they are for the 28x28 models."""
        if name == "multimnist":
            images = np.zeros((6, 36, 36), np.uint8)
            images[:, 2:30, 2:30] = digits[:6]
            images[:, 6:34, 6:34] = np.maximum(images[:, 6:34, 6:34], digits[6:12])
            labels = np.stack([classes[:6], classes[6:12]], axis=1)
        else:
            pad = 6 if name == "affine" else 0
            images, labels = np.pad(digits, ((0, 0), (pad, pad), (pad, pad))), classes
        return [encode(x) for x in images[:limit]], labels[:limit]

    monkeypatch.setattr(served_models, "test_set", fixture_set)
    monkeypatch.setattr(served_models, "LATENCY_REQUESTS", 3)
    served_models.main(["--url", api_url, "--limit", "12", "--auto-limit", "4", "--out", str(tmp_path / "served")])
    result = json.loads((tmp_path / "served.json").read_text())
    assert list(result["models"]) == ["mnist", "fashion-mnist", "multimnist", "affine"]
    mnist = result["models"]["mnist"]
    assert [run["images"] for run in mnist["runs"]] == [12, 4] and mnist["latency"]["requests"] == 3
    assert mnist["runs"][0]["accuracy"] >= 11 / 12  # the shipped model reads the first test digits
    assert "| mnist |" in (tmp_path / "served.md").read_text()
