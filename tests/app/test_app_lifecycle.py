"""Start-up: settings fail loudly, /ready is 503 until warm-up, app/ never loads torch."""
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.deps import get_engine
from app.engine import Engine
from app.main import create_app
from app.settings import Settings
from model import contract


def test_ready_is_503_before_warm_up(settings):
    engine = Engine(settings)  # sessions loaded, not warmed up
    app = create_app(settings)
    app.dependency_overrides[get_engine] = lambda: engine
    client = TestClient(app)  # no lifespan: the override is the engine
    r = client.get("/ready")
    assert r.status_code == 503 and "not ready" in r.json()["detail"]
    assert client.get("/health").status_code == 200
    engine.warm_up()
    assert client.get("/ready").json() == {"status": "ready", "providers": ["CPUExecutionProvider"]}


def test_providers_in_use_come_from_the_session(settings):
    engine = Engine(settings.model_copy(update={"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]}))
    assert engine.providers == engine.capsnet.get_providers()
    assert engine.providers[-1] == "CPUExecutionProvider"


def test_env_settings(monkeypatch):
    monkeypatch.setenv("CAPSNET_PROVIDERS", "CPUExecutionProvider")
    monkeypatch.setenv("CAPSNET_CORS_ORIGINS", '["http://localhost:7860"]')
    monkeypatch.setenv("CAPSNET_MAX_BATCH", "8")
    s = Settings()
    assert s.providers == ["CPUExecutionProvider"] and s.cors_origins == ["http://localhost:7860"]
    assert s.max_batch == 8 and s.model_dir == contract.MODEL_DIR


@pytest.mark.parametrize("bad", [
    {"providers": ["CUDAExecutionProvidr"]}, {"providers": []}, {"max_batch": 0}, {"max_wait_ms": -1},
    {"log_level": "loud"}, {"model_dir": "/nonexistent"}, {"port": 0},
])
def test_bad_settings_fail_loudly(bad):
    with pytest.raises(ValidationError):
        Settings(**bad)


def test_cors_only_for_configured_origins(settings):
    allowed = "http://localhost:7860"
    client = TestClient(create_app(settings.model_copy(update={"cors_origins": [allowed]})))
    preflight = {"Access-Control-Request-Method": "POST"}
    assert client.options("/predict", headers={"Origin": allowed, **preflight}).headers[
        "access-control-allow-origin"] == allowed
    assert "access-control-allow-origin" not in TestClient(create_app(settings)).get(
        "/health", headers={"Origin": allowed}).headers


def test_app_never_imports_torch():
    code = "import sys, app.main, app.__main__; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=contract.MODEL_DIR.parent)
