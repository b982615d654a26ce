"""$ python -m app: serve with uvicorn on the CAPSNET_ settings (host, port, log_level, ...).

Every configured model (CAPSNET_MODELS) is loaded and warmed up before the server opens its port: a
model that cannot load or run ends the process with exit status 1 and one line naming it and saying
why, for an orchestrator to see."""

import logging
import sys

import uvicorn
from pydantic import ValidationError

from app.engine import Engines
from app.main import create_app
from app.settings import get_settings


def main() -> None:
    try:
        settings = get_settings()
    except ValidationError as exc:
        sys.exit(f"bad CAPSNET_* settings:\n{exc}")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    try:
        app.state.preloaded = Engines(settings, app.state.metrics)
        app.state.preloaded.warm_up()
    except Exception as exc:  # a model that cannot load or run: name it, say why in one line, exit non-zero
        sys.exit(f"cannot serve {' '.join(str(exc).split())}")
    # one process, one engine per model: concurrency comes from the event loop and the batchers, not workers
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # uvicorn says int but hands it to asyncio.wait_for, which takes seconds as a float
        timeout_graceful_shutdown=settings.shutdown_timeout_s,  # type: ignore[arg-type]  # float works
        timeout_keep_alive=settings.keep_alive_s,
    )


if __name__ == "__main__":
    main()
