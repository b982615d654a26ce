"""POST /predict: an image in (multipart `file` or JSON base64 `image`), the model's answer out
(app/answer.py builds it)."""

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, Response

from app import answer
from app.deps import EngineDep, parse_include
from app.image_request import IMAGE_BODY, IMAGE_ERRORS, read_image_bytes
from app.schemas import (
    INCLUDE_DEFAULT,
    INCLUDE_OPTIONS,
    ITERATIONS,
    PREPROCESS_DESCRIPTION,
    PredictResponse,
    Preprocess,
)
from model import contract

router = APIRouter(tags=["model"])


@router.post(
    "/predict",
    response_model=PredictResponse,
    responses=IMAGE_ERRORS,
    openapi_extra=IMAGE_BODY,
    summary="Classify one image: a digit, two overlapping digits or a garment (?model=)",
)
async def predict(
    request: Request,
    engine: EngineDep,
    include: Annotated[
        str | None,
        Query(
            description=f"comma list of {', '.join(INCLUDE_OPTIONS)} to return (default: "
            f"{', '.join(INCLUDE_DEFAULT)}; empty: none). {ITERATIONS}: routing.iterations, dynamic routing "
            "iteration by iteration (Procedure 1; 422 for a model whose graph does not have them)",
            examples=[",".join(INCLUDE_DEFAULT), ",".join(INCLUDE_OPTIONS)],
        ),
    ] = None,
    preprocess: Annotated[Preprocess, Query(description=PREPROCESS_DESCRIPTION)] = "auto",
) -> Response:
    """Post an image as multipart `file` (`curl -F file=@digit.png localhost:8000/predict`) or as JSON
    `{"image": "<base64 or data URL>"}`. Concurrent requests share one batch on the model."""
    parts = parse_include(include, INCLUDE_OPTIONS, INCLUDE_DEFAULT)
    if ITERATIONS in parts and not engine.iteration_names:
        raise HTTPException(
            422,
            f"model {engine.name} cannot show its routing iteration by iteration: its graph has no "
            f"{' or '.join(contract.CAPSNET_ITERATION_OUTPUTS)} (only graphs of dynamic routing exported by "
            f"this code do; its routing is {engine.spec.routing.kind}); leave {ITERATIONS} out of include",
        )
    data = await read_image_bytes(request)
    body = await answer.predict(data, preprocess, parts, engine, engine.settings.max_pixels)
    return Response(body, media_type="application/json")
