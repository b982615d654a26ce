"""The Open Inference Protocol (KServe v2) routes, driven by NVIDIA's own tritonclient over real HTTP,
and their errors for what a client can get wrong."""
import json

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from app.routes.inference_protocol import HEADER_LENGTH
from model import contract

MODEL = "mnist"  # the shipped model's card names its dataset
DECODER = "mnist_decoder"


@pytest.fixture(scope="module")
def tc(api_url) -> triton.InferenceServerClient:
    client = triton.InferenceServerClient(api_url.removeprefix("http://"))
    yield client
    client.close()


@pytest.fixture(scope="module")
def session() -> ort.InferenceSession:
    """The graph the server must run: on the CPU, the shipped MNIST model's int8 graph (its card ships it)."""
    return ort.InferenceSession(str(contract.SHIPPED["mnist"] / contract.CAPSNET_INT8_ONNX), providers=["CPUExecutionProvider"])


def images(mnist_fixture, n: int) -> np.ndarray:
    return mnist_fixture[0][:n, None].astype(np.float32) / 255.0


def test_live_ready_and_server_metadata(tc):
    assert tc.is_server_live() and tc.is_server_ready()
    assert tc.is_model_ready(MODEL) and tc.is_model_ready(DECODER)
    assert not tc.is_model_ready("fashion")  # not served: not ready
    meta = tc.get_server_metadata()
    assert meta["name"] == "capsnet-service" and "binary_tensor_data" in meta["extensions"]


def test_model_metadata_is_the_onnx_graphs(tc, session):
    meta = tc.get_model_metadata(MODEL)
    assert meta["platform"] == "onnxruntime_onnx" and len(meta["versions"]) == 1
    assert meta["inputs"] == [{"name": contract.IMAGE, "datatype": "FP32", "shape": [-1, 1, 28, 28]}]
    assert [o["name"] for o in meta["outputs"]] == [o.name for o in session.get_outputs()]
    assert {o["name"]: o["shape"] for o in meta["outputs"]}[contract.ROUTING] == [-1, 1152, 10]
    decoder = tc.get_model_metadata(DECODER)
    assert decoder["inputs"][0]["name"] == contract.CAPSULES and decoder["outputs"][0]["shape"] == [-1, 28, 28]


@pytest.mark.parametrize("binary", [True, False])
def test_infer_returns_the_sessions_own_tensors(tc, session, mnist_fixture, binary):
    x = images(mnist_fixture, 7)
    inp = triton.InferInput(contract.IMAGE, list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    outputs = [triton.InferRequestedOutput(name, binary_data=binary) for name in (contract.LENGTHS, contract.ROUTING)]
    result = tc.infer(MODEL, [inp], outputs=outputs, request_id="seven")
    lengths, routing = session.run([contract.LENGTHS, contract.ROUTING], {contract.IMAGE: x})
    np.testing.assert_allclose(result.as_numpy(contract.LENGTHS), lengths, rtol=0, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy(contract.ROUTING), routing, rtol=0, atol=1e-6)
    assert result.as_numpy(contract.CAPSULES) is None  # not asked for
    assert result.get_response()["id"] == "seven"
    assert (lengths.argmax(1) == mnist_fixture[1][:7]).all()


def test_infer_without_outputs_returns_every_output(tc, mnist_fixture):
    x = images(mnist_fixture, 1)
    inp = triton.InferInput(contract.IMAGE, [1, 1, 28, 28], "FP32")
    inp.set_data_from_numpy(x)
    result = tc.infer(MODEL, [inp])
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == list(contract.CAPSNET_OUTPUTS) and result.as_numpy(contract.RECONSTRUCTION).shape == (1, 28, 28)


def test_decoder_draws_the_masked_capsule(tc, session, mnist_fixture):
    x = images(mnist_fixture, 2)
    lengths, capsules, recon = session.run([contract.LENGTHS, contract.CAPSULES, contract.RECONSTRUCTION],
                                           {contract.IMAGE: x})
    masked = np.zeros_like(capsules)
    rows = np.arange(2)
    masked[rows, lengths.argmax(1)] = capsules[rows, lengths.argmax(1)]
    inp = triton.InferInput(contract.CAPSULES, list(masked.shape), "FP32")
    inp.set_data_from_numpy(masked)
    result = tc.infer(DECODER, [inp])
    np.testing.assert_allclose(result.as_numpy(contract.RECONSTRUCTION), recon, rtol=0, atol=1e-5)


def test_client_mistakes_are_4xx_with_an_error_sentence(tc, mnist_fixture):
    x = images(mnist_fixture, 1)
    wrong = triton.InferInput("pixels", [1, 1, 28, 28], "FP32")
    wrong.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="unknown input 'pixels'"):
        tc.infer(MODEL, [wrong])
    with pytest.raises(InferenceServerException, match="unknown model 'nope'"):
        tc.get_model_metadata("nope")
    small = triton.InferInput(contract.IMAGE, [1, 1, 14, 14], "FP32")
    small.set_data_from_numpy(np.zeros((1, 1, 14, 14), np.float32))
    with pytest.raises(InferenceServerException, match=r"shape \[1, 1, 14, 14\]"):
        tc.infer(MODEL, [small])


@pytest.mark.parametrize("body, headers, message", [
    (b"not json", {}, "not valid JSON"),
    (b"[1, 2]", {}, "JSON object"),
    (json.dumps({"inputs": []}).encode(), {}, "one tensor"),
    (json.dumps({"inputs": [{"name": "image", "datatype": "INT8", "shape": [1, 1, 28, 28], "data": []}]}).encode(),
     {}, "must be FP32"),
    (json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [1, 2]}]}).encode(),
     {}, "has 2 values"),
    (json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [5000, 1, 28, 28], "data": []}]}).encode(),
     {}, "1 to 1024 rows"),
    (json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28],
                             "data": ["x"] * 784}]}).encode(), {}, "list of numbers"),
    (json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28],
                             "parameters": {"binary_data_size": 3136}}]}).encode() + b"\0" * 100,
     "header", "binary_data_size 3136"),
    (json.dumps({"inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28], "data": [0] * 784}],
                 "outputs": [{"name": "logits"}]}).encode(), {}, "unknown output"),
    (b"{}", {HEADER_LENGTH: "9999"}, "the body has 2 bytes"),
    (b"{}", {HEADER_LENGTH: "two"}, "byte count"),
])
def test_hostile_infer_bodies_are_400(api_url, body, headers, message):
    import httpx
    if headers == "header":  # the JSON part's real length, then too few binary bytes after it
        headers = {HEADER_LENGTH: str(body.index(b"\0"))}
    r = httpx.post(f"{api_url}/v2/models/{MODEL}/infer", content=body, headers=headers, timeout=30)
    assert r.status_code == 400 and message in r.json()["error"], r.text
