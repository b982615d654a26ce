"""Fixtures for the demo: a client of the real API (tests/conftest.py's api_url), the demo itself."""
import pytest

from frontend.app import ApiClient, DemoSettings, launch
from tests.conftest import free_port


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

