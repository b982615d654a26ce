"""The API on Ray Serve (app/ray_serve.py, deploy/ray/serve.yaml): a local Ray with two replicas answers
/models, /predict, /explain and /v2 infer as the single process does, and both replicas answer."""

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

pytest.importorskip("ray.serve", reason="needs Ray Serve, the ray extra: pip install -e '.[ray]'")

from app.main import create_app
from app.ray_serve import REPLICA
from app.settings import Settings
from tests.harness import encode
from tests.ray_harness import ray_serve

ENV = {"CAPSNET_MODELS": "mnist", "CAPSNET_PROVIDERS": "CPUExecutionProvider"}


def test_two_replicas_answer_as_the_single_process_does(mnist_fixture):
    images, _ = mnist_fixture
    png = encode(images[0])
    tensor = {
        "name": "image",
        "shape": [1, 1, 28, 28],
        "datatype": "FP32",
        "data": (images[1] / 255.0).ravel().tolist(),
    }
    calls = {
        "/models": {},
        "/predict": {"files": {"file": ("digit.png", png, "image/png")}},
        "/explain?steps=4": {"files": {"file": ("digit.png", png, "image/png")}},
        "/v2/models/mnist/infer": {"json": {"inputs": [tensor]}},
    }

    def answers(http) -> dict:
        out = {}
        for path, body in calls.items():
            r = http.post(path, **body) if body else http.get(path)
            assert r.status_code == 200, (path, r.text)
            out[path] = r.json()
        return out

    settings = Settings(models=["mnist"], providers=["CPUExecutionProvider"], intra_op_threads=1)
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 120
        while client.get("/ready").status_code != 200:  # warm-up on its own thread
            assert time.monotonic() < deadline, "the in-process app did not warm up in 120 s"
            time.sleep(0.1)
        reference = answers(client)

    with ray_serve(2, ENV) as url, httpx.Client(base_url=url, timeout=60) as http:
        served = answers(http)
        r = http.get("/ready", headers={"X-Request-ID": "ray-serve-test"})
        assert r.headers.get_list("X-Request-ID") == ["ray-serve-test"]  # once: Serve's proxy writes it

        def replica(_) -> str:
            r = http.post("/predict?include=", files=calls["/predict"]["files"])
            assert r.json()["prediction"] == reference["/predict"]["prediction"]
            return r.headers[REPLICA]

        with ThreadPoolExecutor(8) as pool:
            replicas = set(pool.map(replica, range(32)))

    # the same int8 graph on the same provider with one ONNX Runtime thread (the replica's num_cpus: 1), one
    # image a run: the same arithmetic, so the same numbers, not numbers within a tolerance (byte for byte here)
    for path in calls:
        assert served[path] == reference[path], path
    assert len(replicas) == 2, replicas
