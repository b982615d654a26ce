"""The Open Inference Protocol (KServe v2, Triton's HTTP API) beside our own routes.

Two models per served model NAME (GET /models: mnist, multimnist, ...): NAME is the CapsNet graph
(image -> the contract's outputs) and NAME_decoder the decoder (masked capsules -> reconstruction), the
same two graphs as the Triton repository of tools/triton.py. Tensors are the
raw graph tensors of model/contract.py, in and out; `outputs` selects which come back. Both share
the engine and its dynamic batchers with /predict and /reconstruct.

Requests and responses are JSON, or JSON followed by raw little-endian tensor bytes (the protocol's
binary tensor data extension, what tritonclient sends by default): the header
`Inference-Header-Content-Length` gives the JSON part's length, an input's
`parameters.binary_data_size` its byte count, and an output asked for with `parameters.binary_data`
comes back the same way. Errors are `{"error": "<sentence>"}`: 400 for a bad request, 404 for an
unknown model, 503 while not ready or when the queue is full, 504 past the request deadline.
"""
import math

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from app import VERSION
from app.batcher import DeadlineError, QueueFullError
from app.deps import EnginesDep
from app.engine import Engine, Engines

router = APIRouter(prefix="/v2", tags=["open inference protocol (v2)"])

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_ROWS = 1024  # images or capsule sets in one infer request
SERVER = {"name": "capsnet-service", "version": VERSION, "extensions": ["binary_tensor_data"]}


class ErrorBody(BaseModel):
    error: str


def documented(*statuses: int) -> dict:
    """The error answers a route can give, for its OpenAPI entry."""
    meaning = {400: "a malformed request", 404: "no such model or version", 503: "not ready, or the queue is full",
               504: "the model did not answer within the request deadline"}
    return {status: {"model": ErrorBody, "description": meaning[status]} for status in statuses}


class ProtocolError(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status)


DECODER = "_decoder"


def session_of(engines: Engines, name: str) -> tuple[Engine, object]:
    """The engine and ONNX Runtime session a protocol model name stands for (NAME or NAME_decoder)."""
    base = name.removesuffix(DECODER)
    if base not in engines.names:
        known = ", ".join(f"{n}, {n}{DECODER}" for n in engines.names)
        raise ProtocolError(f"unknown model {name!r}; this server has {known}", 404)
    engine = engines[base]
    return engine, (engine.decoder if name.endswith(DECODER) else engine.capsnet)


def tensor_metadata(node) -> dict:
    """An ONNX Runtime input or output as the protocol's {name, datatype, shape} (-1: any size)."""
    if node.type != "tensor(float)":
        raise ProtocolError(f"tensor {node.name} has type {node.type}, which this server does not map", 500)
    return {"name": node.name, "datatype": "FP32", "shape": [d if isinstance(d, int) else -1 for d in node.shape]}


# --- health and metadata ---------------------------------------------------------------------------

@router.get("/health/live", summary="The server is alive")
async def live() -> dict:
    return {"live": True}


@router.get("/health/ready", summary="Every model is loaded and warmed up", responses=documented(503))
async def server_ready(engines: EnginesDep):
    return {"ready": True} if engines.ready else error(f"not ready: {engines.state}", 503)


@router.get("", summary="Server metadata")
async def server_metadata() -> dict:
    return SERVER


@router.get("/models/{name}", summary="A model's inputs and outputs", responses=documented(404))
@router.get("/models/{name}/versions/{version}", include_in_schema=False)
async def model_metadata(name: str, engines: EnginesDep, version: str | None = None):
    try:
        engine, session = session_of(engines, name)
        check_version(engine, version)
        return {"name": name, "versions": [engine.version], "platform": "onnxruntime_onnx",
                "inputs": [tensor_metadata(i) for i in session.get_inputs()],
                "outputs": [tensor_metadata(o) for o in session.get_outputs()]}
    except ProtocolError as exc:
        return error(str(exc), exc.status)


@router.get("/models/{name}/ready", summary="The model is ready", responses=documented(404, 503))
@router.get("/models/{name}/versions/{version}/ready", include_in_schema=False)
async def model_ready(name: str, engines: EnginesDep, version: str | None = None):
    try:
        engine, _ = session_of(engines, name)
        check_version(engine, version)
    except ProtocolError as exc:
        return error(str(exc), exc.status)
    return {"name": name, "ready": True} if engine.ready else error(f"not ready: {engine.state}", 503)


def check_version(engine: Engine, version: str | None) -> None:
    if version not in (None, "", engine.version):
        raise ProtocolError(f"model version {version!r} is not served; the served version is {engine.version}", 404)


# --- inference ---------------------------------------------------------------------------------------

def split_body(body: bytes, header_length: str | None) -> tuple[dict, bytes]:
    """The JSON request and the binary tensor data after it (empty without the extension)."""
    try:
        size = len(body) if header_length is None else int(header_length)
    except ValueError:
        raise ProtocolError(f"{HEADER_LENGTH} must be a byte count, got {header_length!r}") from None
    if not 0 < size <= len(body):
        raise ProtocolError(f"{HEADER_LENGTH} is {size} but the body has {len(body)} bytes")
    try:
        request = orjson.loads(body[:size])
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"the request is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise ProtocolError("the request must be a JSON object with an `inputs` list")
    return request, body[size:]


