"""The Open Inference Protocol (KServe v2) routes, driven by NVIDIA's own tritonclient over real HTTP,
and their errors for what a client can get wrong."""

import json

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from app.routes.inference_protocol import HEADER_LENGTH, MAX_ANSWER_VALUES
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
    return ort.InferenceSession(
        str(contract.SHIPPED["mnist"] / contract.CAPSNET_INT8_ONNX), providers=["CPUExecutionProvider"]
    )


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
    shapes = {o["name"]: o["shape"] for o in meta["outputs"]}
    assert shapes[contract.ROUTING] == [-1, 1152, 10]
    assert shapes[contract.ROUTING_ITERATIONS] == [-1, 3, 1152, 10] and shapes[contract.LOGIT_CHANGES] == [-1, 3]
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


def test_an_answer_too_large_is_refused_and_fewer_outputs_are_answered(tc, mnist_fixture):
    """Every output of enough rows would exceed MAX_ANSWER_VALUES (gigabytes of JSON from a body within the
    limit): 400 saying so, before the model runs; the same rows asking for lengths alone are answered."""
    rows = MAX_ANSWER_VALUES // (10 * 1152 * 5) + 1  # routing, vote_lengths and the iterations alone pass it
    x = np.repeat(images(mnist_fixture, 1), rows, axis=0)
    inp = triton.InferInput(contract.IMAGE, list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match=f"at most {MAX_ANSWER_VALUES:,} a request") as refused:
        tc.infer(MODEL, [inp])
    assert refused.value.status() == "400" and "lengths 10, capsules 160" in refused.value.message()
    result = tc.infer(MODEL, [inp], outputs=[triton.InferRequestedOutput(contract.LENGTHS)])
    assert result.as_numpy(contract.LENGTHS).shape == (rows, 10)


def test_infer_without_outputs_returns_every_output(tc, mnist_fixture):
    x = images(mnist_fixture, 1)
    inp = triton.InferInput(contract.IMAGE, [1, 1, 28, 28], "FP32")
    inp.set_data_from_numpy(x)
    result = tc.infer(MODEL, [inp])
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == [*contract.CAPSNET_OUTPUTS, *contract.CAPSNET_ITERATION_OUTPUTS]
    assert result.as_numpy(contract.RECONSTRUCTION).shape == (1, 28, 28)


