"""The shipped model: it classifies real MNIST digits and its card says what evaluate.py measures."""
import json

import numpy as np
import pytest

from model import contract
from training.evaluate import evaluate_onnx
from training.export import compare_graphs, sha256

CAPSNET = contract.MODEL_DIR / contract.CAPSNET_ONNX
CARD = contract.MODEL_DIR / contract.MODEL_CARD


@pytest.fixture(scope="module")
def card() -> dict:
    return json.loads(CARD.read_text())


@pytest.fixture(scope="module")
def fixture_result(mnist_fixture) -> dict:
    images, labels = mnist_fixture
    return evaluate_onnx(CAPSNET, images, labels)


def test_shipped_model_reads_the_first_1000_test_digits(fixture_result):
    assert fixture_result["accuracy"] >= 0.985, f"{fixture_result['errors']} errors on the fixture"


def test_card_matches_what_evaluate_measures(card, fixture_result):
    """The card's misclassified test indices below 1,000 are exactly the fixture's errors."""
    assert card["misclassified"] is not None, "the card was written without an evaluation"
    assert [i for i in card["misclassified"] if i < 1000] == fixture_result["misclassified"]
    assert card["test_errors"] == len(card["misclassified"])
    assert card["test_accuracy"] == pytest.approx(1 - card["test_errors"] / card["test_count"])
    assert card["test_count"] == 10_000


def test_card_names_the_shipped_graph(card):
    assert card["version"] == sha256(CAPSNET)[:12]
    assert card["parameters"] == 8_215_568
    assert card["parity_max_abs_diff"] <= 1e-4
    assert set(card["outputs"]) == set(contract.CAPSNET_OUTPUTS)
    assert np.isfinite(card["train_seconds"]) and card["epochs"] >= 3


def test_int8_graph_is_what_its_card_says(card, mnist_fixture):
    """The int8 graph ships only as accurate as the rule says, and its card's errors are the fixture's."""
    from training.quantize import MAX_ACCURACY_DROP
    int8 = card["int8"]
    path = contract.MODEL_DIR / int8["file"]
    assert int8["shipped"] and int8["version"] == sha256(path)[:12]
    assert int8["fp32_test_accuracy"] == card["test_accuracy"]
    assert int8["fp32_test_accuracy"] - int8["test_accuracy"] <= MAX_ACCURACY_DROP
    result = evaluate_onnx(path, *mnist_fixture)
    assert [i for i in int8["misclassified"] if i < 1000] == result["misclassified"]
    _, changed = compare_graphs(CAPSNET, path, mnist_fixture[0])  # the fixture is part of the test set
    assert changed <= int8["changed_predictions"]

