"""App fixtures: one app on the shipped model (CPU), started once per session, and image helpers."""
import json
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from model import contract


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings(providers=["CPUExecutionProvider"], intra_op_threads=1)  # every shipped model


@pytest.fixture(scope="session")
def model_card(settings) -> dict:
    return json.loads((contract.SHIPPED["mnist"] / contract.MODEL_CARD).read_text())


@pytest.fixture(scope="session")
def app(settings):
    return create_app(settings)


@pytest.fixture(scope="session")
def client(app):
    """A client on the app whose lifespan has run and whose warm-up is done."""
    with TestClient(app, raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 120
        while client.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, "the engine never became ready"
            time.sleep(0.05)
        yield client


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
