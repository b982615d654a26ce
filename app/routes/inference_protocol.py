"""The Open Inference Protocol (KServe v2, Triton's HTTP API) beside our own routes.

Two models per served model NAME (GET /models: mnist, multimnist, ...): NAME is the CapsNet graph
(image -> the contract's outputs) and NAME_decoder the decoder (masked capsules -> reconstruction): the
graphs /predict reads (on the CPU, an int8 CapsNet where the card ships one; the Triton repository of
training/triton.py holds the fp32 ones). Tensors are the
raw graph tensors of model/contract.py, in and out; `outputs` selects which come back (all without
it). Dynamic routing's CapsNet graphs also have routing_iterations and logit_changes (Procedure 1 iteration
by iteration), fetched only for a request that asks for them or for all. Both share the engine and its
dynamic batchers with /predict and /reconstruct.

Requests and responses are JSON, or JSON followed by raw little-endian tensor bytes (the protocol's
binary tensor data extension, what tritonclient sends by default): the header
`Inference-Header-Content-Length` gives the JSON part's length, an input's
`parameters.binary_data_size` its byte count, and an output asked for with `parameters.binary_data`
comes back the same way. A body sent as `Content-Type: application/json` is the JSON request alone.
Errors are `{"error": "<sentence>"}`: 400 for a bad request, 404 for an unknown model, 503 while not
ready or when the queue is full, 504 past the request deadline (503 and 504 with Retry-After). A body over
the size limit, or in a content coding, is the middleware's 413 or 415 `detail`, as on every route
(app/middleware.py).

The OpenAPI document has one infer operation per served graph, with that graph's own request schema
(`document_infer`): every request it describes is one the route takes (its rows are those an answer of
every output has room for; more are taken when `outputs` names fewer, as its description says).
"""

import itertools
import math
import re
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson
from fastapi import Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from app import VERSION
from app.batcher import DeadlineError, QueueFullError
from app.deps import EnginesDep, is_json, shown
from app.engine import Engine, Engines
from app.errors import RETRY_AFTER
from app.router import Router
from app.schemas import CAPSULE_LIMIT, ErrorMessage, InferResponse, infer_request_schema
from model import contract

TAG = "open inference protocol (v2)"
router = Router(prefix="/v2", tags=[TAG])

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_ROWS = 1024  # images or capsule sets in one infer request
MIDDLEWARE = ("413", "415")  # statuses app/middleware.py answers before the route, with `detail`
# values in one answer: about 45 MB as JSON, 16 MB in binary. A row's every output is 58,557 values for mnist
# (routing_iterations: 34,560), so a request within MAX_ROWS and the body limit could ask for gigabytes
MAX_ANSWER_VALUES = 2**22
# What the graphs' inputs may hold: pixels as the contract says, capsules as /reconstruct takes them
VALUE_RANGE = {contract.IMAGE: contract.PIXEL_RANGE, contract.CAPSULES: (-CAPSULE_LIMIT, CAPSULE_LIMIT)}
# The documented rows per request also fit the body limit (CAPSNET_MAX_BODY_BYTES): a JSON number takes
# up to 25 bytes with its separator ("1.2345678901234567e-05, "), a binary one 4; 64 KiB for the rest
JSON_NUMBER_BYTES, BODY_SLACK = 25, 64 * 1024
SERVER = {"name": "capsnet-service", "version": VERSION, "extensions": ["binary_tensor_data"]}


class ErrorBody(BaseModel):
    error: str


def documented(*statuses: int) -> dict:
    """The error answers a route can give, for its OpenAPI entry."""
    meaning = {
        400: "a malformed request",
        404: "no such model or version",
        503: "not ready, or the queue is full",
        504: "the model did not answer within the request deadline",
    }
    return {status: {"model": ErrorBody, "description": meaning[status]} for status in statuses}


