"""POST /reconstruct: class capsules in, the decoder's drawings out (the paper's Fig. 4 perturbations);
?model=NAME picks whose decoder (the default model without it). app/answer.py draws and writes them."""

from typing import Annotated

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request, Response

from app import answer
from app.deps import EngineDep, GivenOnce, json_body, parse_include, read_json
from app.schemas import DRAWING_OPTIONS, ReconstructRequest, ReconstructResponse, errors

router = APIRouter(tags=["model"])


@router.post(
    "/reconstruct",
    response_model=ReconstructResponse,
    summary="Draw class capsules with a model's decoder",
    openapi_extra={"requestBody": json_body(ReconstructRequest)},
    dependencies=[GivenOnce],
    responses=errors(
        {
            404: "no such model",
            415: "a body not sent as application/json, or sent compressed (Content-Encoding)",
            422: "not JSON, a bad digit, capsule or batch size, or an option given twice",
            503: "the model is not ready, or too many requests are waiting",
            504: "the request waited past its deadline",
        }
    ),
)
async def reconstruct(
    request: Request,
    engine: EngineDep,
    include: Annotated[
        str | None,
        Query(
            description="comma list of image (pixels), png (a PNG data URL) to return per drawing (default: both)",
            examples=["image"],
        ),
    ] = None,
) -> Response:
    """`{"digit": 3, "capsule": [16 numbers]}` or `{"items": [...]}` (at most max_reconstruct_batch, 256 by
    default). The decoder sees the 10 class capsules with all but `digit` (the class index) set to zero
    (section 4.1); the drawings have the model's input size (28x28, MultiMNIST's 36x36)."""
    parts = parse_include(include, DRAWING_OPTIONS)
    if not parts:
        raise HTTPException(422, f"include names nothing to return; name {' or '.join(DRAWING_OPTIONS)}, or both")
    items = (await read_json(request, ReconstructRequest)).as_items()
    if len(items) > engine.settings.max_reconstruct_batch:
        raise HTTPException(
            422, f"items holds {len(items)} capsules; the limit is {engine.settings.max_reconstruct_batch} per request"
        )
    digits = np.array([item.digit for item in items])
    capsules = np.array([item.capsule for item in items], np.float32)
    return Response(await answer.reconstruct(digits, capsules, parts, engine), media_type="application/json")
