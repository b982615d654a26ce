"""POST /predict: an image in (multipart `file` or JSON base64 `image`), the model's answer out
(app/answer.py builds it)."""

from fastapi import APIRouter, HTTPException, Request, Response

from app import answer
from app.deps import engine_named, parse_include, query_parameters, read_query
from app.image_request import IMAGE_BODY, IMAGE_ERRORS, read_image_bytes
from app.schemas import INCLUDE_DEFAULT, INCLUDE_OPTIONS, ITERATIONS, PredictQuery, PredictResponse
from model import contract

router = APIRouter(tags=["model"])


@router.post(
    "/predict",
    response_model=PredictResponse,
    responses=IMAGE_ERRORS,
    openapi_extra={**IMAGE_BODY, "parameters": query_parameters(PredictQuery)},
    summary="Classify one image: a digit, two overlapping digits or a garment (?model=)",
)
async def predict(request: Request) -> Response:
    """Post an image as multipart `file` (`curl -F file=@digit.png localhost:8000/predict`) or as JSON
    `{"image": "<base64 or data URL>"}`. Concurrent requests share one batch on the model."""
    query = read_query(request, PredictQuery)  # ?include, ?preprocess, ?model (app/deps.py says why not FastAPI's)
    engine = engine_named(request, query.model)
    parts = parse_include(query.include, INCLUDE_OPTIONS, INCLUDE_DEFAULT)
    if ITERATIONS in parts and not engine.iteration_names:
        raise HTTPException(
            422,
            f"model {engine.name} cannot show its routing iteration by iteration: its graph has no "
            f"{' or '.join(contract.CAPSNET_ITERATION_OUTPUTS)} (only graphs of dynamic routing exported by "
            f"this code do; its routing is {engine.spec.routing.kind}); leave {ITERATIONS} out of include",
        )
    data = await read_image_bytes(request)
    body = await answer.predict(data, query.preprocess, parts, engine, engine.settings.max_pixels)
    return Response(body, media_type="application/json")