class ProtocolError(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def error(message: str, status: int) -> JSONResponse:
    """The protocol's error answer; a 503 or 504 also says when to ask again."""
    return JSONResponse({"error": message}, status, headers=RETRY_AFTER if status in (503, 504) else None)


DECODER = "_decoder"


def session_of(engines: Engines, name: str) -> tuple[Engine, ort.InferenceSession]:
    """The engine and ONNX Runtime session a protocol model name stands for (NAME or NAME_decoder)."""
    base = name.removesuffix(DECODER)
    if base not in engines.names:
        known = ", ".join(f"{n}, {n}{DECODER}" for n in engines.names)
        raise ProtocolError(f"unknown model {shown(name)}; this server has {known}", 404)
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
        return {
            "name": name,
            "versions": [engine.version],
            "platform": "onnxruntime_onnx",
            "inputs": [tensor_metadata(i) for i in session.get_inputs()],
            "outputs": [tensor_metadata(o) for o in session.get_outputs()],
        }
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
        raise ProtocolError(
            f"model version {shown(version)} is not served; the served version is {engine.version}", 404
        )


# --- inference ---------------------------------------------------------------------------------------


def split_body(body: bytes, content_type: str | None, header_length: str | None) -> tuple[dict, bytes]:
    """The JSON request and the binary tensor data after it. A body sent as application/json is the JSON
    request alone; any other (the extension's application/octet-stream, or none, as tritonclient sends)
    starts with Inference-Header-Content-Length bytes of JSON, or is all JSON without the header."""
    if not body:
        raise ProtocolError('the request has no body; send the JSON inference request, {"inputs": [...]}')
    if header_length is None or is_json(content_type):
        size = len(body)
    elif not re.fullmatch(r"[0-9]+", header_length.strip()):
        raise ProtocolError(f"{HEADER_LENGTH} must be the JSON request's length in bytes, got {shown(header_length)}")
    else:
        size = int(header_length)
        if size == 0:
            raise ProtocolError(
                f"{HEADER_LENGTH} is 0, but the body must start with the JSON request; send its "
                "length in bytes, or leave the header out when the whole body is JSON"
            )
        if size > len(body):
            raise ProtocolError(
                f"{HEADER_LENGTH} says the JSON request is {size} bytes, but the whole body is {len(body)}"
            )
    try:
        request = orjson.loads(body[:size])
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"the request is not valid JSON: {exc}") from None
    if not isinstance(request, dict):
        raise ProtocolError("the request must be a JSON object with an `inputs` list")
    if not isinstance(request.get("id", ""), str):
        raise ProtocolError(f"`id` must be a string, got {shown(request['id'])}")
    return request, body[size:]


def parameters_of(entry: dict, where: str) -> dict:
    """The `parameters` object of the request, an input or an output ({} when not given)."""
    parameters = entry.get("parameters", {})
    if not isinstance(parameters, dict):
        raise ProtocolError(f"the `parameters` of {where} must be a JSON object, got {shown(parameters)}")
    return parameters


def flag(entry: dict, name: str, where: str, default: bool = False) -> bool:
    """One of the extension's boolean parameters of entry (binary_data_output, binary_data)."""
    value = parameters_of(entry, where).get(name, default)
    if not isinstance(value, bool):
        raise ProtocolError(f"parameters.{name} of {where} must be true or false, got {shown(value)}")
    return value


def holds_booleans(data: list, depth: int) -> bool:
    """Whether a JSON list of numbers nested `depth` deep holds a true or a false, which numpy reads as 1 and 0
    among numbers."""
    for _ in range(depth - 1):
        data = list(itertools.chain.from_iterable(data))
    return bool in set(map(type, data))


