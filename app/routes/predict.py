"""POST /predict: an image in (multipart `file` or JSON base64 `image`), the model's answer out."""

from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from app import imaging
from app.deps import EngineDep, SettingsDep, parse_include
from app.engine import Engine, Outputs, coupling_changes
from app.schemas import (
    INCLUDE_DEFAULT,
    INCLUDE_OPTIONS,
    ITERATIONS,
    ErrorMessage,
    PredictRequest,
    PredictResponse,
    Preprocess,
)
from model import contract

router = APIRouter(tags=["model"])

REQUEST_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "a PNG, JPEG, BMP, GIF or WebP image: a digit, two "
                            "overlapping digits or a garment, as the model reads",
                        }
                    },
                }
            },
            "application/json": {"schema": PredictRequest.model_json_schema()},
        },
    }
}
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorMessage, "description": text}
    for status, text in {
        400: "malformed multipart body",
        404: "no such model",
        413: "body or image too large",
        415: "neither multipart nor JSON",
        422: "not a usable image, bad option, iterations of a model whose graph has none",
        503: "the model is not ready, or too many requests are waiting",
        504: "the request waited past its deadline (CAPSNET_REQUEST_DEADLINE_S)",
    }.items()
}


async def read_image_bytes(request: Request) -> bytes:
    """The image file from a multipart `file` field or a JSON {"image": base64}."""
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "multipart/form-data":
        async with request.form(max_files=1, max_fields=16) as form:
            upload = form.get("file")
            if upload is None:
                raise HTTPException(
                    422,
                    f"the multipart body has no `file` field (it has: "
                    f"{', '.join(form.keys()) or 'nothing'}); send -F file=@digit.png",
                )
            if not isinstance(upload, UploadFile):
                raise HTTPException(422, "`file` must be a file upload, not a text field")
            return await upload.read()
    if media_type == "application/json":
        try:
            payload = PredictRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
        return imaging.from_base64(payload.image)
    raise HTTPException(
        415,
        f"send the image as multipart/form-data (field `file`) or as application/json "
        f'{{"image": "<base64>"}}, not {media_type or "a body without Content-Type"}',
    )


INLINE_BYTES = 16 * 1024  # a small image taken as it is: well under a millisecond, less than a thread hop


async def load_input(data: bytes, preprocess: str, engine: Engine, max_pixels: int) -> imaging.Prepared:
    """Bytes -> the model's (size, size) input and its warnings, off the event loop: finding the object
    takes half a millisecond for a clean 28x28 digit but tens of milliseconds for some small pictures (a dot is
    scaled up 80 times to have its stroke measured), which must not hold up every other request. Only a
    small image taken as it is (preprocess=none, the model's size by its header) is read inline."""
    how = engine.spec.preprocessing
    kind = "none" if preprocess == "none" else how.kind

    def work() -> imaging.Prepared:
        return imaging.preprocess(imaging.decode(data, max_pixels), kind, engine.size, how.ink_box)

    as_is = (engine.size, engine.size)
    if kind == "none" and len(data) <= INLINE_BYTES and imaging.open_image(data, max_pixels).size == as_is:
        return work()
    return await run_in_threadpool(work)


# Halfway between the margin loss's targets (Eq. 4): a capsule this long is neither clearly absent
# (< m- = 0.1) nor clearly present (> m+ = 0.9).
UNDECIDED_LENGTH = (contract.M_PLUS + contract.M_MINUS) / 2


def doubts(lengths: np.ndarray, order: np.ndarray, classes: list[str], objects: int = 1) -> list[str]:
    """Sentences for an answer the model is unsure of, read from the capsule lengths, their order
    (longest first) and how many objects an image holds (the longest `objects` capsules name them)."""
    notes = []
    last, next_ = int(order[objects - 1]), int(order[objects])
    if lengths[last] < contract.M_MINUS:
        which = "no class capsule is long: the longest" if objects == 1 else f"capsule {objects} of {objects} expected"
        notes.append(
            f"{which} ({classes[last]}) is {lengths[last]:.2f}, below m- = {contract.M_MINUS}; the image "
            f"may not show {'what the model reads' if objects == 1 else f'{objects} objects'}"
        )
    if lengths[next_] >= UNDECIDED_LENGTH:
        notes.append(
            f"the runner-up {classes[next_]} is also long ({lengths[next_]:.2f} against "
            f"{lengths[last]:.2f}); the answer is ambiguous"
        )
    return notes


