"""Named dependencies: the app's engines (created once, in the lifespan) and the engine of
the model a request names (`?model=NAME`, the default model without it); the parsing of ?include= lists;
a query that gives each parameter once (given_once); a query read as one pydantic model (read_query,
query_parameters: /predict's); a JSON body read as one (read_json, json_body: /reconstruct's, and
/predict's JSON form).

FastAPI solves a route's declared parameters anew for every request, inspecting each one's annotation,
which for /predict's three (model, include, preprocess) costs several times one pydantic validation of
the whole query. /predict, the one route a lone client waits on, reads its query with read_query instead
and documents it with query_parameters.
"""

from typing import Annotated, Any, TypeVar

from fastapi import Depends, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.datastructures import QueryParams

from app.engine import Engine, Engines
from app.errors import RETRY_AFTER
from app.schemas import MODEL_DESCRIPTION, MODEL_EXAMPLES, MODEL_NAME_LENGTH

Q = TypeVar("Q", bound=BaseModel)
JSON = "application/json"

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
        raise HTTPException(503, f"model {name} is not ready: {engine.state}", RETRY_AFTER)
    return engine


INCLUDE = "include"  # the query parameter that takes a comma list, wherever a route has it


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


def given_once(query: QueryParams) -> None:
    """422 for a query that gives a parameter more than once (`?include=capsules&include=routing`): FastAPI
    reads a declared parameter's last value, so the others would be dropped without a word. A list is one
    value, comma separated (`include=capsules,routing`)."""
    if len(query) == len(query.multi_items()):  # no name twice: the usual query, two lengths compared
        return
    name, values = next((name, query.getlist(name)) for name in query if len(query.getlist(name)) > 1)
    more = f" and {len(values) - 3} more" if values[3:] else ""
    listed = ", ".join(shown(value, 28) for value in values[:3]) + more
    detail = f"the query gives {shown(name, 28)} {len(values)} times ({listed}); give each parameter once"
    if name == INCLUDE:
        joined = ",".join(part.strip() for value in values for part in value.split(",") if part.strip())
        detail += f": {INCLUDE} takes a comma list ({INCLUDE}={joined if len(joined) <= 64 else 'a,b'})"
    raise HTTPException(422, detail)


def shown(value: Any, limit: int = 80) -> str:
    """A client's value as an error quotes it: its repr (control characters escaped), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


async def query_given_once(request: Request) -> None:
    """given_once as a route's dependency (the routes whose parameters FastAPI reads)."""
    given_once(request.query_params)


def read_query(request: Request, model: type[Q]) -> Q:
    """The request's query as `model`, whose fields each take one value (a string, a number, a Literal):
    unknown names ignored, each name given once (given_once); 422 as FastAPI's own validation answers
    (app/errors.py)."""
    given_once(request.query_params)
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


def validated_json(data: bytes, model: type[Q]) -> Q:
    """A JSON body as `model`; 422 as FastAPI's own validation answers, each error under `body`."""
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise RequestValidationError([{**error, "loc": ("body", *error["loc"])} for error in errors]) from None


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type header says JSON (application/json, any parameters)."""
    return (content_type or "").split(";")[0].strip().lower() == JSON


async def read_json(request: Request, model: type[Q]) -> Q:
    """The request's body as `model`: 415 unless it is sent as application/json, 422 for what is wrong in it.
    The route reads it, not FastAPI: FastAPI answers a client that goes away mid-body 400, where
    RequestIdMiddleware logs it as gone (and the metrics count 499)."""
    sent = request.headers.get("content-type")
    if not is_json(sent):
        got = sent or "a body without Content-Type"
        raise HTTPException(415, f"send the body as {JSON} (curl -H 'Content-Type: {JSON}'), not {got}")
    return validated_json(await request.body(), model)


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI request body of a route that reads `model` with read_json: its schema inline, the models
    it nests in place of their $refs (the document's definitions do not hold them)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(definitions[node["$ref"].removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        return [inline(item) for item in node] if isinstance(node, list) else node

    return {"required": True, "content": {JSON: {"schema": inline(schema)}}}


GivenOnce = Depends(query_given_once)  # a route's `dependencies=[GivenOnce]`
EnginesDep = Annotated[Engines, Depends(get_engines)]
EngineDep = Annotated[Engine, Depends(get_engine)]
