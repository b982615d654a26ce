"""GET /health (alive) and /ready (every model loaded and warmed up)."""

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.deps import EnginesDep
from app.errors import RETRY_AFTER
from app.schemas import Health, Ready, errors

router = APIRouter(tags=["health"])


# GET and HEAD (the same answer, undocumented twice): a load balancer's or orchestrator's probe may send either
@router.head("/health", include_in_schema=False)
@router.get("/health", response_model=Health, summary="The process is alive")
async def health() -> Health:
    return Health()


@router.head("/ready", include_in_schema=False)
@router.get(
    "/ready",
    response_model=Ready,
    summary="Every served model is loaded and warmed up",
    responses=errors({503: "a model is still warming up, or its warm-up failed"}),
)
async def ready(engines: EnginesDep):
    if not engines.ready:
        return JSONResponse({"detail": f"not ready: {engines.state}"}, 503, headers=RETRY_AFTER)
    default = engines[engines.default]
    return Ready(providers=default.providers, precision=default.precision, models=engines.names)
