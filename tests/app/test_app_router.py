"""HEAD wherever GET (app/router.py's Router): the same status and headers without a body, on every route the
OpenAPI document lists for GET and on the undocumented pages (`/`, `/docs`, `/redoc`, the document itself);
the document lists no HEAD. A RequestRoute calls its endpoint as it is, and refuses one that declares more than
the Request."""

from typing import Annotated

import fastapi.routing
import pytest
from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.routing import Mount, Route

from app.router import RequestRoute
from tests.harness import MULTIPART, digit_png, multipart

FILLED = {"{name}": "mnist", "{version}": "1"}


def get_paths(app) -> list[str]:
    paths = [path for path, operations in app.openapi()["paths"].items() if "get" in operations]
    for field, value in FILLED.items():
        paths = [path.replace(field, value) for path in paths]
    pages = [r.path for r in app.routes if isinstance(r, Route) and not r.include_in_schema and "GET" in r.methods]
    return [*paths, *pages]


def test_every_get_route_answers_head_alike(app, client):
    paths = get_paths(app)
    assert {"/health", "/ready", "/models", "/model", "/metrics", "/v2/models/mnist"} <= set(paths)
    assert {"/", "/docs", "/redoc", "/openapi.json"} <= set(paths)
    for path in paths:
        get, head = client.get(path, follow_redirects=False), client.head(path, follow_redirects=False)
        kind = get.headers.get("content-type")
        assert (head.status_code, head.headers.get("content-type")) == (get.status_code, kind), path
        assert get.status_code in (200, 307) and not head.content, path


def test_the_openapi_document_lists_no_head(app):
    assert not [path for path, operations in app.openapi()["paths"].items() if "head" in operations]


@pytest.mark.parametrize("path", ["/models", "/v2/health/live"])
def test_another_method_is_told_get(client, path):
    r = client.put(path)
    assert r.status_code == 405 and r.json()["detail"] == f"{path} takes GET, not PUT"


def test_predict_is_answered_without_solving_parameters(app, client, monkeypatch):
    """/predict's endpoint reads its query and body itself: FastAPI's per-request solving is never called for it
    (it is for a route with parameters, /models/{name}/ready here), and its document still has its parameters."""
    solved, solve = [], fastapi.routing.solve_dependencies

    async def counted(*args, **kwargs):
        solved.append(True)
        return await solve(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted)
    answer = client.post("/predict?include=", content=multipart(digit_png()), headers={"Content-Type": MULTIPART})
    assert answer.status_code == 200 and answer.json()["prediction"] == 7 and not solved
    assert client.get("/v2/models/mnist/ready").status_code == 200 and len(solved) == 1
    operation = app.openapi()["paths"]["/predict"]["post"]
    assert {p["name"] for p in operation["parameters"]} == {"model", "include", "preprocess"}
    assert set(operation["requestBody"]["content"]) == {"multipart/form-data", "application/json"}


async def takes_model(request: Request, model: Annotated[str, Query()]) -> Response:
    return Response()


async def request_alone(request: Request) -> Response:
    return Response()


async def extra() -> None:
    return None


@pytest.mark.parametrize(
    "endpoint, settings",
    [(takes_model, {}), (request_alone, {"dependencies": [Depends(extra)]}), (lambda: Response(), {})],
    ids=["a query parameter", "a dependency", "no request"],
)
def test_a_request_route_refuses_an_endpoint_that_declares_more(endpoint, settings):
    router = APIRouter(route_class=RequestRoute)
    with pytest.raises(TypeError, match="takes the Request alone"):
        router.add_api_route("/x", endpoint, methods=["POST"], **settings)


def test_the_apis_routes_are_matched_first(app, client, monkeypatch):
    """A request is matched against the routes in turn: /predict is found before FastAPI's document, its pages and
    /metrics are tried (each a regular expression on the path)."""
    tried: list[str] = []
    for route in app.routes:
        if isinstance(route, (Route, Mount)):  # the API's own are in its routers

            def spied(scope, route=route, matches=route.matches):
                tried.append(route.path)
                return matches(scope)

            monkeypatch.setattr(route, "matches", spied)
    answer = client.post("/predict?include=", content=multipart(digit_png()), headers={"Content-Type": MULTIPART})
    assert answer.status_code == 200 and not tried
    assert client.get("/docs").status_code == 200 and "/docs" in tried  # the spies see what they are asked
