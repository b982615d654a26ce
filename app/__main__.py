"""$ python -m app: serve with uvicorn on the CAPSNET_ settings (host, port, log_level, ...)."""
import logging
import sys

import uvicorn
from pydantic import ValidationError

from app.main import create_app
from app.settings import get_settings


def main() -> None:
    try:
        settings = get_settings()
    except ValidationError as exc:
        sys.exit(f"bad CAPSNET_* settings:\n{exc}")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # one process, one engine: concurrency comes from the event loop and the batcher, not workers
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
                timeout_graceful_shutdown=settings.shutdown_timeout_s)


if __name__ == "__main__":
    main()
