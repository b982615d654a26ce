"""The EM-routing experiment: every variant trains on the same images, its curve and row are written,
and a finished run is read back rather than trained again."""

import json

import pytest
import torch

from training.experiments import em_routing


@pytest.mark.slow
def test_cli_trains_each_variant_and_writes_curves(idx_dir, tmp_path):
    argv = [
        "--data-dir",
        str(idx_dir),
        "--val-size",
        "64",
        "--train-limit",
        "64",
        "--batch-size",
        "32",
        "--epochs",
        "2",
        "--precision",
        "fp32",
        "--out",
        str(tmp_path / "runs"),
        "--results-dir",
        str(tmp_path),
        "--figure",
        str(tmp_path / "em.png"),
    ]
    em_routing.main(argv)
    trained = (tmp_path / "runs" / "em" / "last.pt").stat().st_mtime_ns
    record = json.loads((tmp_path / "em_routing.json").read_text())
    assert [r["variant"] for r in record["rows"]] == list(em_routing.VARIANTS)
    for r in record["rows"]:  # a validation point per epoch, at 64 and 128 images seen
        assert [images for images, _ in r["curve"]] == [64, 128] and r["reduced"]
        assert all(0 <= err <= 100 for _, err in r["curve"]) and 0 <= r["ours"] <= 100
    assert (tmp_path / "em.png").stat().st_size > 5_000  # the three variants' curves
    again_figure = ["--figure", str(tmp_path / "again.png")]
    em_routing.main([*argv, "--variants", "em", "--name", "em_again", *again_figure])  # finished: read back
    assert (tmp_path / "runs" / "em" / "last.pt").stat().st_mtime_ns == trained
    (again,) = json.loads((tmp_path / "em_again.json").read_text())["rows"]
    (first,) = [r for r in record["rows"] if r["variant"] == "em"]
    assert again["curve"] == first["curve"] and again["ours"] == pytest.approx(first["ours"], abs=0.01)
    ckpt = torch.load(tmp_path / "runs" / "em-margin" / "best.pt", weights_only=True)
    assert ckpt["config"]["routing"] == "em" and ckpt["config"]["loss"] == "margin"
    assert torch.load(tmp_path / "runs" / "em" / "best.pt", weights_only=True)["config"]["loss"] == "spread"
