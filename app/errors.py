"""Exception handlers: every client mistake is a 4xx with {"detail": "<a sentence>"}."""

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app.batcher import DeadlineError, QueueFullError
from app.imaging import ImageError

MAX_ERRORS_SHOWN = 5


def describe(errors) -> str:
    """pydantic errors -> "invalid request: body.items.0.digit: Input should be less than or equal to 9"."""
    parts = []
    for error in errors[:MAX_ERRORS_SHOWN]:
        where = ".".join(str(part) for part in error.get("loc", ()))
        message = error.get("msg", "invalid").removeprefix("Value error, ")
        parts.append(f"{where}: {message}" if where else message)
    more = len(errors) - MAX_ERRORS_SHOWN
    return "invalid request: " + "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse({"detail": describe(exc.errors())}, 422)


async def _image(request: Request, exc: ImageError) -> JSONResponse:
    return JSONResponse({"detail": exc.detail}, exc.status_code)


async def _busy(request: Request, exc: QueueFullError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, 503, headers={"Retry-After": "1"})


async def _late(request: Request, exc: DeadlineError) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, 504, headers={"Retry-After": "1"})


def register_error_handlers(app: FastAPI) -> None:
    # Starlette types every handler as taking any Exception, not the class it is registered for
    # (Kludex/starlette#2403): the ignores below are for that
    app.add_exception_handler(RequestValidationError, _validation)  # type: ignore[arg-type]  # a subclass's handler
    app.add_exception_handler(ImageError, _image)  # type: ignore[arg-type]  # a subclass's handler
    app.add_exception_handler(QueueFullError, _busy)  # type: ignore[arg-type]  # a subclass's handler
    app.add_exception_handler(DeadlineError, _late)  # type: ignore[arg-type]  # a subclass's handler