def image_field(x: np.ndarray) -> dict:
    return {"image": x, "png": imaging.png_data_url(x)}


def model_info(engine: Engine) -> dict:
    """Which graph answered (schemas.ModelInfo)."""
    return {
        "name": engine.name,
        "version": engine.version,
        "provider": engine.providers[0],
        "precision": engine.precision,
    }


def ranked(lengths: np.ndarray) -> np.ndarray:
    """Class indices, longest capsule first (ties: the lower index, as argmax)."""
    return np.argsort(-lengths, kind="stable")


async def read(prepared: imaging.Prepared, engine: Engine, iterations: bool) -> tuple[Outputs, imaging.Prepared]:
    """The model's outputs for the prepared input (with iterations, CAPSNET_ITERATION_OUTPUTS too). Of
    several candidates (a drawing at several scales) the one its own answer explains best: the objects'
    capsules, each decoded alone (one decoder batch for every candidate), redraw the candidate with the
    least squared error per unit of its ink, the reconstruction test of section 6. (The longest capsules
    alone pick worse: 71% vs 83% of 300 held-out pairs drawn at 216 px, benchmarks/drawn_pairs.py.)"""
    if prepared.candidates is None:
        return await engine.predict(prepared.image, iterations), prepared
    images = prepared.candidates
    outputs = await engine.predict_many(images, iterations)
    named = [ranked(out[contract.LENGTHS])[: engine.spec.objects] for out in outputs]
    drawings = await engine.reconstruct(
        np.concatenate(named),
        np.concatenate([out[contract.CAPSULES][c] for out, c in zip(outputs, named, strict=True)]),
    )
    explained = drawings.reshape(len(images), engine.spec.objects, *images.shape[1:]).max(axis=1)
    error = ((explained - images) ** 2).sum(axis=(1, 2)) / np.maximum((images**2).sum(axis=(1, 2)), 1e-6)
    best = int(np.argmin(error))
    return outputs[best], prepared._replace(image=images[best], candidates=None)


async def draw_objects(outputs: Outputs, engine: Engine) -> np.ndarray:
    """Each object of a several-object model (MultiMNIST) drawn from its own capsule, longest first:
    (objects, size, size), one decoder batch (section 6: each digit reconstructed alone)."""
    named = ranked(outputs[contract.LENGTHS])[: engine.spec.objects]
    return await engine.reconstruct(named, outputs[contract.CAPSULES][named])


def routing_iterations(outputs: Outputs, engine: Engine) -> list[dict]:
    """Procedure 1 iteration by iteration (schemas.RoutingIteration): each iteration's routing maps (its
    c_ij times ||u_hat_j|i||), the mean |delta b_ij| it adds (Fig. A.1) and how far it moved the c_ij."""
    couplings = outputs[contract.ROUTING_ITERATIONS]  # (R, primary, classes)
    maps = engine.routing_iteration_maps(couplings, outputs[contract.VOTE_LENGTHS])
    changes = zip(maps, outputs[contract.LOGIT_CHANGES], coupling_changes(couplings), strict=True)
    return [
        {"iteration": r, "maps": m, "logit_change": logit, "coupling_change": coupling}
        for r, (m, logit, coupling) in enumerate(changes, start=1)
    ]