def read_input(request: dict, session, binary: bytes) -> np.ndarray:
    """The one input tensor of the request, checked against the graph's."""
    (expected,) = session.get_inputs()
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise ProtocolError(f"`inputs` must be a list holding one tensor, {expected.name}")
    tensor = inputs[0]
    if tensor.get("name") != expected.name:
        raise ProtocolError(f"unknown input {shown(tensor.get('name'))}; the model's input is {expected.name}")
    if tensor.get("datatype") != "FP32":
        raise ProtocolError(f"input {expected.name} must be FP32, got {shown(tensor.get('datatype'))}")
    shape = tensor.get("shape")
    want = tensor_metadata(expected)["shape"]
    if isinstance(shape, list) and all((isinstance(d, float) and d.is_integer()) or type(d) is int for d in shape):
        shape = [int(d) for d in shape]  # JSON's 28.0 is the integer 28
    if (
        not isinstance(shape, list)
        or len(shape) != len(want)
        or not all(type(d) is int for d in shape)
        or any(w not in (-1, d) for w, d in zip(want, shape, strict=True))
        or not 1 <= shape[0] <= MAX_ROWS
    ):
        raise ProtocolError(
            f"input {expected.name} has shape {shown(shape)}; the model takes {want} with 1 to {MAX_ROWS} rows"
        )
    count = math.prod(shape)
    size = parameters_of(tensor, f"input {expected.name}").get("binary_data_size")
    if size is not None and tensor.get("data") is not None:
        raise ProtocolError(
            f"input {expected.name} has both `data` and parameters.binary_data_size; send its values one way"
        )
    if size is not None:
        if type(size) is not int or size != 4 * count:
            raise ProtocolError(
                f"input {expected.name}: binary_data_size is {shown(size)}, but shape {shape} holds "
                f"{count} FP32 values, {4 * count} bytes"
            )
        if len(binary) != size:
            raise ProtocolError(
                f"input {expected.name}: binary_data_size is {size}, but {len(binary)} bytes follow "
                f"the JSON request (its length goes in {HEADER_LENGTH}, and not with "
                "Content-Type: application/json)"
            )
        array = np.frombuffer(binary, dtype="<f4")
    else:
        if binary:
            raise ProtocolError(
                f"{len(binary)} bytes follow the JSON request, but input {expected.name} has no "
                "parameters.binary_data_size; send its values as `data`, or say their size"
            )
        data = tensor.get("data")
        if data is None:
            raise ProtocolError(
                f"input {expected.name} has no `data`: send its values as `data`, or as bytes after the JSON "
                "request with parameters.binary_data_size"
            )
        try:  # no dtype: strings, booleans and ragged lists stay what they are, and are refused below
            array = np.asarray(data)
        except ValueError:
            array = np.empty(0, object)
        if array.dtype.kind not in "iuf" or array.ndim not in (1, len(shape)) or holds_booleans(data, array.ndim):
            raise ProtocolError(
                f"input {expected.name}: `data` must be a list of numbers, nested as shape {shape} or flat (true "
                "and false are not numbers)"
            )
        if array.ndim > 1 and list(array.shape) != shape:
            raise ProtocolError(
                f"input {expected.name}: `data` is nested as shape {list(array.shape)}; send it as {shape}, or flat"
            )
        array = array.reshape(-1)
        if array.size != count:
            raise ProtocolError(f"input {expected.name}: `data` has {array.size} values, shape {shape} needs {count}")
    low, high = VALUE_RANGE.get(expected.name, (-np.inf, np.inf))  # checked before float32 could overflow
    if not np.isfinite(array).all():
        raise ProtocolError(f"input {expected.name} holds NaN or infinite values")
    if array.size and not low <= array.min() <= array.max() <= high:
        raise ProtocolError(
            f"input {expected.name} holds values from {array.min():g} to {array.max():g}; "
            f"the model takes {low:g} to {high:g}"
        )
    return array.reshape(shape).astype(np.float32, copy=False)


def requested_outputs(request: dict, names: list[str]) -> list[tuple[str, bool]]:
    """(output name, as binary) pairs to return: those asked for, else all of the graph's. An output is
    binary when its binary_data says so, else when the request's binary_data_output does."""
    asked = request.get("outputs")
    binary = flag(request, "binary_data_output", "the request")
    if asked is None:
        return [(name, binary) for name in names]
    if not isinstance(asked, list) or not all(isinstance(o, dict) for o in asked):
        raise ProtocolError('`outputs` must be a list of {"name": ...} objects')
    if not asked:
        raise ProtocolError("`outputs` names no output: name at least one, or leave `outputs` out for all of them")
    unknown = [o.get("name") for o in asked if o.get("name") not in names]
    if unknown:
        raise ProtocolError(f"unknown output(s) {shown(unknown)}; the model's outputs are {', '.join(names)}")
    return [(o["name"], flag(o, "binary_data", f"output {o['name']}", binary)) for o in asked]


