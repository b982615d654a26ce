"""HEAD wherever GET (app/router.py's Router): the same status and headers without a body, on every route the
OpenAPI document lists for GET and on the undocumented pages (`/`, `/docs`, `/redoc`, the document itself);
the document lists no HEAD."""

import pytest
from starlette.routing import Route

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
