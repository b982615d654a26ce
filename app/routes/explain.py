"""POST /explain: one image and a sweep of one transform over the model's input, run as one batch; for
each step the class lengths and the followed capsule's 16 numbers (app/answer.py builds the answer)."""

import math
from typing import Annotated

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request, Response

from app import answer
from app.deps import EngineDep, GivenOnce, parse_include
from app.image_request import IMAGE_BODY, IMAGE_ERRORS, read_image_bytes
from app.imaging.transform import TRANSFORMS, TransformName
from app.schemas import (
    EXPLAIN_DEFAULT,
    EXPLAIN_OPTIONS,
    MAX_SWEEP_STEPS,
    PREPROCESS_DESCRIPTION,
    SWEEP_STEPS,
    WRITTEN,
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


@router.post(
    "/explain",
    response_model=ExplainResponse,
    responses=IMAGE_ERRORS,
    openapi_extra=IMAGE_BODY,
    dependencies=[GivenOnce],
    summary="Sweep a transform over an image and watch the capsules: equivariance, one batch (?model=)",
)
async def explain(
    request: Request,
    engine: EngineDep,
    transform: Annotated[
        TransformName,
        Query(
            description="what to do to the model's input: "
            + "; ".join(
                f"{name} ({t.unit}, {t.limits[0]:g} to {t.limits[1]:g}): {t.describe}" for name, t in TRANSFORMS.items()
            )
        ),
    ] = "rotate",
    start: Annotated[
        float | None, Query(description="the first value (default: the transform's usual range)"), WRITTEN
    ] = None,
    stop: Annotated[float | None, Query(description="the last value, included"), WRITTEN] = None,
    steps: Annotated[
        int, Query(ge=2, le=MAX_SWEEP_STEPS, description="values from start to stop, evenly"), WRITTEN
    ] = SWEEP_STEPS,
    follow: Annotated[
        int | None,
        Query(ge=0, le=contract.NUM_CLASSES - 1, description="the class whose capsule to follow (default: the answer)"),
        WRITTEN,
    ] = None,
    include: Annotated[
        str | None,
        Query(
            description="comma list of inputs, reconstructions, capsules to return per step (default: inputs, "
            "reconstructions; empty: none)",
            examples=["inputs,reconstructions"],
        ),
    ] = None,
    preprocess: Annotated[Preprocess, Query(description=PREPROCESS_DESCRIPTION)] = "auto",
) -> Response:
    """Post an image as /predict takes it (multipart `file` or JSON `{"image": base64}`). The model's input
    is prepared as /predict prepares it, then transformed once per value (app/imaging/transform.py) and
    read as one batch; the decoder draws the followed capsule at every step in one more batch."""
    parts = parse_include(include, EXPLAIN_OPTIONS, EXPLAIN_DEFAULT)
    values = sweep_values(transform, start, stop, steps)
    data = await read_image_bytes(request)
    body = await answer.explain(data, preprocess, engine, engine.settings.max_pixels, transform, values, follow, parts)
    return Response(body, media_type="application/json")