def read_input(request: dict, session, binary: bytes) -> np.ndarray:
    """The one input tensor of the request, checked against the graph's."""
    (expected,) = session.get_inputs()
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise ProtocolError(f"`inputs` must be a list holding one tensor, {expected.name}")
    tensor = inputs[0]
    if tensor.get("name") != expected.name:
        raise ProtocolError(f"unknown input {tensor.get('name')!r}; the model's input is {expected.name}")
    if tensor.get("datatype") != "FP32":
        raise ProtocolError(f"input {expected.name} must be FP32, got {tensor.get('datatype')!r}")
    shape = tensor.get("shape")
    want = tensor_metadata(expected)["shape"]
    if (not isinstance(shape, list) or len(shape) != len(want) or not all(isinstance(d, int) for d in shape)
            or any(w not in (-1, d) for w, d in zip(want, shape)) or not 1 <= shape[0] <= MAX_ROWS):
        raise ProtocolError(f"input {expected.name} has shape {shape}; the model takes {want} "
                            f"with 1 to {MAX_ROWS} rows")
    count = math.prod(shape)
    size = (tensor.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        if size != 4 * count or len(binary) != size:
            raise ProtocolError(f"input {expected.name}: binary_data_size {size} does not match shape {shape} "
                                f"({4 * count} bytes) and the {len(binary)} bytes sent")
        array = np.frombuffer(binary, dtype="<f4")
    else:
        try:
            array = np.asarray(tensor.get("data"), dtype=np.float32).reshape(-1)
        except (TypeError, ValueError):
            raise ProtocolError(f"input {expected.name}: `data` must be a (nested) list of numbers") from None
        if array.size != count:
            raise ProtocolError(f"input {expected.name}: `data` has {array.size} values, shape {shape} needs {count}")
    if not np.isfinite(array).all():
        raise ProtocolError(f"input {expected.name} holds NaN or infinite values")
    return array.reshape(shape).astype(np.float32, copy=False)


def requested_outputs(request: dict, names: list[str]) -> list[tuple[str, bool]]:
    """(output name, as binary) pairs to return: those asked for, else all of the graph's as JSON."""
    asked = request.get("outputs")
    if asked is None:
        binary = bool((request.get("parameters") or {}).get("binary_data_output", False))
        return [(name, binary) for name in names]
    if not isinstance(asked, list) or not all(isinstance(o, dict) for o in asked):
        raise ProtocolError("`outputs` must be a list of {\"name\": ...} objects")
    unknown = [o.get("name") for o in asked if o.get("name") not in names]
    if unknown:
        raise ProtocolError(f"unknown output(s) {unknown}; the model's outputs are {', '.join(names)}")
    return [(o["name"], bool((o.get("parameters") or {}).get("binary_data", False))) for o in asked]


def parse(raw: bytes, header_length: str | None, session, names: list[str]):
    """The request, its input tensor and the outputs to return (CPU work: run off the event loop)."""
    body, binary = split_body(raw, header_length)
    return body, read_input(body, session, binary), requested_outputs(body, names)


def answer(name: str, version: str, body: dict, results: dict, wanted: list[tuple[str, bool]]) -> Response:
    """The response: JSON, then the binary outputs' bytes (CPU work: run off the event loop)."""
    outputs, chunks = [], []
    for out_name, as_binary in wanted:
        array = np.ascontiguousarray(results[out_name], dtype="<f4")
        entry = {"name": out_name, "datatype": "FP32", "shape": list(array.shape)}
        if as_binary:
            chunks.append(array.tobytes())
            entry["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            entry["data"] = array.reshape(-1)  # orjson writes numpy arrays natively
        outputs.append(entry)
    response = {"model_name": name, "model_version": version, "outputs": outputs}
    if "id" in body:
        response["id"] = body["id"]
    header = orjson.dumps(response, option=orjson.OPT_SERIALIZE_NUMPY)
    if not chunks:
        return Response(header, media_type="application/json")
    return Response(header + b"".join(chunks), media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(len(header))})


@router.post("/models/{name}/infer", summary="Run a model on raw tensors", responses=documented(400, 404, 503, 504))
@router.post("/models/{name}/versions/{version}/infer", include_in_schema=False)
async def infer(name: str, request: Request, engines: EnginesDep, version: str | None = None):
    try:
        engine, session = session_of(engines, name)
        check_version(engine, version)
        if not engine.ready:
            raise ProtocolError(f"not ready: {engine.state}", 503)
        body, x, wanted = await run_in_threadpool(parse, await request.body(), request.headers.get(HEADER_LENGTH),
                                                  session, engine.outputs_of(session))
        results = await engine.infer(session, x)
    except ProtocolError as exc:
        return error(str(exc), exc.status)
    except (QueueFullError, DeadlineError) as exc:
        status = 503 if isinstance(exc, QueueFullError) else 504
        return JSONResponse({"error": str(exc)}, status, headers={"Retry-After": "1"})
    return await run_in_threadpool(answer, name, engine.version, body, results, wanted)
