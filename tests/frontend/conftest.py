"""Fixtures for the demo: the real API served in-process on loopback, a client of it, the demo itself.

The API is app.main.create_app with the shipped model on CPU, run by uvicorn in a thread on a free
port; the fixture waits for /ready. No network beyond 127.0.0.1.
"""
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from frontend.app import ApiClient, DemoSettings, launch

START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
def api_url():
    from app.main import create_app
    from app.settings import Settings

    port = free_port()
    settings = Settings(providers=["CPUExecutionProvider"], host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="capsnet-api", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_until_ready(url, thread)
    yield url
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def unused_url() -> str:
    """A loopback address where nothing listens: the API is down."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def client(api_url) -> ApiClient:
    return ApiClient(api_url, timeout_s=30.0)


@pytest.fixture(scope="session")
def demo_url(api_url):
    """The demo, launched as `python -m frontend` would, asking the in-process API."""
    settings = DemoSettings(api_url=api_url, host="127.0.0.1", port=free_port(), timeout_s=30.0)
    demo = launch(settings, prevent_thread_lock=True, quiet=True)
    yield f"http://{settings.host}:{settings.port}"
    demo.close()

