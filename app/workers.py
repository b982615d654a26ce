"""Several server processes (CAPSNET_WORKERS > 1): uvicorn's supervisor and its workers.

The parent checks every model once (loads both graphs on the CPU and runs them on one image), so that
a model that cannot serve stops start-up with one line before any worker starts; then it binds the
port and runs uvicorn's supervisor, which spawns the workers, replaces one that dies and stops when
one fails to start. Each worker builds the app through `create_worker_app`, an app factory that
loads and warms up every model before uvicorn lets the worker accept connections: a worker only
takes requests once warm, so its /ready is true from its first answer. Prometheus runs in multiprocess
mode, its files in a temporary folder that the parent makes and removes (app/metrics.py); the workers'
board (app/cores.py), where each counts its requests in flight, is a file in the same folder.

SIGTERM (or SIGINT) to the parent: it shuts the listening socket for every worker at once (a new
connection is refused, never handed to a worker about to stop) and sends SIGTERM to each worker, which
answers its requests in flight (up to CAPSNET_SHUTDOWN_TIMEOUT_S), closes its idle connections and exits;
then the parent exits 0. A parent killed outright takes its workers with it (they get SIGTERM).
"""

import contextlib
import ctypes
import ctypes.util
import logging
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from prometheus_client import multiprocess
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess

from app import cores
from app.engine import Engines, ModelLoadError
from app.http_protocol import AnsweredParseErrors, uvicorn_options
from app.main import create_app
from app.settings import Settings, get_settings

log = logging.getLogger(__name__)
METRICS_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's variable, read in each worker
ANSWERED_PARSE_ERRORS = AnsweredParseErrors()  # one per process: addFilter adds the same filter once
PR_SET_PDEATHSIG = 1  # Linux's prctl option: a signal for this process when its parent dies


def configure_logging(settings: Settings) -> None:
    """The app's log lines, at the settings' level, in whichever process this is; uvicorn's, but for what the
    app's protocol logs itself (AnsweredParseErrors)."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("uvicorn.error").addFilter(ANSWERED_PARSE_ERRORS)


def check_models(settings: Settings) -> None:
    """Load every model on the CPU and run both of its graphs on one input.

    Raises:
        ModelLoadError naming the model, as a worker would meet it.
    """
    one_row = {"max_batch": 1, "max_reconstruct_batch": 1}
    engines = Engines(
        settings.model_copy(update={"providers": ["CPUExecutionProvider"], "intra_op_threads": 1, **one_row})
    )
    try:
        engines.warm_up()
    finally:
        engines.close()


def check_models_apart(settings: Settings) -> None:
    """check_models in a process of its own (its log quiet below warnings), so that the supervisor never
    holds a model; its error is raised here."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            pool.submit(check_models, settings).result()
        except BrokenProcessPool as exc:
            raise ModelLoadError(f"the models: the process that checked them died ({exc})") from exc


def stop_with_the_parent() -> None:
    """Have Linux send this worker SIGTERM when the supervisor dies, so that a supervisor killed outright
    (SIGKILL, the OOM killer) leaves no worker behind holding the port; nothing elsewhere."""
    if sys.platform == "linux":
        ctypes.CDLL(ctypes.util.find_library("c")).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def create_worker_app() -> FastAPI:
    """In a worker: the app on the CAPSNET_* settings with every model loaded and warmed up (uvicorn's app
    factory, `app.workers:create_worker_app`). A model that cannot load or run ends the worker with
    uvicorn's start-up failure status, after one line naming it; the supervisor then stops the server."""
    stop_with_the_parent()
    settings = get_settings()
    configure_logging(settings)
    app = create_app(settings)
    try:
        app.state.preloaded = Engines(settings, app.state.metrics)
        app.state.preloaded.warm_up()
    except ModelLoadError as exc:
        log.error("worker %d cannot serve %s", os.getpid(), " ".join(str(exc).split()))
        sys.exit(STARTUP_FAILURE)
    return app


class Supervisor(Multiprocess):
    """uvicorn's supervisor, which also forgets the live gauges of a worker that is gone (prometheus_client's
    mark_process_dead), shuts the listening socket before it stops the workers, and tells whether a worker
    failed to start."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket], metrics_dir: str):
        super().__init__(config, sockets)
        self.metrics_dir = metrics_dir
        self._pids: set[int | None] = set()

    def keep_subprocess_alive(self) -> None:
        super().keep_subprocess_alive()
        pids = {process.pid for process in self.processes}
        for pid in self._pids - pids:
            if pid is not None:
                multiprocess.mark_process_dead(pid, self.metrics_dir)
        self._pids = pids

    def terminate_all(self) -> None:
        for sock in self.sockets:  # one socket in every process: shut here, it stops listening in all of them
            with contextlib.suppress(OSError):  # not listening: no worker got that far
                sock.shutdown(socket.SHUT_RD)
            sock.close()
        super().terminate_all()

    @property
    def failed_to_start(self) -> list[int | None]:
        """The workers that ended with uvicorn's start-up failure status."""
        return [process.pid for process in self.processes if process.exitcode == STARTUP_FAILURE]


def serve_workers(settings: Settings) -> None:
    """Check the models, then serve with settings.workers processes until SIGTERM or SIGINT.

    Raises:
        ModelLoadError if a model cannot serve, found by the parent's check or by a worker.
    """
    check_models_apart(settings)
    with (
        tempfile.TemporaryDirectory(prefix="capsnet-workers-") as metrics_dir,
        cores.shared_board(Path(metrics_dir), settings.workers),
    ):
        os.environ[METRICS_DIR] = metrics_dir  # the workers inherit it
        config = uvicorn.Config(
            "app.workers:create_worker_app",
            factory=True,
            workers=settings.workers,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            timeout_graceful_shutdown=settings.shutdown_timeout_s,  # type: ignore[arg-type]  # float works
            timeout_keep_alive=settings.keep_alive_s,
            **uvicorn_options(settings),  # slow clients and the connections a worker holds
        )
        supervisor = Supervisor(config, [config.bind_socket()], metrics_dir)
        try:
            supervisor.run()
        finally:  # the folder goes: nothing started after this may look for it
            os.environ.pop(METRICS_DIR)
    if supervisor.failed_to_start:
        pid = supervisor.failed_to_start[0]
        raise ModelLoadError(f"the models: worker {pid} could not load them (its line above says why)")
