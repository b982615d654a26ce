"""Named dependencies: the app's settings, its engines (created once, in the lifespan) and the engine of
the model a request names (`?model=NAME`, the default model without it); the parsing of ?include= lists."""

from typing import Annotated

from fastapi import Depends, HTTPException, Query, Request

from app.engine import Engine, Engines
from app.settings import Settings

# The dependencies are `async def` though they never await: FastAPI runs a plain `def` dependency on its
# thread pool: three thread hops per request for three attribute reads.


async def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_engines(request: Request) -> Engines:
    return request.app.state.engines


async def get_engine(
    request: Request,
    model: Annotated[
        str | None,
        Query(
            description="the served model to use (GET /models lists them); default: the default model, mnist",
            examples=["mnist", "multimnist", "fashion-mnist"],
            max_length=64,
        ),
    ] = None,
) -> Engine:
    engines: Engines = request.app.state.engines  # not Depends(get_engines): a level FastAPI solves per request
    name = engines.default if model is None else model
    if name not in engines.names:
        raise HTTPException(
            404, f"no model is called {name!r} here; this server serves {', '.join(engines.names)} (GET /models)"
        )
    engine = engines[name]
    if not engine.ready:
        raise HTTPException(503, f"model {name} is not ready: {engine.state}")
    return engine


def parse_include(include: str | None, options: tuple[str, ...], default: tuple[str, ...] | None = None) -> set[str]:
    """?include=a,b -> {"a", "b"}: `default` when absent (None: every option), none when empty; 422 for any
    other word."""
    if include is None:
        return set(options if default is None else default)
    parts = {part.strip() for part in include.split(",") if part.strip()}
    unknown = sorted(parts - set(options))
    if unknown:
        raise HTTPException(
            422, f"include has unknown part(s) {', '.join(unknown)}; choose from {', '.join(options)} (comma separated)"
        )
    return parts


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
EnginesDep = Annotated[Engines, Depends(get_engines)]
EngineDep = Annotated[Engine, Depends(get_engine)]
