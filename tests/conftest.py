"""Shared fixtures: the committed MNIST slice and the real API served on
loopback (app.main.create_app with every shipped model on CPU, uvicorn in a thread on a free port,
waited on until /ready). The session has one app and loads its models once: tests/app's in-process
client talks to the same app object as the server. No network beyond 127.0.0.1, no ../shared."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn

from tests.harness import FIXTURES, free_port


@pytest.fixture(scope="session")
def mnist_fixture() -> tuple[np.ndarray, np.ndarray]:
    """The first 1,000 MNIST test images (uint8 (1000, 28, 28)) and labels (int64 (1000,))."""
    with np.load(FIXTURES / "mnist_test_1000.npz") as f:
        return f["images"], f["labels"].astype(np.int64)


def without_iteration_outputs(folder: Path, out: Path) -> Path:
    """A copy of a model folder (its two graphs and its card) in out, as exported before the CapsNet graph had
    contract.CAPSNET_ITERATION_OUTPUTS: the graph's outputs without them (ONNX Runtime drops the nodes
    that only they need)."""
    import onnx

    from model import contract

    out.mkdir(parents=True, exist_ok=True)
    for name in (contract.DECODER_ONNX, contract.MODEL_CARD):
        (out / name).write_bytes((folder / name).read_bytes())
    graph = onnx.load(str(folder / contract.CAPSNET_ONNX))
    kept = [o for o in graph.graph.output if o.name not in contract.CAPSNET_ITERATION_OUTPUTS]
    del graph.graph.output[:]
    graph.graph.output.extend(kept)
    onnx.save(graph, str(out / contract.CAPSNET_ONNX))
    return out


START_TIMEOUT_S = 60.0


@contextmanager
def serving(app, name: str = "capsnet-api", **options) -> Iterator[str]:
    """app under a real uvicorn on a free loopback port, in a thread (uvicorn.Config's `options` added): its
    URL once /ready answers; the server stops when the block ends."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options))
    thread = threading.Thread(target=server.run, name=name, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, thread)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def wait_until_ready(url: str, thread: threading.Thread) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise RuntimeError(f"the API at {url} stopped during start-up (see the log above)")
        try:
            if httpx.get(f"{url}/ready", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"the API at {url} was not ready within {START_TIMEOUT_S:.0f} s")


@pytest.fixture(scope="session")
def api_settings():
    """Every shipped model on the CPU, one ONNX Runtime thread per session (two cores, several suites)."""
    from app.settings import Settings

    return Settings(providers=["CPUExecutionProvider"], intra_op_threads=1)


@pytest.fixture(scope="session")
def api_app(api_settings):
    """The session's one app; its lifespan (loading and warming up every model) runs once, in api_url's
    server."""
    from app.main import create_app

    return create_app(api_settings)


@pytest.fixture(scope="session")
def api_url(api_app, api_settings):
    """api_app served as `python -m app` serves it: its read deadline and bound on connections."""
    from app.http_protocol import uvicorn_options

    with serving(api_app, **uvicorn_options(api_settings)) as url:
        yield url