@pytest.mark.parametrize("binary", [True, False])
def test_infer_returns_the_routing_iterations(tc, session, mnist_fixture, binary):
    """Dynamic routing's iteration outputs come back by name, as the session computes them."""
    x = images(mnist_fixture, 3)
    inp = triton.InferInput(contract.IMAGE, list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    names = contract.CAPSNET_ITERATION_OUTPUTS
    result = tc.infer(MODEL, [inp], outputs=[triton.InferRequestedOutput(n, binary_data=binary) for n in names])
    assert [o["name"] for o in result.get_response()["outputs"]] == list(names)
    for name, want in zip(names, session.run(list(names), {contract.IMAGE: x}), strict=True):
        np.testing.assert_allclose(result.as_numpy(name), want, rtol=0, atol=1e-6)
    assert result.as_numpy(contract.ROUTING_ITERATIONS).shape == (3, 3, 1152, 10)


def test_decoder_draws_the_masked_capsule(tc, session, mnist_fixture):
    x = images(mnist_fixture, 2)
    lengths, capsules, recon = session.run(
        [contract.LENGTHS, contract.CAPSULES, contract.RECONSTRUCTION], {contract.IMAGE: x}
    )
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


IMAGE = {"name": "image", "datatype": "FP32", "shape": [1, 1, 28, 28]}
JSON = {"content-type": "application/json"}
BINARY = {"content-type": "application/octet-stream"}


def binary_request(request: dict, tensor: bytes) -> tuple[bytes, dict]:
    header = json.dumps(request).encode()
    return header + tensor, {**BINARY, HEADER_LENGTH: str(len(header))}


@pytest.mark.parametrize(
    "body, headers, message",
    [
        (b"", {}, "the request has no body"),
        (b"not json", {}, "not valid JSON"),
        (b"[1, 2]", {}, "JSON object"),
        (json.dumps({"inputs": []}).encode(), {}, "one tensor"),
        (json.dumps({"inputs": [{**IMAGE, "datatype": "INT8", "data": []}]}).encode(), {}, "must be FP32"),
        (json.dumps({"inputs": [{**IMAGE, "data": [1, 2]}]}).encode(), {}, "has 2 values"),
        (json.dumps({"inputs": [{**IMAGE, "shape": [5000, 1, 28, 28], "data": []}]}).encode(), {}, "1 to 1024 rows"),
        (json.dumps({"inputs": [{**IMAGE, "data": ["x"] * 784}]}).encode(), {}, "list of numbers"),
        (json.dumps({"inputs": [{**IMAGE, "data": ["0.5"] * 784}]}).encode(), {}, "list of numbers"),
        (json.dumps({"inputs": [{**IMAGE, "data": [True] * 784}]}).encode(), {}, "list of numbers"),
        (
            json.dumps({"inputs": [{**IMAGE, "data": [0.5] * 783 + [True]}]}).encode(),
            {},
            "(true and false are not numbers)",
        ),
        (
            json.dumps({"inputs": [{**IMAGE, "data": [[[[0] * 27 + [False]] * 28]]}]}).encode(),
            {},
            "(true and false are",
        ),
        (json.dumps({"inputs": [{**IMAGE, "data": [[0.5] * 783, [0.5]]}]}).encode(), {}, "list of numbers"),
        (
            json.dumps({"inputs": [{**IMAGE, "data": [[[[0.0] * 7] * 4] * 28]}]}).encode(),
            {},
            "`data` is nested as shape [1, 28, 4, 7]; send it as [1, 1, 28, 28], or flat",
        ),
        (json.dumps({"inputs": [{**IMAGE, "data": [[0.0] * 28] * 28}]}).encode(), {}, "list of numbers, nested as"),
        (
            *binary_request(
                {"inputs": [{**IMAGE, "data": [0] * 784, "parameters": {"binary_data_size": 3136}}]}, b"\0" * 3136
            ),
            "has both `data` and parameters.binary_data_size; send its values one way",
        ),
        (json.dumps({"inputs": [IMAGE]}).encode(), {}, "input image has no `data`"),
        (json.dumps({"inputs": [{**IMAGE, "data": [1e39] * 784}]}).encode(), {}, "values from 1e+39 to 1e+39"),
        (
            json.dumps({"inputs": [{**IMAGE, "name": "x" * 5000, "data": [0] * 784}]}).encode(),
            {},
            "unknown input 'xxxxx",  # its name quoted to 80 characters, not 5,000
        ),
        (
            json.dumps({"inputs": [{**IMAGE, "data": [2.0] * 784}]}).encode(),
            JSON,
            "values from 2 to 2; the model takes 0 to 1",
        ),
        (
            json.dumps({"inputs": [{**IMAGE, "data": [0] * 784}], "outputs": [{"name": "logits"}]}).encode(),
            {},
            "unknown output",
        ),
        (json.dumps({"inputs": [{**IMAGE, "data": [0] * 784}], "outputs": []}).encode(), {}, "names no output"),
        (json.dumps({"id": 7, "inputs": [{**IMAGE, "data": [0] * 784}]}).encode(), JSON, "`id` must be a string"),
        (
            json.dumps(
                {"inputs": [{**IMAGE, "data": [0] * 784}], "parameters": {"binary_data_output": "yes"}}
            ).encode(),
            JSON,
            "parameters.binary_data_output of the request must be true or false, got 'yes'",
        ),
        (
            json.dumps({"inputs": [{**IMAGE, "data": [0] * 784, "parameters": [1]}]}).encode(),
            JSON,
            "the `parameters` of input image must be a JSON object",
        ),
        (b"{}", {HEADER_LENGTH: "9999"}, "says the JSON request is 9999 bytes, but the whole body is 2"),
        (b"{}", {HEADER_LENGTH: "0"}, "is 0, but the body must start with the JSON request"),
        (b"{}", {HEADER_LENGTH: "two"}, "must be the JSON request's length in bytes, got 'two'"),
        (
            *binary_request({"inputs": [{**IMAGE, "parameters": {"binary_data_size": 3136}}]}, b"\0" * 100),
            "binary_data_size is 3136, but 100 bytes follow the JSON request",
        ),
        (
            *binary_request({"inputs": [{**IMAGE, "parameters": {"binary_data_size": 100}}]}, b"\0" * 100),
            "binary_data_size is 100, but shape [1, 1, 28, 28] holds 784 FP32 values, 3136 bytes",
        ),
        (
            *binary_request({"inputs": [{**IMAGE, "data": [0] * 784}]}, b"\0" * 8),
            "8 bytes follow the JSON request, but input image has no parameters.binary_data_size",
        ),
        (
            json.dumps({"inputs": [{**IMAGE, "parameters": {"binary_data_size": 3136}}]}).encode() + b"\0" * 3136,
            {**JSON, HEADER_LENGTH: "90"},
            "not valid JSON",
        ),  # application/json: the header is not read
    ],
)
def test_hostile_infer_bodies_are_400_with_what_was_wrong(api_url, body, headers, message):
    import httpx

    r = httpx.post(f"{api_url}/v2/models/{MODEL}/infer", content=body, headers=headers, timeout=30)
    assert r.status_code == 400 and message in r.json()["error"] and len(r.json()["error"]) < 400, r.text


def test_binary_data_output_makes_every_output_binary_unless_one_says_otherwise(api_url, session, mnist_fixture):
    """The extension's binary_data_output: every output as bytes, except one whose own binary_data is false."""
    import httpx

    x = images(mnist_fixture, 2)
    body, headers = binary_request(
        {
            "inputs": [{**IMAGE, "shape": [2, 1, 28, 28], "parameters": {"binary_data_size": x.nbytes}}],
            "parameters": {"binary_data_output": True},
            "outputs": [{"name": contract.LENGTHS}, {"name": contract.CAPSULES, "parameters": {"binary_data": False}}],
        },
        x.astype("<f4").tobytes(),
    )
    r = httpx.post(f"{api_url}/v2/models/{MODEL}/infer", content=body, headers=headers, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"] == "application/octet-stream"
    size = int(r.headers[HEADER_LENGTH])
    lengths_out, capsules_out = json.loads(r.content[:size])["outputs"]
    lengths, capsules = session.run([contract.LENGTHS, contract.CAPSULES], {contract.IMAGE: x})
    assert lengths_out["parameters"] == {"binary_data_size": lengths.nbytes} and "data" not in lengths_out
    np.testing.assert_allclose(np.frombuffer(r.content[size:], "<f4").reshape(2, 10), lengths, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.reshape(capsules_out["data"], (2, 10, 16)), capsules, rtol=0, atol=1e-6)


@pytest.mark.parametrize("limit", [1024, 50_000, 100_000])
def test_a_small_body_limit_still_documents_one_row(limit):
    """The rows a body may hold are the limit less some slack for the JSON around the numbers: with a limit
    under that slack the schema said maxItems -1 or 0 (invalid, or unsatisfiable beside minItems 1)."""
    from app.routes.inference_protocol import infer_operation

    session = ort.InferenceSession(
        str(contract.SHIPPED["affine"] / contract.CAPSNET_ONNX), providers=["CPUExecutionProvider"]
    )
    operation = infer_operation("affine", session, list(contract.CAPSNET_OUTPUTS), limit)
    text = json.dumps(operation)
    assert '"maxItems": 0' not in text and '"maxItems": -' not in text and '"maximum": -' not in text