def row_values(session) -> dict[str, int]:
    """Each output of a graph: how many values a row of it holds."""
    return {out.name: math.prod(d for d in out.shape[1:] if isinstance(d, int)) for out in session.get_outputs()}


def check_answer_size(session, rows: int, wanted: list[tuple[str, bool]]) -> None:
    """A 400 for a request whose answer would hold more than MAX_ANSWER_VALUES values."""
    per_row = row_values(session)
    values = rows * sum(per_row[name] for name, _ in wanted)
    if values > MAX_ANSWER_VALUES:
        raise ProtocolError(
            f"the answer would hold {values:,} values ({rows} rows of {', '.join(name for name, _ in wanted)}); this "
            f"server answers at most {MAX_ANSWER_VALUES:,} a request: send fewer rows, or name the `outputs` you need "
            f"(values a row: {', '.join(f'{name} {count:,}' for name, count in per_row.items())})"
        )


def parse(raw: bytes, content_type: str | None, header_length: str | None, session, names: list[str]):
    """The request, its input tensor and the outputs to return (CPU work: run off the event loop)."""
    body, binary = split_body(raw, content_type, header_length)
    x, wanted = read_input(body, session, binary), requested_outputs(body, names)
    check_answer_size(session, len(x), wanted)
    return body, x, wanted


def answer(name: str, version: str, body: dict, results: dict, wanted: list[tuple[str, bool]]) -> Response:
    """The response: JSON, then the binary outputs' bytes (CPU work: run off the event loop)."""
    outputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for out_name, as_binary in wanted:
        array = np.ascontiguousarray(results[out_name], dtype="<f4")
        entry: dict[str, Any] = {"name": out_name, "datatype": "FP32", "shape": list(array.shape)}
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
    return Response(
        header + b"".join(chunks), media_type="application/octet-stream", headers={HEADER_LENGTH: str(len(header))}
    )


@router.post("/models/{name}/infer", include_in_schema=False)  # documented per graph: document_infer
@router.post("/models/{name}/versions/{version}/infer", include_in_schema=False)
async def infer(name: str, request: Request, engines: EnginesDep, version: str | None = None):
    try:
        engine, session = session_of(engines, name)
        check_version(engine, version)
        if not engine.ready:
            raise ProtocolError(f"not ready: {engine.state}", 503)
        headers = request.headers
        body, x, wanted = await run_in_threadpool(
            parse,
            await request.body(),
            headers.get("content-type"),
            headers.get(HEADER_LENGTH),
            session,
            engine.outputs_of(session),
        )
        results = await engine.infer(session, x, [out for out, _ in wanted])
    except ProtocolError as exc:
        return error(str(exc), exc.status)
    except (QueueFullError, DeadlineError) as exc:
        return error(str(exc), 503 if isinstance(exc, QueueFullError) else 504)
    return await run_in_threadpool(answer, name, engine.version, body, results, wanted)


# --- the OpenAPI document ------------------------------------------------------------------------------

BINARY = {"schema": {"type": "string", "format": "binary"}}


