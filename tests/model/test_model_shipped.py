"""The shipped models against their cards. Every claim of a card that a test checks is recomputed here,
from the files (sha256, the ONNX graphs' inputs, outputs and weights, against model/contract.py) or
from the graphs run on the committed fixtures (tests/fixtures), never read back from the card or from
the code that wrote it (training/evaluate.py, training/export.py). The Fashion-MNIST and MultiMNIST
cards' errors are checked the same way in tests/training/test_experiments_*.py."""

import hashlib
import json
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from model import contract

MNIST = contract.SHIPPED["mnist"]
FIXTURE_SIZE = 1000  # tests/fixtures/mnist_test_1000.npz: the first 1,000 MNIST test digits
# Float results differ between CPUs in the last bits (the kernels' summation order: AVX2 vs AVX-512), so
# an image whose two longest capsules lie that close may change class: one such image on the fixture
# is allowed; a changed graph or preprocessing changes many.
FP32_FLIPS = 1
# int8 results differ between CPUs by up to a quantisation step per activation (VNNI's exact u8s8 dot
# products vs AVX2's vpmaddubsw, which saturates 16-bit pairs), as much as int8 differs from fp32 on
# the card's own CPU (largest output difference 0.97, 5 of 10,000 classes changed with VNNI, 9 on an
# AVX2 CPU: ~1 of the fixture's 1,000). Five flips (0.5% of the fixture, about 5x that rate) allow another
# CPU's kernels; a broken quantisation (wrong scales, a dropped layer) changes tens of percent.
INT8_FLIPS = 5
# fp16 weights take 2 bytes a parameter (fp32: 4); the rest of a file is the graph's nodes and the few
# small tensors kept in fp32 (1% of the mnist graph's 16.6 MB)
FP16_BYTES_PER_PARAMETER = 2.1


def card_of(folder) -> dict:
    return json.loads((folder / contract.MODEL_CARD).read_text())


def sha12(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def graph_io(path) -> tuple[list, list]:
    """A graph's inputs and outputs as [(name, [dims])], in order: N for the batch, numbers otherwise."""
    graph = onnx.load(str(path), load_external_data=False).graph

    def dims(node):
        return [d.dim_param or d.dim_value for d in node.type.tensor_type.shape.dim]

    return [(i.name, dims(i)) for i in graph.input], [(o.name, dims(o)) for o in graph.output]


def predictions(path, images: np.ndarray) -> np.ndarray:
    """The class of each uint8 image (N, 28, 28), as the contract feeds it (float32 in [0, 1])."""
    (lengths,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        [contract.LENGTHS], {contract.IMAGE: images[:, None].astype(np.float32) / 255}
    )
    return lengths.argmax(1)


def flips(card_errors: list[int], errors: np.ndarray) -> int:
    """Fixture images that are an error in one list and not in the other."""
    return len({i for i in card_errors if i < FIXTURE_SIZE} ^ set(errors.tolist()))


@pytest.fixture(scope="module")
def card() -> dict:
    return card_of(MNIST)


@pytest.fixture(scope="module")
def fp32(mnist_fixture) -> np.ndarray:
    return predictions(MNIST / contract.CAPSNET_ONNX, mnist_fixture[0])


@pytest.fixture(scope="module")
def int8(mnist_fixture) -> np.ndarray:
    return predictions(MNIST / contract.CAPSNET_INT8_ONNX, mnist_fixture[0])


@pytest.mark.parametrize("name", list(contract.SHIPPED))
def test_graphs_are_the_contracts_at_the_cards_sizes(name):
    """Each graph's inputs and outputs (names in order, shapes) are model/contract.py's for the input size
    and routing the card serves (every shipped model routes dynamically: the iteration outputs too); the
    card's inputs, outputs and capsule sizes are the graph's."""
    folder = contract.SHIPPED[name]
    card = card_of(folder)
    serving = card[contract.SERVING]
    routing = serving["routing"]
    assert routing["kind"] == contract.DYNAMIC_ROUTING
    shapes = {k: list(v) for k, v in contract.capsnet_shapes(serving["input"]["size"], routing["iterations"]).items()}
    outputs = contract.CAPSNET_OUTPUTS + contract.CAPSNET_ITERATION_OUTPUTS
    capsnet = ([(k, shapes[k]) for k in contract.CAPSNET_INPUTS], [(k, shapes[k]) for k in outputs])
    graphs = [contract.CAPSNET_ONNX] + [contract.CAPSNET_INT8_ONNX] * (folder / contract.CAPSNET_INT8_ONNX).is_file()
    for graph in graphs:
        assert graph_io(folder / graph) == capsnet, (name, graph)
    assert graph_io(folder / contract.DECODER_ONNX) == (
        [(k, shapes[k]) for k in contract.DECODER_INPUTS],
        [(k, shapes[k]) for k in contract.DECODER_OUTPUTS],
    )
    assert list(card["inputs"].items()) == capsnet[0] and list(card["outputs"].items()) == capsnet[1]
    _, primary, classes = shapes[contract.ROUTING]
    assert serving["primary_capsules"]["count"] == primary and len(serving["classes"]) == classes
    assert [serving["class_capsules"]["count"], serving["class_capsules"]["dim"]] == shapes[contract.CAPSULES][1:]


@pytest.mark.parametrize("name", list(contract.SHIPPED))
def test_card_names_its_files_and_counts_their_weights(name):
    """version is the first 12 hex digits of capsnet.onnx's sha256 (int8.version: capsnet.int8.onnx's);
    parameters is the graph's weights counted; stored_weights fp16 is what the file holds and weighs."""
    folder = contract.SHIPPED[name]
    card = card_of(folder)
    assert card["version"] == sha12(folder / contract.CAPSNET_ONNX)
    if "int8" in card:
        assert card["int8"]["version"] == sha12(folder / card["int8"]["file"])
    weights = [
        t
        for t in onnx.load(str(folder / contract.CAPSNET_ONNX), load_external_data=False).graph.initializer
        if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)
    ]
    parameters = sum(math.prod(t.dims) for t in weights)
    assert card["parameters"] == parameters
    assert card["stored_weights"] == "fp16"
    assert all(t.data_type == TensorProto.FLOAT16 for t in weights if math.prod(t.dims) > 4096), name
    assert (folder / contract.CAPSNET_ONNX).stat().st_size < FP16_BYTES_PER_PARAMETER * parameters


