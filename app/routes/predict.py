"""POST /predict: an image in (multipart `file` or JSON base64 `image`), the model's answer out
(app/answer.py builds it), with the time of each of its stages in a Server-Timing header."""

from fastapi import APIRouter, HTTPException, Request, Response

from app import answer
from app.deps import engine_named, parse_include, query_parameters, read_query
from app.image_request import IMAGE_BODY, IMAGE_ERRORS, read_image_bytes
from app.router import RequestRoute
from app.schemas import INCLUDE_DEFAULT, INCLUDE_OPTIONS, ITERATIONS, PredictQuery, PredictResponse
from model import contract

router = APIRouter(tags=["model"], route_class=RequestRoute)
SERVER_TIMING = {
    "description": "milliseconds each stage took in the server: prepare (decoding and preparing the image), "
    "model (the runs, with any wait for a batch), render (the JSON)",
    "schema": {"type": "string", "example": "prepare;dur=0.512, model;dur=1.731, render;dur=0.094"},
}


@router.post(
    "/predict",
    response_model=PredictResponse,
    responses={**IMAGE_ERRORS, 200: {"headers": {"Server-Timing": SERVER_TIMING}}},
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
    body, stages = await answer.predict(data, query.preprocess, parts, engine, engine.settings.max_pixels)
    return Response(body, media_type="application/json", headers={"Server-Timing": server_timing(stages)})


def server_timing(stages: dict[str, float]) -> str:
    """Seconds per stage -> a Server-Timing header (W3C Server Timing: milliseconds), which a browser's
    developer tools show beside the request: `prepare;dur=0.512, model;dur=1.731, render;dur=0.094`."""
    return ", ".join(f"{name};dur={1000 * seconds:.3f}" for name, seconds in stages.items())
