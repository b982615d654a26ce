"""The shipped model: it classifies real MNIST digits and its card says what evaluate.py measures."""
import json

import numpy as np
import pytest

from model import contract
from training.evaluate import evaluate_onnx
from training.export import compare_graphs, sha256

CAPSNET = contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX
CARD = contract.SHIPPED["mnist"] / contract.MODEL_CARD


@pytest.fixture(scope="module")
def card() -> dict:
    return json.loads(CARD.read_text())


@pytest.fixture(scope="module")
def fixture_result(mnist_fixture) -> dict:
    images, labels = mnist_fixture
    return evaluate_onnx(CAPSNET, images, labels)


def test_shipped_model_reads_the_first_1000_test_digits(fixture_result):
    assert fixture_result["accuracy"] >= 0.985, f"{fixture_result['errors']} errors on the fixture"


# Float results differ between CPUs in the last bits (the kernels' summation order: AVX2 vs AVX-512), so
# an image whose two longest capsules lie that close may change class: one such image on the fixture
# is allowed; a changed graph or preprocessing changes many.
FP32_FLIPS = 1
# int8 results differ between CPUs by up to a quantisation step per activation (VNNI's exact u8s8 dot
# products vs AVX2's vpmaddubsw, which saturates 16-bit pairs), as much as int8 differs from fp32 on
# the card's own CPU (largest output difference 0.98, 11 of 10,000 classes changed: ~1 of the fixture's
# 1,000). Five flips (0.5% of the fixture, about 5x that rate) allow another CPU's kernels; a broken
# quantisation (wrong scales, a dropped layer) changes tens of percent.
INT8_FLIPS = 5


def flips(card_errors: list[int], errors: list[int], below: int = 1000) -> int:
    """Images below `below` that are an error in one list and not in the other."""
    return len(set(i for i in card_errors if i < below) ^ set(errors))


def test_card_matches_what_evaluate_measures(card, fixture_result):
    """The card's misclassified test indices below 1,000 are the fixture's errors, to a CPU's last bits."""
    assert card["misclassified"] is not None, "the card was written without an evaluation"
    assert flips(card["misclassified"], fixture_result["misclassified"]) <= FP32_FLIPS
    assert card["test_errors"] == len(card["misclassified"])
    assert card["test_accuracy"] == pytest.approx(1 - card["test_errors"] / card["test_count"])
    assert card["test_count"] == 10_000


def test_card_names_the_shipped_graph(card):
    assert card["version"] == sha256(CAPSNET)[:12]
    assert card["parameters"] == 8_215_568
    assert card["parity_max_abs_diff"] <= 1e-4
    assert set(card["outputs"]) == set(contract.CAPSNET_OUTPUTS)
    assert np.isfinite(card["train_seconds"]) and card["epochs"] >= 3


def test_int8_graph_is_what_its_card_says(card, mnist_fixture, fixture_result):
    """The int8 graph ships only as accurate as the rule says, and reads the fixture as its card says,
    within what another CPU's int8 kernels change (INT8_FLIPS)."""
    from tools.quantize import MAX_ACCURACY_DROP
    int8 = card["int8"]
    path = contract.SHIPPED["mnist"] / int8["file"]
    assert int8["shipped"] and int8["version"] == sha256(path)[:12]
    assert int8["fp32_test_accuracy"] == card["test_accuracy"]
    assert int8["fp32_test_accuracy"] - int8["test_accuracy"] <= MAX_ACCURACY_DROP
    assert int8["measured_on"], "the card names the CPU its int8 results come from"
    result = evaluate_onnx(path, *mnist_fixture)
    assert flips(int8["misclassified"], result["misclassified"]) <= INT8_FLIPS
    assert result["errors"] <= fixture_result["errors"] + INT8_FLIPS
    _, changed = compare_graphs(CAPSNET, path, mnist_fixture[0])  # the fixture is part of the test set
    assert changed <= INT8_FLIPS