@pytest.mark.parametrize("name", list(contract.SHIPPED))
def test_decoder_graph_draws_what_the_capsnet_graph_draws(name, mnist_fixture):
    """decoder.onnx (what /reconstruct and NAME_decoder run) is the CapsNet graph's own decoder: fed the
    longest capsule alone, it draws the CapsNet graph's reconstruction (the same fp32 arithmetic)."""
    folder = contract.SHIPPED[name]
    size = card_of(folder)[contract.SERVING]["input"]["size"]
    margin = (size - 28) // 2  # the fixture's digits in the middle of a larger input
    x = np.pad(mnist_fixture[0][:16], ((0, 0), (margin, size - 28 - margin), (margin, size - 28 - margin)))
    x = x[:, None].astype(np.float32) / 255
    capsnet = ort.InferenceSession(str(folder / contract.CAPSNET_ONNX), providers=["CPUExecutionProvider"])
    lengths, capsules, drawn = capsnet.run(
        [contract.LENGTHS, contract.CAPSULES, contract.RECONSTRUCTION], {contract.IMAGE: x}
    )
    masked = np.zeros_like(capsules)
    rows, longest = np.arange(len(x)), lengths.argmax(1)
    masked[rows, longest] = capsules[rows, longest]
    (redrawn,) = ort.InferenceSession(str(folder / contract.DECODER_ONNX), providers=["CPUExecutionProvider"]).run(
        [contract.RECONSTRUCTION], {contract.CAPSULES: masked}
    )
    np.testing.assert_allclose(redrawn, drawn, rtol=0, atol=1e-5)


def test_shipped_model_reads_the_first_1000_test_digits(fp32, mnist_fixture):
    assert (fp32 == mnist_fixture[1]).mean() >= 0.985, f"{(fp32 != mnist_fixture[1]).sum()} errors on the fixture"


def test_card_errors_are_the_graphs_own(card, fp32, mnist_fixture):
    """The card's misclassified test indices below 1,000 are the graph's own errors on the fixture, to a
    CPU's last bits (FP32_FLIPS); its accuracy and error count are those of that list over the MNIST test
    set's 10,000 digits."""
    errors = np.flatnonzero(fp32 != mnist_fixture[1])
    assert flips(card["misclassified"], errors) <= FP32_FLIPS, (card["misclassified"][:10], errors.tolist())
    assert card["test_count"] == 10_000
    assert card["test_errors"] == len(card["misclassified"])
    assert card["test_accuracy"] == pytest.approx(1 - len(card["misclassified"]) / 10_000)


def test_int8_graph_is_what_its_card_says(card, fp32, int8, mnist_fixture):
    """The int8 graph's own errors on the fixture are its card's (within another CPU's int8 kernels,
    INT8_FLIPS); it ships as its rule says (no more than 0.05 points below fp32, 0.5 of the fixture's
    1,000 digits, so no more errors there than fp32's, to those flips), and it changes as few of the
    fixture's answers as the card says it changes of the test set's (5 of 10,000)."""
    claims = card["int8"]
    labels = mnist_fixture[1]
    errors = np.flatnonzero(int8 != labels)
    assert claims["shipped"]
    assert flips(claims["misclassified"], errors) <= INT8_FLIPS
    assert claims["test_accuracy"] == pytest.approx(1 - len(claims["misclassified"]) / 10_000)
    assert card["test_accuracy"] - claims["test_accuracy"] <= 0.0005
    assert len(errors) <= (fp32 != labels).sum() + INT8_FLIPS
    assert (fp32 != int8).sum() <= INT8_FLIPS