def infer_operation(name: str, session, outputs: list[str], max_body_bytes: int) -> dict:
    """The OpenAPI operation of one graph's infer: its JSON request schema (the graph's input, rows within
    MAX_ROWS, the body limit and, every output asked for, MAX_ANSWER_VALUES), the binary tensor data
    extension, the answers."""
    (node,) = session.get_inputs()
    dims = tensor_metadata(node)["shape"][1:]
    values = math.prod(dims)
    low, high = VALUE_RANGE[node.name]
    room = max_body_bytes - min(BODY_SLACK, max_body_bytes // 2)  # a small limit (1 KiB up) keeps half for rows
    per_row = row_values(session)
    answered = MAX_ANSWER_VALUES // sum(per_row[out] for out in outputs)  # the rows of an answer of every output
    json_rows = max(1, min(MAX_ROWS, answered, room // (JSON_NUMBER_BYTES * values)))
    binary_rows = max(1, min(MAX_ROWS, answered, room // (4 * values)))
    request = infer_request_schema(node.name, dims, low, high, json_rows, outputs)
    binary_form = (
        f"application/octet-stream: the binary tensor data extension. The body starts with the JSON request "
        f'({HEADER_LENGTH} bytes), whose input has `parameters: {{"binary_data_size": 4 x its values}}` in '
        f"place of `data`, then the tensor's float32 values, little-endian, row-major: {4 * values:,} bytes a "
        f"row, 1 to {binary_rows} rows. Without the header the whole body is JSON."
    )
    errors = {
        "400": "a request the graph cannot take; the error says what was wrong",
        "404": "no such model or version",
        "413": "a body over the server's limit (CAPSNET_MAX_BODY_BYTES)",
        "415": "a body in a content coding (Content-Encoding: gzip, ...): send it uncompressed",
        "503": "not ready, or the queue is full",
        "504": "the model did not answer within the request deadline",
    }
    return {
        "tags": [TAG],
        "summary": f"Run {name} on raw tensors",
        "operationId": "infer_" + re.sub(r"\W", "_", name),
        "description": f"{node.name} [rows, {', '.join(map(str, dims))}] -> {', '.join(outputs)} "
        f"(GET /v2/models/{name}), as JSON (application/json: the schema below) or in the binary "
        f"tensor data extension (application/octet-stream: see the request body). An answer holds at most "
        f"{MAX_ANSWER_VALUES:,} values: up to {MAX_ROWS} rows are taken when `outputs` names few enough "
        f"({', '.join(f'{out} {count:,}' for out, count in per_row.items() if out in outputs)} values a row)",
        "parameters": [
            {
                "name": HEADER_LENGTH,
                "in": "header",
                "required": False,
                "schema": {"type": "integer", "minimum": 1},
                "description": "the binary tensor data extension: the length in bytes "
                "of the JSON request at the start of the body; not read "
                "with Content-Type: application/json",
            }
        ],
        "requestBody": {
            "required": True,
            "description": binary_form,
            "content": {"application/json": {"schema": request}, "application/octet-stream": BINARY},
        },
        "responses": {
            "200": {
                "description": "the outputs asked for; with binary outputs, the JSON response followed by their "
                "bytes (application/octet-stream)",
                "headers": {
                    HEADER_LENGTH: {
                        "description": "the JSON response's length (binary responses)",
                        "schema": {"type": "integer"},
                    }
                },
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/InferResponse"}},
                    "application/octet-stream": BINARY,
                },
            },
            **{
                status: {
                    "description": text,
                    "content": {
                        "application/json": {
                            "schema": {
                                "$ref": "#/components/schemas/"
                                + ("ErrorMessage" if status in MIDDLEWARE else "ErrorBody")
                            }
                        }
                    },
                }
                for status, text in errors.items()
            },
        },
    }


def document_infer(schema: dict, engines: Engines, max_body_bytes: int) -> None:
    """Add to an OpenAPI document one infer operation per served graph (NAME and NAME_decoder of every
    model): the route takes every request its schema describes, which one schema for all could not say."""
    for engine in engines:
        for name, session in ((engine.name, engine.capsnet), (engine.name + DECODER, engine.decoder)):
            operation = infer_operation(name, session, engine.outputs_of(session), max_body_bytes)
            schema["paths"][f"/v2/models/{name}/infer"] = {"post": operation}
    _, definitions = models_json_schema(
        [(m, "serialization") for m in (InferResponse, ErrorBody, ErrorMessage)],
        ref_template="#/components/schemas/{model}",
    )
    schema.setdefault("components", {}).setdefault("schemas", {}).update(definitions["$defs"])
