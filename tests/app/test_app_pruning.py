"""A graph pruned to some of its outputs (app/pruning.py): only those outputs, only the nodes they need, and
the same values as the whole graph gives for them."""

import numpy as np
import onnx
import onnxruntime as ort

from app.pruning import prune
from model import contract

GRAPH = contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX


def run(graph: bytes, names: list[str], images: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(graph, providers=["CPUExecutionProvider"]).run(names, {contract.IMAGE: images})


def test_the_class_capsules_need_neither_the_decoder_nor_the_routing_maps(mnist_fixture):
    whole = GRAPH.read_bytes()
    lean = prune(whole, contract.CAPSULE_OUTPUTS)
    model, pruned = onnx.load_model_from_string(whole), onnx.load_model_from_string(lean)
    assert [o.name for o in pruned.graph.output] == list(contract.CAPSULE_OUTPUTS)
    assert [i.name for i in pruned.graph.input] == list(contract.CAPSNET_INPUTS)
    assert pruned.graph.input[0].type == model.graph.input[0].type  # its batch axis as it was
    ops = [node.op_type for node in pruned.graph.node]
    assert len(ops) < len(model.graph.node)
    assert "Sigmoid" in [node.op_type for node in model.graph.node] and "Sigmoid" not in ops  # the decoder's last
    images = mnist_fixture[0][:3, None].astype(np.float32) / 255
    names = list(contract.CAPSULE_OUTPUTS)
    for got, want in zip(run(lean, names, images), run(whole, names, images), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6)
