"""GET /health (alive), /ready (every model loaded and warmed up), /model (a model's card and providers)."""

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.deps import EngineDep, EnginesDep
from app.schemas import Batching, ErrorMessage, Health, ModelCard, Ready

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, summary="The process is alive")
async def health() -> Health:
    return Health()


@router.get(
    "/ready",
    response_model=Ready,
    summary="Every served model is loaded and warmed up",
    responses={503: {"model": ErrorMessage, "description": "a model is still warming up, or its warm-up failed"}},
)
async def ready(engines: EnginesDep):
    if not engines.ready:
        return JSONResponse({"detail": f"not ready: {engines.state}"}, 503)
    default = engines[engines.default]
    return Ready(providers=default.providers, precision=default.precision, models=engines.names)


@router.get(
    "/model",
    response_model=ModelCard,
    summary="A model's card and the execution providers in use (?model=)",
    responses={
        404: {"model": ErrorMessage, "description": "no such model"},
        422: {"model": ErrorMessage, "description": "a model name that is not one (over 64 characters)"},
        503: {"model": ErrorMessage, "description": "the model is not ready"},
    },
)
async def model(engine: EngineDep) -> ModelCard:
    batching = Batching.model_validate(engine.settings, from_attributes=True)
    return ModelCard(
        **{
            **engine.card,
            "served_as": engine.name,
            "version": engine.version,
            "providers": engine.providers,
            "precision": engine.precision,
            "batching": batching,
        }
    )
