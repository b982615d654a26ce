"""POST /explain: one image and a sweep of one transform over the model's input, run as one batch; for
each step the class lengths and the followed capsule's 16 numbers (section 5.1: a capsule's direction
says how its entity is drawn, its length whether it is there)."""

import math
from typing import Annotated

import numpy as np
import orjson
from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool

from app import imaging
from app.deps import EngineDep, SettingsDep, parse_include
from app.engine import Engine, Outputs
from app.imaging.transform import TRANSFORMS, TransformName, sweep
from app.routes.predict import ERRORS, REQUEST_BODY, load_input, model_info, read, read_image_bytes
from app.schemas import (
    EXPLAIN_DEFAULT,
    EXPLAIN_OPTIONS,
    MAX_SWEEP_STEPS,
    SWEEP_STEPS,
    ExplainResponse,
    Preprocess,
)
from model import contract

router = APIRouter(tags=["model"])


def sweep_values(transform: TransformName, start: float | None, stop: float | None, steps: int) -> np.ndarray:
    """The sweep's values, start to stop inclusive (the transform's default range where not given); 422
    for a value that is not a finite number within the transform's limits."""
    spec = TRANSFORMS[transform]
    start = spec.default[0] if start is None else start
    stop = spec.default[1] if stop is None else stop
    low, high = spec.limits
    for name, value in (("start", start), ("stop", stop)):
        if not math.isfinite(value) or not low <= value <= high:
            raise HTTPException(
                422, f"{name} = {value} is outside what {transform} takes: {low:g} to {high:g} {spec.unit}"
            )
    return np.linspace(start, stop, steps)


def step(outputs: Outputs, value: float, follow: int, engine: Engine, include: set[str]) -> dict:
    """One step's answer: lengths, the winner, the followed capsule (and every capsule on request)."""
    lengths, capsules = outputs[contract.LENGTHS], outputs[contract.CAPSULES]
    winner = int(np.argmax(lengths))
    item = {
        "value": value,
        "prediction": winner,
        "label": engine.spec.classes[winner],
        "lengths": lengths,
        "capsule": capsules[follow],
    }
    if "capsules" in include:
        item["capsules"] = capsules
    return item


def render(
    transform: TransformName,
    values: np.ndarray,
    follow: int,
    original: Outputs,
    outputs: list[Outputs],
    images: np.ndarray,
    drawings: np.ndarray | None,
    prepared: imaging.Prepared,
    include: set[str],
    engine: Engine,
) -> bytes:
    """The ExplainResponse JSON; the PNGs (about 0.2 ms each) are why it runs off the event loop."""
    spec = TRANSFORMS[transform]
    steps = [step(out, float(v), follow, engine, include) for out, v in zip(outputs, values, strict=True)]
    if "inputs" in include:
        for item, image in zip(steps, images, strict=True):
            item["input"] = imaging.png_data_url(image)
    if drawings is not None:
        for item, drawing in zip(steps, drawings, strict=True):
            item["reconstruction"] = imaging.png_data_url(drawing)
    body = {
        "transform": transform,
        "unit": spec.unit,
        "follow": {"digit": follow, "label": engine.spec.classes[follow]},
        "original": step(original, spec.identity, follow, engine, include),
        "steps": steps,
        "input": imaging.png_data_url(prepared.image),
        "warnings": prepared.warnings,
        "model": model_info(engine),
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


@router.post(
    "/explain",
    response_model=ExplainResponse,
    responses=ERRORS,
    openapi_extra=REQUEST_BODY,
    summary="Sweep a transform over an image and watch the capsules: equivariance, one batch (?model=)",
)
async def explain(
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    transform: Annotated[
        TransformName,
        Query(
            description="what to do to the model's input: "
            + "; ".join(
                f"{name} ({t.unit}, {t.limits[0]:g} to {t.limits[1]:g}): {t.describe}" for name, t in TRANSFORMS.items()
            )
        ),
    ] = "rotate",
    start: Annotated[float | None, Query(description="the first value (default: the transform's usual range)")] = None,
    stop: Annotated[float | None, Query(description="the last value, included")] = None,
    steps: Annotated[
        int, Query(ge=2, le=MAX_SWEEP_STEPS, description="values from start to stop, evenly")
    ] = SWEEP_STEPS,
    follow: Annotated[
        int | None,
        Query(ge=0, le=contract.NUM_CLASSES - 1, description="the class whose capsule to follow (default: the answer)"),
    ] = None,
    include: Annotated[
        str | None,
        Query(
            description="comma list of inputs, reconstructions, capsules to return per step (default: inputs, "
            "reconstructions; empty: none)",
            examples=["inputs,reconstructions"],
        ),
    ] = None,
    preprocess: Annotated[
        Preprocess, Query(description="as /predict's: auto (the card's preprocessing) or none (already the input)")
    ] = "auto",
) -> Response:
    """Post an image as /predict takes it (multipart `file` or JSON `{"image": base64}`). The model's input
    is prepared as /predict prepares it, then transformed once per value (app/imaging/transform.py) and
    read as one batch; the decoder draws the followed capsule at every step in one more batch."""
    parts = parse_include(include, EXPLAIN_OPTIONS, EXPLAIN_DEFAULT)
    values = sweep_values(transform, start, stop, steps)
    data = await read_image_bytes(request)
    prepared = await load_input(data, preprocess, engine, settings.max_pixels)
    original, prepared = await read(prepared, engine, iterations=False)
    chosen = int(np.argmax(original[contract.LENGTHS])) if follow is None else follow
    images = await run_in_threadpool(sweep, prepared.image, transform, values)
    outputs = await engine.predict_many(images)
    drawings = None
    if "reconstructions" in parts:
        capsules = np.stack([out[contract.CAPSULES][chosen] for out in outputs])
        drawings = await engine.reconstruct(np.full(len(outputs), chosen), capsules)
    body = await run_in_threadpool(
        render, transform, values, chosen, original, outputs, images, drawings, prepared, parts, engine
    )
    return Response(body, media_type="application/json")
