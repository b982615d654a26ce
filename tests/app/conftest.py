"""App fixtures: the session's one app (tests/conftest.py: every shipped model on the CPU, its lifespan run
once by the test server), an in-process client of it, and image helpers."""

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.settings import Settings
from model import contract


@pytest.fixture(scope="session")
def settings(api_settings) -> Settings:
    return api_settings


@pytest.fixture(scope="session")
def model_card(settings) -> dict:
    return json.loads((contract.SHIPPED["mnist"] / contract.MODEL_CARD).read_text())


@pytest.fixture(scope="session")
def app(api_app):
    return api_app


@pytest.fixture(scope="session")
def client(app, api_url):
    """An in-process client of the app that api_url serves, once it is ready. Not entered (`with`): that would
    run the app's lifespan a second time and load every model again; the server's lifespan has loaded them,
    and any event loop can submit to their batchers (app/batcher.py)."""
    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/ready").status_code == 200  # api_url waited for it
    return client


@pytest.fixture(scope="session")
def engines(client, app):
    return app.state.engines


@pytest.fixture(scope="session")
def engine(engines):
    """The default model's engine (mnist)."""
    return engines[engines.default]


@pytest.fixture(scope="session")
def digits(mnist_fixture) -> tuple[np.ndarray, np.ndarray]:
    """The first 20 MNIST test images (uint8 (20, 28, 28)) and labels."""
    images, labels = mnist_fixture
    return images[:20], labels[:20]
