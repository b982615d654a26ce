"""Exception handlers: every client mistake is a 4xx with {"detail": "<a sentence>"}, the router's own 404 and
405 included."""

from types import MappingProxyType

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from app.batcher import DeadlineError, QueueFullError
from app.imaging import ImageError

MAX_ERRORS_SHOWN = 5
# what a 503 (a model warming up, a full queue) or a 504 tells the client: ask again in a second
RETRY_AFTER = MappingProxyType({"Retry-After": "1"})  # read-only: every answer shares it


def describe(errors) -> str:
    """pydantic errors -> "invalid request: body.items.0.digit: Input should be less than or equal to 9"."""
    parts = []
    for error in errors[:MAX_ERRORS_SHOWN]:
        where = ".".join(str(part) for part in error.get("loc", ()))
        message = error.get("msg", "invalid").removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    more = len(errors) - MAX_ERRORS_SHOWN
    return "invalid request: " + "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


async def _http(request: Request, exc: HTTPException) -> Response:
    """FastAPI's answer to an HTTPException, with a sentence for the router's own 404 and 405 (whose detail is
    the status's name): what was asked, and where to look or what the route takes."""
    path = request.url.path if len(request.url.path) <= 100 else request.url.path[:100] + "..."
    if exc.status_code == 404 and exc.detail == "Not Found":
        exc = HTTPException(404, f"this server has no route {path} (GET /docs lists them)", exc.headers)
    elif exc.status_code == 405 and exc.detail == "Method Not Allowed" and exc.headers:
        allowed = exc.headers.get("Allow", "")
        exc = HTTPException(405, f"{path} takes {allowed}, not {request.method}", exc.headers)
    return await http_exception_handler(request, exc)


async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse({"detail": describe(exc.errors())}, 422)


async def _image(request: Request, exc: ImageError) -> JSONResponse:
    return JSONResponse({"detail": exc.detail}, exc.status_code)


async def _busy(request: Request, exc: QueueFullError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, 503, headers=RETRY_AFTER)


async def _late(request: Request, exc: DeadlineError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, 504, headers=RETRY_AFTER)


def register_error_handlers(app: FastAPI) -> None:
    # Starlette types every handler as taking any Exception, not the class it is registered for
    # (Kludex/starlette#2403): the ignores below are for that
    app.add_exception_handler(HTTPException, _http)  # type: ignore[arg-type]  # a subclass's handler
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]  # a subclass's handler
    app.add_exception_handler(ImageError, _image)  # type: ignore[arg-type]  # a subclass's handler
    app.add_exception_handler(QueueFullError, _busy)  # type: ignore[arg-type]  # a subclass's handler
    app.add_exception_handler(DeadlineError, _late)  # type: ignore[arg-type]  # a subclass's handler
