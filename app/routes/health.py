"""GET /health (alive) and /ready (every model loaded and warmed up)."""

from fastapi.responses import JSONResponse

from app.deps import EnginesDep
from app.errors import RETRY_AFTER
from app.router import Router
from app.schemas import Health, Ready, errors

router = Router(tags=["health"])


@router.get("/health", response_model=Health, summary="The process is alive")
async def health() -> Health:
    return Health()


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
