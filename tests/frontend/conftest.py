"""Fixtures for the demo: a client of the real API (tests/conftest.py's api_url), the demo itself in
this process, and the API and demo as a person starts them (`make demo`)."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import gradio as gr
import httpx
import pytest

from frontend.app import launch
from frontend.client import ApiClient
from frontend.settings import DemoSettings
from tests.harness import REPO, free_port

MAKE_DEMO_TIMEOUT_S = 180.0  # every shipped model loaded and warmed, on a busy 2-core CI machine


@pytest.fixture
def unused_url() -> str:
    """A loopback address where nothing listens: the API is down."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def client(api_url) -> ApiClient:
    return ApiClient(api_url, timeout_s=30.0)


def start_demo(api_url: str, **settings_: Any) -> tuple[gr.Blocks, str]:
    """The demo launched as `python -m frontend` launches it, asking the API at api_url (other settings:
    `settings_`), and its address; serving on Gradio's thread while the caller goes on."""
    settings = DemoSettings(api_url=api_url, host="127.0.0.1", port=free_port(), timeout_s=30.0, **settings_)
    return launch(settings, block=False, quiet=True), f"http://{settings.host}:{settings.port}"


@pytest.fixture(scope="session")
def demo_url(api_url):
    """The demo, launched as `python -m frontend` would, asking the in-process API."""
    demo, url = start_demo(api_url)
    yield url
    demo.close()


def up(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="session")
def made_demo_url(tmp_path_factory) -> Iterator[str]:
    """The demo's address once `make demo` (the README's command: the API and the demo as two processes,
    every shipped model) says both are up, on free ports and with this run's venv; at the end, Ctrl-C
    (SIGINT to its process group) must stop both."""
    api_port, demo_port = free_port(), free_port()
    log = tmp_path_factory.mktemp("make-demo") / "make-demo.log"
    with log.open("wb") as out:
        make = subprocess.Popen(
            ["make", "-s", "demo", f"VENV={sys.prefix}", f"API_PORT={api_port}", f"DEMO_PORT={demo_port}"],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    api, demo = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{demo_port}"
    deadline = time.monotonic() + MAKE_DEMO_TIMEOUT_S
    while not (up(f"{api}/ready") and up(demo)):
        if make.poll() is not None or time.monotonic() > deadline:
            os.killpg(make.pid, signal.SIGKILL)
            pytest.fail(f"`make demo` did not bring up {api} and {demo}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    yield demo
    os.killpg(make.pid, signal.SIGINT)
    try:
        make.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(make.pid, signal.SIGKILL)
        pytest.fail(f"Ctrl-C did not stop `make demo` in 30 s:\n{log.read_text()[-3000:]}")
    assert not up(f"{api}/ready") and not up(demo), "Ctrl-C stopped make, not the API and the demo"