def render(
    outputs: Outputs, prepared: imaging.Prepared, include: set[str], engine: Engine, drawings: np.ndarray | None = None
) -> bytes:
    """The PredictResponse JSON, straight from the arrays (orjson writes float32 as float32). A model
    whose images hold several objects also gets them, with their drawings (draw_objects) and overlay."""
    lengths, classes, objects = outputs[contract.LENGTHS], engine.spec.classes, engine.spec.objects
    order = ranked(lengths)
    first, second = int(order[0]), int(order[objects])
    body: dict = {
        "prediction": first,
        "label": classes[first],
        "probabilities": lengths,
        "runner_up": {"digit": second, "label": classes[second], "length": lengths[second]},
        "warnings": prepared.warnings + doubts(lengths, order, classes, objects),
    }
    if objects > 1:
        body["objects"] = [{"digit": int(j), "label": classes[j], "length": lengths[j]} for j in order[:objects]]
        if drawings is not None:
            for item, drawing in zip(body["objects"], drawings, strict=True):
                item["reconstruction"] = image_field(drawing)
            body["overlay"] = imaging.png_data_url(imaging.overlay(prepared.image, drawings))
    if "capsules" in include:
        body["capsules"] = outputs[contract.CAPSULES]
    if "reconstruction" in include:
        body["reconstruction"] = image_field(outputs[contract.RECONSTRUCTION])
    routing: dict = {}
    if "routing" in include:
        coefficients = outputs[contract.ROUTING]
        routing.update(
            coefficients=coefficients, maps=engine.routing_maps(coefficients, outputs[contract.VOTE_LENGTHS])
        )
    if ITERATIONS in include:
        routing[ITERATIONS] = routing_iterations(outputs, engine)
    if routing:
        body["routing"] = routing
    body["input"] = imaging.png_data_url(prepared.image)
    body["model"] = model_info(engine)
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


@router.post(
    "/predict",
    response_model=PredictResponse,
    responses=ERRORS,
    openapi_extra=REQUEST_BODY,
    summary="Classify one image: a digit, two overlapping digits or a garment (?model=)",
)
async def predict(
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    include: Annotated[
        str | None,
        Query(
            description=f"comma list of {', '.join(INCLUDE_OPTIONS)} to return (default: "
            f"{', '.join(INCLUDE_DEFAULT)}; empty: none). {ITERATIONS}: routing.iterations, dynamic routing "
            "iteration by iteration (Procedure 1; 422 for a model whose graph does not have them)",
            examples=[",".join(INCLUDE_DEFAULT), ",".join(INCLUDE_OPTIONS)],
        ),
    ] = None,
    preprocess: Annotated[
        Preprocess,
        Query(
            description="auto (or its earlier name, mnist): the preprocessing the model's card names (GET /models: "
            "digit finds the paper and the ink in photos, scans and canvases, keeps the digit's parts, "
            "brings its stroke into MNIST's range, fits its ink box and centres its mass; digit-pair does "
            "the same for two overlapping digits; garment trims the background, fits the frame and "
            "negates). none: the image is already the model's input (28x28 or its size), white on "
            "black"
        ),
    ] = "auto",
) -> Response:
    """Post an image as multipart `file` (`curl -F file=@digit.png localhost:8000/predict`) or as JSON
    `{"image": "<base64 or data URL>"}`. Concurrent requests share one batch on the model."""
    parts = parse_include(include, INCLUDE_OPTIONS, INCLUDE_DEFAULT)
    iterations = ITERATIONS in parts
    if iterations and not engine.iteration_names:
        raise HTTPException(
            422,
            f"model {engine.name} cannot show its routing iteration by iteration: its graph has no "
            f"{' or '.join(contract.CAPSNET_ITERATION_OUTPUTS)} (only graphs of dynamic routing exported by "
            f"this code do; its routing is {engine.spec.routing.kind}); leave {ITERATIONS} out of include",
        )
    data = await read_image_bytes(request)
    prepared = await load_input(data, preprocess, engine, settings.max_pixels)
    outputs, prepared = await read(prepared, engine, iterations)
    several = engine.spec.objects > 1 and "reconstruction" in parts
    drawings = await draw_objects(outputs, engine) if several else None
    return Response(render(outputs, prepared, parts, engine, drawings), media_type="application/json")  # < 1 ms
