"""Fashion-MNIST: the experiment's command trains (or resumes), exports to its shipped place with a
card, and writes a result row read from that card; the shipped model and its row agree."""
import json

import onnx
import pytest
import torch

from model import contract
from training.experiments import common, fashion


@pytest.mark.slow
def test_cli_trains_exports_and_resumes_without_retraining(idx_dir, tmp_path):
    argv = ["--data-dir", str(idx_dir), "--val-size", "100", "--train-limit", "64", "--batch-size", "32",
            "--epochs", "1", "--out", str(tmp_path / "run"), "--model-dir", str(tmp_path / "model"), "--results-dir", str(tmp_path)]
    card = fashion.main(argv)  # the fixture is MNIST standing in for Fashion-MNIST's files
    assert card["name"] == "capsnet-fashion-mnist" and card["dataset"] == "fashion-mnist"
    assert card["test_count"] == 200 and card["parity_max_abs_diff"] < 1e-4
    row = json.loads((tmp_path / "fashion.json").read_text())["rows"][0]
    assert row["ours"] == pytest.approx(100 * (1 - card["test_accuracy"]), abs=0.01)
    assert row["paper"] == 7.21 and row["reduced"] and row["train_images"] == 64
    trained = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["train_seconds"]
    fashion.main(argv)  # the run has its epochs: it is only exported again
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["train_seconds"] == trained


def test_shipped_fashion_model_matches_its_card_and_result():
    shipped = contract.SHIPPED["fashion-mnist"]
    card = json.loads((shipped.directory / contract.MODEL_CARD).read_text())
    assert card["dataset"] == "fashion-mnist" and card["inputs"][contract.IMAGE] == list(shipped.shapes[contract.IMAGE])
    graph = onnx.load(shipped.directory / contract.CAPSNET_ONNX, load_external_data=False)
    assert [o.name for o in graph.graph.output] == list(contract.CAPSNET_OUTPUTS)
    row = json.loads((common.RESULTS_DIR / "fashion.json").read_text())["rows"][0]
    assert row["model_version"] == card["version"] == fashion_version(shipped)
    assert row["ours"] == pytest.approx(100 * (1 - card["test_accuracy"]), abs=0.01)


def fashion_version(shipped) -> str:
    from training.export import sha256
    return sha256(shipped.directory / contract.CAPSNET_ONNX)[:12]
