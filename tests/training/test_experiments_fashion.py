"""Fashion-MNIST: the experiment's command trains (or resumes), exports to its shipped place with a
card, and writes a result row read from that card; the shipped model and its row agree."""

import json

import numpy as np
import pytest
import torch

from model import contract
from tests.harness import FIXTURES
from training.evaluate import evaluate_onnx
from training.experiments import common, fashion
from training.graphs import sha256


@pytest.mark.slow
def test_cli_trains_exports_and_resumes_without_retraining(idx_dir, tmp_path):
    argv = [
        "--data-dir",
        str(idx_dir),
        "--val-size",
        "100",
        "--train-limit",
        "64",
        "--batch-size",
        "32",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "run"),
        "--model-dir",
        str(tmp_path / "model"),
        "--results-dir",
        str(tmp_path),
    ]
    card = fashion.main(argv)  # the fixture is MNIST standing in for Fashion-MNIST's files
    assert card["name"] == "capsnet-fashion-mnist" and card["dataset"] == "fashion-mnist"
    assert card["test_count"] == 200 and card["parity_max_abs_diff"] < 1e-4
    row = json.loads((tmp_path / "fashion.json").read_text())["rows"][0]
    assert row["ours"] == pytest.approx(100 * (1 - card["test_accuracy"]), abs=0.01)
    assert row["paper"] == 7.21 and row["reduced"] and row["train_images"] == 64
    trained = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["train_seconds"]
    fashion.main(argv)  # the run has its epochs: it is only exported again
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["train_seconds"] == trained


def test_shipped_fashion_model_reads_the_fixture_as_its_card_and_row_say():
    """The shipped graph's own errors on the first 200 Fashion-MNIST test images are the card's
    misclassified indices below 200 (to a CPU's last bits, as for MNIST in tests/model); the results row
    names that graph by its hash and states the error rate of the card's misclassified list."""
    shipped = contract.SHIPPED["fashion-mnist"]
    card = json.loads((shipped / contract.MODEL_CARD).read_text())
    with np.load(FIXTURES / "fashion_test_200.npz") as f:
        images, labels = f["images"], f["labels"].astype(np.int64)
    result = evaluate_onnx(shipped / contract.CAPSNET_ONNX, images, labels)
    assert len(set(i for i in card["misclassified"] if i < len(labels)) ^ set(result["misclassified"])) <= 1
    row = json.loads((common.RESULTS_DIR / "fashion.json").read_text())["rows"][0]
    assert row["model_version"] == sha256(shipped / contract.CAPSNET_ONNX)[:12]
    assert row["ours"] == pytest.approx(100 * len(card["misclassified"]) / card["test_count"], abs=0.01)
