"""The shipped graphs' routing iteration by iteration (contract.CAPSNET_ITERATION_OUTPUTS) is Procedure 1's:
each iteration's couplings are a softmax over the classes, the first uniform and the last the graph's own
`routing`, and each agrees with PyTorch's dynamic routing, and the logit changes are routing_logit_changes
(Fig. A.1) per image, on the model rebuilt from the graph's weights (training.graphs.model_from_graphs)."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import torch

from model import contract
from model.routing import dynamic_routing, routing_logit_changes
from training.graphs import model_from_graphs

IMAGES = 4  # fixture digits per model
# ORT and PyTorch sum in different orders (float32 roundings of ~1e-7 of a term). Measured on the four
# models: couplings (in [0, 1]) within 4e-7, logit changes (means of 11,520 to 46,080 |agreements|, each
# about 1e-3 to 5e-3) within 2e-6 relative. The tolerances leave 25x and 50x to that, and stay far below
# what wrong code gives: one iteration's changes are 5% and more from the next's, and a batch mean misses
# some image's own by more than 10% on every model.
COUPLING_TOL = 1e-5
LOGIT_RTOL = 1e-4


def inputs(name: str, mnist_fixture) -> np.ndarray:
    """IMAGES fixture digits centred on the model's input size, float32 (n, 1, S, S) in [0, 1]."""
    size = json.loads((contract.SHIPPED[name] / contract.MODEL_CARD).read_text())[contract.SERVING]["input"]["size"]
    pad = (size - 28) // 2
    return np.pad(mnist_fixture[0][:IMAGES], ((0, 0), (pad, pad), (pad, pad)))[:, None].astype(np.float32) / 255


@pytest.fixture(scope="module", params=list(contract.SHIPPED))
def shipped(request, mnist_fixture) -> tuple[str, np.ndarray, dict[str, np.ndarray]]:
    """A shipped model's name, the inputs, and its capsnet.onnx's every output on them."""
    name = request.param
    x = inputs(name, mnist_fixture)
    session = ort.InferenceSession(
        str(contract.SHIPPED[name] / contract.CAPSNET_ONNX), providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    return name, x, dict(zip(names, session.run(names, {contract.IMAGE: x}), strict=True))


def test_every_iteration_couples_each_primary_capsule_by_a_softmax(shipped):
    """Eq. 3: c_i = softmax_j(b_i), so each iteration's rows sum to 1; b = 0 at the start, so iteration 1
    couples uniformly (1 / classes); the last iteration's couplings are the graph's `routing`."""
    name, _, out = shipped
    iterations = out[contract.ROUTING_ITERATIONS]
    card = json.loads((contract.SHIPPED[name] / contract.MODEL_CARD).read_text())
    assert iterations.shape == (IMAGES, card["routing_iters"], *out[contract.ROUTING].shape[1:])
    np.testing.assert_allclose(iterations.sum(axis=-1), 1.0, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(iterations[:, 0], np.float32(1 / iterations.shape[-1]))
    np.testing.assert_array_equal(iterations[:, -1], out[contract.ROUTING])


def test_iterations_are_pytorchs_procedure_1_on_the_same_weights(shipped):
    """Iteration r's couplings are those dynamic_routing(u_hat, r) ends with, and the logit changes are
    routing_logit_changes of each image alone, on the model rebuilt from the graph's weights."""
    name, x, out = shipped
    model = model_from_graphs(contract.SHIPPED[name])
    with torch.no_grad():
        u_hat = model(torch.from_numpy(x)).votes  # (n, primary, classes, 16)
        iters = out[contract.LOGIT_CHANGES].shape[1]
        for r in range(iters):
            couplings = dynamic_routing(u_hat, r + 1)[1].numpy()
            np.testing.assert_allclose(out[contract.ROUTING_ITERATIONS][:, r], couplings, rtol=0, atol=COUPLING_TOL)
        per_image = torch.stack([routing_logit_changes(u_hat[k : k + 1], iters) for k in range(len(x))]).numpy()
    np.testing.assert_allclose(out[contract.LOGIT_CHANGES], per_image, rtol=LOGIT_RTOL, atol=0)
