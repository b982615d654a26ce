"""GET /health (alive), /ready (model loaded and warmed up), /model (model card and providers)."""
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.deps import EngineDep
from app.schemas import Batching, ErrorMessage, Health, ModelCard, Ready

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, summary="The process is alive")
async def health() -> Health:
    return Health()


@router.get("/ready", response_model=Ready, summary="The model is loaded and warmed up",
            responses={503: {"model": ErrorMessage, "description": "still warming up, or warm-up failed"}})
async def ready(engine: EngineDep):
    if not engine.ready:
        return JSONResponse({"detail": f"not ready: {engine.state}"}, 503)
    return Ready(providers=engine.providers, precision=engine.precision)


@router.get("/model", response_model=ModelCard, summary="Model card and the execution providers in use")
async def model(engine: EngineDep) -> ModelCard:
    batching = Batching.model_validate(engine.settings, from_attributes=True)
    return ModelCard(**{**engine.card, "version": engine.version, "providers": engine.providers,
                        "precision": engine.precision, "routing_maps": engine.routing_weighting, "batching": batching})
