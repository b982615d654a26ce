"""$ python -m app: serve with uvicorn on the CAPSNET_ settings (host, port, workers, log_level, ...).

Every configured model (CAPSNET_MODELS) is loaded and warmed up before the server opens its port: a
model that cannot load or run ends the process with exit status 1 and one line naming it and saying
why, for an orchestrator to see. One worker (CAPSNET_WORKERS=1) serves from this process; several are
uvicorn's worker processes under this one (app/workers.py). Either way the workers count their requests on
a board (app/cores.py), so that a request alone on the server runs as fast as the cores allow."""

import contextlib
import logging
import sys
import tempfile
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from app import cores
from app.engine import Engines, ModelLoadError
from app.http_protocol import uvicorn_options
from app.main import create_app
from app.settings import Settings, get_settings
from app.workers import configure_logging, serve_workers


def serve_one(settings: Settings) -> None:
    """Load and warm up every model, then serve from this process until SIGTERM or SIGINT.

    Raises:
        ModelLoadError naming a model that cannot load or run.
    """
    with contextlib.ExitStack() as stack:
        try:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="capsnet-"))
            stack.enter_context(cores.shared_board(Path(folder), 1))
        except OSError as exc:  # no writable temporary folder: the worker serves, its lone requests as any other
            logging.getLogger(__name__).warning("no board for this worker's requests (%s)", exc)
        # the app and the engines map the board as they are made; its file goes before the worker serves, as no
        # other process reads it: nothing is left behind however the process ends (uvicorn ends it by the signal
        # that stopped it)
        app = create_app(settings)
        engines = Engines(settings, app.state.metrics)
    app.state.preloaded = engines
    engines.warm_up()
    # one process, one engine per model: concurrency comes from the event loop and the batchers
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # uvicorn says int but hands it to asyncio.wait_for, which takes seconds as a float
        timeout_graceful_shutdown=settings.shutdown_timeout_s,  # type: ignore[arg-type]  # float works
        timeout_keep_alive=settings.keep_alive_s,
        **uvicorn_options(settings),  # slow clients and the connections a worker holds
    )


def main() -> None:
    try:
        settings = get_settings()
    except ValidationError as exc:
        sys.exit(f"bad CAPSNET_* settings:\n{exc}")
    configure_logging(settings)
    logging.getLogger(__name__).info("serving with %d worker process(es)", settings.workers)
    try:
        if settings.workers == 1:
            serve_one(settings)
        else:
            serve_workers(settings)
    except ModelLoadError as exc:  # a model that cannot load or run: name it, say why in one line, exit non-zero
        sys.exit(f"cannot serve {' '.join(str(exc).split())}")


if __name__ == "__main__":
    main()
