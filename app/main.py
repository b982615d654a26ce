"""The FastAPI app: create_app(settings) builds it; the lifespan loads the engine once.

$ python -m app                       # uvicorn on CAPSNET_HOST:CAPSNET_PORT (127.0.0.1:8000)
$ curl -F file=@digit.png localhost:8000/predict
"""

import gc
import threading
import warnings
from contextlib import asynccontextmanager
from typing import Any

import cv2
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import RedirectResponse
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from threadpoolctl import threadpool_limits

from app import VERSION
from app.cores import Home, this_worker
from app.engine import Engines
from app.errors import register_error_handlers
from app.http_protocol import REQUEST_ID
from app.metrics import setup_metrics
from app.middleware import BoardMiddleware, BodyLimitMiddleware, HttpMetricsMiddleware, RequestIdMiddleware
from app.routes import explain, health, inference_protocol, models, predict, reconstruct
from app.settings import Settings, get_settings

DESCRIPTION = """CapsNet (Sabour, Frosst & Hinton 2017, https://arxiv.org/abs/1710.09829) on ONNX Runtime.

Post a handwritten digit to `/predict`; get the digit capsules' lengths (class probabilities), the
capsules, the decoder's reconstruction and the routing maps (every coefficient on request). `GET /models`
lists every served model (`?model=multimnist`: two overlapping digits, each reconstructed from its own
capsule; `?model=fashion-mnist`: a garment). Every client mistake is a 4xx
with `{"detail": "..."}`; every response carries an `X-Request-ID`."""
DOCS = "/docs"  # the Swagger UI page, from files the service serves itself (no CDN), as is ReDoc at /redoc


def one_thread_for_pictures() -> None:
    """numpy's BLAS and OpenCV on one thread, as a request's preparation runs: its matrices and pictures
    are small, so handing parts of them to a second thread costs more than it saves, and that thread waits
    for a core that another worker, ONNX Runtime or the event loop holds."""
    threadpool_limits(1, user_api="blas")
    cv2.setNumThreads(1)


def quiet_pillow() -> None:
    """Pillow's warnings are about a client's file (a corrupt EXIF block, say), which the answer speaks for: they
    are not printed to the server's log, with the library's paths."""
    warnings.filterwarnings("ignore", module=r"PIL\.")


def freeze_what_it_holds() -> None:
    """What the worker holds once started (the app, the models' sessions, the libraries: some 97,000 objects
    with mnist alone) leaves the garbage collector's generations while it serves: the collections that requests'
    objects set off then walk only what came after, not all of it (a full collection of it all: 57-82 ms at 64
    clients on two cores, every request of the worker waiting)."""
    gc.collect()
    gc.freeze()


@asynccontextmanager
async def lifespan(app: FastAPI):
    one_thread_for_pictures()
    quiet_pillow()
    # python -m app brings the engines it has loaded and warmed up; any other start (or a second one,
    # as a test client's) loads its own
    engines, app.state.preloaded = app.state.preloaded or Engines(app.state.settings, app.state.metrics), None
    engines.start()  # warms up in the background unless already warm; GET /ready says when done
    if (home := app.state.home) is not None:  # the threads a request crosses: this event loop's, the batchers'
        home.keep([threading.get_native_id(), *engines.thread_ids()])
    app.state.engines = engines
    freeze_what_it_holds()
    try:
        yield
    finally:
        engines.close()
        gc.unfreeze()  # the whole process's: what the app held may go (an app started again, as in the tests)


def openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, with an infer operation per served graph once the lifespan has loaded the models
    (each graph's input says what its infer takes: inference_protocol.document_infer); kept from then on."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = FastAPI.openapi(app)  # keeps it in app.openapi_schema
    engines = getattr(app.state, "engines", None)
    if engines is None:  # before the lifespan: no models yet, so a document not to keep
        app.openapi_schema = None
    else:
        inference_protocol.document_infer(schema, engines, app.state.settings.max_body_bytes)
    return schema


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app on settings. Its lifespan starts app.state.preloaded when set (`python -m app` loads and
    warms every model up before serving), else it loads them and warms them up in the background."""
    settings = settings or get_settings()
    app = FastAPIOffline(
        docs_url=DOCS, title="CapsNet service", version=VERSION, description=DESCRIPTION, lifespan=lifespan
    )
    app.state.settings, app.state.preloaded, app.state.home = settings, None, None
    http_metrics, app.state.metrics = setup_metrics(app)
    register_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    # outside the body limit: its 413s count
    app.add_middleware(HttpMetricsMiddleware, metrics=http_metrics, engine_metrics=app.state.metrics)
    app.add_middleware(RequestIdMiddleware)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["*"],
            expose_headers=[REQUEST_ID],
        )
    if (board := this_worker()) is not None:  # served by python -m app: a lone request may take every core
        app.state.home = Home(board.slot)
        app.add_middleware(BoardMiddleware, board=board, home=app.state.home)  # outermost: every request counts
    pages = len(app.routes)  # FastAPI's document and its pages, /metrics
    for module in (predict, reconstruct, explain, models, health, inference_protocol):
        app.include_router(module.router)
    # the API's routes first: a request is matched against the routes in turn (those pages: 29 us, caches cold)
    app.router.routes[:] = [*app.routes[pages:], *app.routes[:pages]]

    @app.get("/", include_in_schema=False)
    async def root(request: Request) -> RedirectResponse:
        """A person who opens the service's address lands on its documentation."""
        return RedirectResponse(request.scope.get("root_path", "") + DOCS)

    for route in app.routes:  # the undocumented pages (/, /docs, /redoc) answer HEAD as app/router.py's routes do
        if isinstance(route, APIRoute) and not route.include_in_schema and route.methods == {"GET"}:
            route.methods.add("HEAD")
    app.openapi = lambda: openapi(app)  # type: ignore[method-assign]  # FastAPI's way to extend the document
    return app
