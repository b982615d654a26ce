"""POST /predict: an image in (multipart `file` or JSON base64 `image`), the model's answer out."""
from typing import Annotated

import numpy as np
import orjson
from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from app import imaging
from app.deps import EngineDep, SettingsDep
from app.engine import Engine, Outputs, routing_maps
from app.schemas import INCLUDE_OPTIONS, ErrorMessage, PredictRequest, PredictResponse, Preprocess
from model import contract

router = APIRouter(tags=["model"])

REQUEST_BODY = {"requestBody": {"required": True, "content": {
    "multipart/form-data": {"schema": {
        "type": "object", "required": ["file"],
        "properties": {"file": {"type": "string", "format": "binary",
                                "description": "a PNG, JPEG, BMP, GIF or WebP image of one digit"}}}},
    "application/json": {"schema": PredictRequest.model_json_schema()},
}}}
ERRORS = {status: {"model": ErrorMessage, "description": text} for status, text in {
    400: "malformed multipart body", 413: "body or image too large", 415: "neither multipart nor JSON", 422: "not a usable image, bad option",
    503: "too many requests waiting"}.items()}


def parse_include(include: str | None) -> set[str]:
    if include is None:
        return set(INCLUDE_OPTIONS)
    parts = {part.strip() for part in include.split(",") if part.strip()}
    unknown = sorted(parts - set(INCLUDE_OPTIONS))
    if unknown:
        raise HTTPException(422, f"include has unknown part(s) {', '.join(unknown)}; choose from "
                                 f"{', '.join(INCLUDE_OPTIONS)} (comma separated)")
    return parts


async def read_image_bytes(request: Request) -> bytes:
    """The image file from a multipart `file` field or a JSON {"image": base64}."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "multipart/form-data":
        async with request.form(max_files=1, max_fields=16) as form:
            upload = form.get("file")
            if upload is None:
                raise HTTPException(422, f"the multipart body has no `file` field (it has: "
                                         f"{', '.join(form.keys()) or 'nothing'}); send -F file=@digit.png")
            if not isinstance(upload, UploadFile):
                raise HTTPException(422, "`file` must be a file upload, not a text field")
            return await upload.read()
    if media_type == "application/json":
        try:
            payload = PredictRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
        return imaging.from_base64(payload.image)
    raise HTTPException(415, f"send the image as multipart/form-data (field `file`) or as application/json "
                             f"{{\"image\": \"<base64>\"}}, not {media_type or 'a body without Content-Type'}")


INLINE_BYTES = 16 * 1024  # a 28x28 image this small, taken as it is: well under a millisecond, less than a thread hop


async def load_input(data: bytes, preprocess: str, max_pixels: int) -> imaging.Prepared:
    """Bytes -> the (28, 28) model input and its warnings, off the event loop: finding the digit
    (preprocess=mnist) takes milliseconds even for a small image. Only a small image taken as it is
    (preprocess=none, a 28x28 file by its header) is read inline."""
    def work() -> imaging.Prepared:
        return imaging.preprocess(imaging.decode(data, max_pixels), preprocess)

    as_is = (contract.IMAGE_SIZE, contract.IMAGE_SIZE)
    if preprocess == "none" and len(data) <= INLINE_BYTES and imaging.open_image(data, max_pixels).size == as_is:
        return work()
    return await run_in_threadpool(work)


# Halfway between the margin loss's targets (Eq. 4): a capsule this long is neither clearly absent
# (< m- = 0.1) nor clearly present (> m+ = 0.9).
UNDECIDED_LENGTH = (contract.M_PLUS + contract.M_MINUS) / 2


def doubts(lengths: np.ndarray, first: int, second: int) -> list[str]:
    """Sentences for an answer the model is unsure of, read from the capsule lengths (10,) and the
    longest two of them."""
    notes = []
    if lengths[first] < contract.M_MINUS:
        notes.append(f"no digit capsule is long: the longest ({first}) is {lengths[first]:.2f}, below "
                     f"m- = {contract.M_MINUS}; the image may not show a digit")
    if lengths[second] >= UNDECIDED_LENGTH:
        notes.append(f"the runner-up {second} is also long ({lengths[second]:.2f} against {lengths[first]:.2f}); "
                     "the digit is ambiguous")
    return notes


def render(outputs: Outputs, prepared: imaging.Prepared, include: set[str], engine: Engine) -> bytes:
    """The PredictResponse JSON, straight from the arrays (orjson writes float32 as float32)."""
    lengths = outputs[contract.LENGTHS]
    first, second = (int(j) for j in np.argsort(-lengths, kind="stable")[:2])  # first: argmax's
    body: dict = {"prediction": first, "probabilities": lengths,
                  "runner_up": {"digit": second, "length": lengths[second]},  # float32, as the lengths
                  "warnings": prepared.warnings + doubts(lengths, first, second)}
    if "capsules" in include:
        body["capsules"] = outputs[contract.CAPSULES]
    if "reconstruction" in include:
        reconstruction = outputs[contract.RECONSTRUCTION]
        body["reconstruction"] = {"image": reconstruction, "png": imaging.png_data_url(reconstruction)}
    if "routing" in include:
        routing = outputs[contract.ROUTING]
        body["routing"] = {"coefficients": routing,
                           "maps": routing_maps(routing, outputs.get(contract.VOTE_LENGTHS)),
                           "weighting": engine.routing_weighting}
    body["input"] = imaging.png_data_url(prepared.image)
    body["model"] = {"name": engine.name, "version": engine.version, "provider": engine.providers[0],
                     "precision": engine.precision}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


@router.post("/predict", response_model=PredictResponse, responses=ERRORS, openapi_extra=REQUEST_BODY,
             summary="Classify one handwritten digit")
async def predict(
    request: Request, engine: EngineDep, settings: SettingsDep,
    include: Annotated[str | None, Query(
        description="comma list of capsules, reconstruction, routing to return (default: all; empty: none)",
        examples=["capsules,reconstruction,routing"])] = None,
    preprocess: Annotated[Preprocess, Query(
        description="mnist: find the paper and the ink (photos, scans, canvases), keep the digit's parts, "
                    "bring its stroke into MNIST's range, fit 20x20, centre of mass at the centre of 28x28; "
                    "none: the image is already 28x28, white on black")] = "mnist",
) -> Response:
    """Post a digit as multipart `file` (`curl -F file=@digit.png localhost:8000/predict`) or as JSON
    `{"image": "<base64 or data URL>"}`. Concurrent requests share one batch on the model."""
    parts = parse_include(include)
    data = await read_image_bytes(request)
    prepared = await load_input(data, preprocess, settings.max_pixels)
    outputs = await engine.predict(prepared.image)
    return Response(render(outputs, prepared, parts, engine), media_type="application/json")  # < 1 ms: inline
