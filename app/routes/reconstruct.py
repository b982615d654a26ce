"""POST /reconstruct: class capsules in, the decoder's drawings out (the paper's Fig. 4 perturbations);
?model=NAME picks whose decoder (the default model without it)."""

from typing import Annotated

import numpy as np
import orjson
from fastapi import APIRouter, HTTPException, Query, Response
from fastapi.concurrency import run_in_threadpool

from app import imaging
from app.deps import EngineDep, SettingsDep, parse_include
from app.schemas import DRAWING_OPTIONS, ErrorMessage, ReconstructRequest, ReconstructResponse

router = APIRouter(tags=["model"])


def render(images: np.ndarray, parts: set[str]) -> bytes:
    """The drawings as JSON: pixels and/or PNG data URLs (PNGs cost ~0.2 ms each: a Fig. 4 grid's 176, 37 ms)."""
    items = [
        {
            **({"image": image} if "image" in parts else {}),
            **({"png": imaging.png_data_url(image)} if "png" in parts else {}),
        }
        for image in images
    ]
    return orjson.dumps({"items": items}, option=orjson.OPT_SERIALIZE_NUMPY)


@router.post(
    "/reconstruct",
    response_model=ReconstructResponse,
    summary="Draw class capsules with a model's decoder",
    responses={
        400: {"model": ErrorMessage, "description": "the body is not UTF-8 text"},
        404: {"model": ErrorMessage, "description": "no such model"},
        422: {"model": ErrorMessage, "description": "bad digit, capsule or batch size"},
        503: {"model": ErrorMessage, "description": "the model is not ready, or too many requests are waiting"},
        504: {"model": ErrorMessage, "description": "the request waited past its deadline"},
    },
)
async def reconstruct(
    body: ReconstructRequest,
    engine: EngineDep,
    settings: SettingsDep,
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
    items = body.as_items()
    if len(items) > settings.max_reconstruct_batch:
        raise HTTPException(
            422, f"items holds {len(items)} capsules; the limit is {settings.max_reconstruct_batch} per request"
        )
    digits = np.array([item.digit for item in items])
    capsules = np.array([item.capsule for item in items], np.float32)
    images = await engine.reconstruct(digits, capsules)
    return Response(await run_in_threadpool(render, images, parts), media_type="application/json")
