"""Named dependencies: the app's engines (created once, in the lifespan) and the engine of
the model a request names (`?model=NAME`, the default model without it); the parsing of ?include= lists;
a query read as one pydantic model (read_query, query_parameters: /predict's).

FastAPI solves a route's declared parameters anew for every request, inspecting each one's annotation,
which for /predict's three (model, include, preprocess) costs several times one pydantic validation of
the whole query. /predict, the one route a lone client waits on, reads its query with read_query instead
and documents it with query_parameters.
"""

from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from app.engine import Engine, Engines
from app.schemas import MODEL_DESCRIPTION, MODEL_EXAMPLES, MODEL_NAME_LENGTH

Q = TypeVar("Q", bound=BaseModel)

# The dependencies are `async def` though they never await: FastAPI runs a plain `def` dependency on its
# thread pool, a thread hop per request for an attribute read.


async def get_engines(request: Request) -> Engines:
    return request.app.state.engines


async def get_engine(
    request: Request,
    model: Annotated[
        str | None, Query(description=MODEL_DESCRIPTION, examples=MODEL_EXAMPLES, max_length=MODEL_NAME_LENGTH)
    ] = None,
) -> Engine:
    return engine_named(request, model)


def engine_named(request: Request, model: str | None) -> Engine:
    """The engine of the model a request names (the default model for None); 404 for a model not served,
    503 for one not ready yet."""
    engines: Engines = request.app.state.engines
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


def read_query(request: Request, model: type[Q]) -> Q:
    """The request's query as `model`, whose fields each take one value (a string, a number, a Literal):
    unknown names ignored, a repeated name's last value, as FastAPI reads declared parameters; 422 as
    FastAPI's own validation answers (app/errors.py)."""
    try:
        return model.model_validate(request.query_params)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise RequestValidationError([{**error, "loc": ("query", *error["loc"])} for error in errors]) from None


def query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """OpenAPI's parameter objects for a query read with read_query, as FastAPI writes declared ones. Its
    fields' schemas are inline (no $ref: an Enum or a nested model would need the document's definitions)."""
    schema = model.model_json_schema()
    if "$defs" in schema:
        raise TypeError(f"{model.__name__} has fields that a query parameter's schema cannot hold inline")
    return [
        {
            "name": name,
            "in": "query",
            "required": name in schema.get("required", ()),
            "schema": field,
            **({"description": field["description"]} if "description" in field else {}),
        }
        for name, field in schema["properties"].items()
    ]


EnginesDep = Annotated[Engines, Depends(get_engines)]
EngineDep = Annotated[Engine, Depends(get_engine)]
