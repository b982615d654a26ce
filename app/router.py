"""`Router`: an APIRouter whose GET routes answer HEAD too.

A server answers HEAD wherever it answers GET (RFC 9110, section 9.3.2): the same status and headers, no
body (uvicorn sends none). Uptime checks, link checkers and `curl -I` send it. The HEAD routes stay out of
the OpenAPI document, which would otherwise list every GET operation twice.
"""

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter

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
