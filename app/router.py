"""`Router`: an APIRouter whose GET routes answer HEAD too; `RequestRoute`: a route whose endpoint takes the
Request alone.

A server answers HEAD wherever it answers GET (RFC 9110, section 9.3.2): the same status and headers, no
body (uvicorn sends none). Uptime checks, link checkers and `curl -I` send it. The HEAD routes stay out of
the OpenAPI document, which would otherwise list every GET operation twice.
"""

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.routing import APIRoute

# the GET route's settings its HEAD route needs: what shapes the answer (the rest documents it)
ANSWER_SETTINGS = ("response_model", "response_class", "status_code", "dependencies")


class Router(APIRouter):
    def get(self, path: str, **settings: Any) -> Callable[[Any], Any]:
        """@router.get(path, ...) that also registers the endpoint for HEAD at path, undocumented; GET first, so
        that the 405 of another method names GET as what the path takes."""
        get = super().get(path, **settings)
        head = self.head(path, include_in_schema=False, **{k: settings[k] for k in ANSWER_SETTINGS if k in settings})

        def both(endpoint: Callable[..., Any]) -> Callable[..., Any]:
            head(get(endpoint))
            return endpoint

        return both


class RequestRoute(APIRoute):
    """A route whose endpoint takes the Request alone and returns its Response (/predict, which reads its query
    and body itself: app/deps.py's read_query): called as it is, where FastAPI's handler would solve, for each
    request, the parameters, dependencies and body it has none of, and look at what it returns (29-57 us a
    request in process). FastAPI documents it as any other route. An endpoint that declares anything else is
    refused as the route is made: its parameters would never be read."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **settings: Any):
        super().__init__(path, endpoint, **settings)
        d = self.dependant
        declared = (d.path_params, d.query_params, d.header_params, d.cookie_params, d.body_params, d.dependencies)
        if d.request_param_name is None or any(declared):
            raise TypeError(f"{path}: the endpoint of a RequestRoute takes the Request alone and nothing else")

    def get_route_handler(self) -> Callable[..., Any]:
        return self.endpoint
