"""The API, over HTTP: a thin httpx client of the CapsNet service (its routes: docs/ARCHITECTURE.md, app/schemas.py).

Every failure becomes an ApiError whose message a person can act on; ApiUnreachable says the API may
answer later (down, slow, or still loading its models).
"""

import logging
import time
from typing import Any

import httpx
import numpy as np
import orjson

log = logging.getLogger("frontend")


class ApiError(Exception):
    """The API's answer a person can act on; `status` its HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


class ApiUnreachable(ApiError):
    """No answer, or not yet: the API is down, too slow, or starting up (503)."""


def detail(response: httpx.Response) -> str:
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text or response.reason_phrase


def which(model: str | None) -> dict[str, str]:
    """The ?model= of a request: none asks for the API's default model."""
    return {"model": model} if model else {}


class ApiClient:
    """The routes the demo uses, each one method; `model` None is the API's default model."""

    def __init__(
        self, base_url: str, timeout_s: float, transport: httpx.BaseTransport | None = None, public_url: str = ""
    ):
        """`public_url`: the API's address as a person's browser reaches it, shown in the demo (default: base_url)."""
        self.base_url = base_url.rstrip("/")
        self.public_url = (public_url or base_url).rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport)

    def call(self, method: str, path: str, **kwargs) -> dict[str, Any]:
        """The API's JSON answer (orjson: a Fig. 4 grid's 176 drawings parse in 11 ms, 48 with json)."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ApiUnreachable(f"⏳ The API at {self.base_url} did not answer in time; try again.") from None
        except httpx.HTTPError:
            raise ApiUnreachable(
                f"🔌 The API at {self.base_url} is not reachable. Start it with `python -m app` "
                "(or set CAPSNET_DEMO_API_URL) and try again."
            ) from None
        if response.status_code == 503:
            raise ApiUnreachable("⏳ The API is starting up (loading and warming the model); try again in a moment.")
        if response.is_client_error:
            raise ApiError(f"⚠️ {detail(response)}", response.status_code)
        if response.is_error:
            raise ApiError(f"⚠️ The API failed ({response.status_code}): {detail(response)}", response.status_code)
        return orjson.loads(response.content)

    def predict(self, png: bytes, model: str | None = None, iterations: bool = False) -> dict[str, Any]:
        """POST /predict with the parts the demo shows: the input the model saw, the capsules, the reconstruction
        and the routing maps (each routing iteration's too, if asked); not the routing coefficients, which the maps
        sum up."""
        include = "input,capsules,reconstruction,routing" + (",iterations" if iterations else "")
        return self.call(
            "POST",
            "/predict",
            params={**which(model), "include": include, "preprocess": "auto"},
            files={"file": ("image.png", png, "image/png")},
        )

    def reconstruct(self, digits: list[int], capsules: np.ndarray, model: str | None = None) -> np.ndarray:
        """Decode capsules (n, 16), each placed at its class's slot, in one batch: (n, S, S) at the model's size."""
        items = [{"digit": int(d), "capsule": c.tolist()} for d, c in zip(digits, capsules, strict=True)]
        answer = self.call("POST", "/reconstruct", params={**which(model), "include": "image"}, json={"items": items})
        return np.array([r["image"] for r in answer["items"]], dtype=np.float32)

    def explain(
        self, png: bytes, model: str | None, transform: str, start: float, stop: float, steps: int, follow: int
    ) -> dict[str, Any]:
        """POST /explain: the model's input (png, already its size) under `steps` values of `transform`, one batch."""
        params = {"transform": transform, "start": start, "stop": stop, "steps": steps, "follow": follow}
        return self.call(
            "POST",
            "/explain",
            params={**which(model), **params, "preprocess": "none", "include": "inputs,reconstructions"},
            files={"file": ("input.png", png, "image/png")},
        )

    def model(self, model: str | None = None) -> dict[str, Any]:
        return self.call("GET", "/model", params=which(model))

    def models(self) -> dict[str, Any]:
        """GET /models: the default model's name and each served model's entry (app/schemas.py: Models)."""
        return self.call("GET", "/models")


def served_models(client: ApiClient, wait_s: float, every_s: float = 1.0) -> dict[str, Any]:
    """GET /models, asked again while the API is unreachable, for at most `wait_s` seconds (the API
    listens once it has loaded its models); ApiUnreachable with the last reason after that."""
    deadline, waiting = time.monotonic() + wait_s, False
    while True:
        try:
            return client.models()
        except ApiUnreachable as error:
            if time.monotonic() + every_s > deadline:
                raise ApiUnreachable(f"No list of models (GET /models) in {wait_s:.0f} s: {error}") from None
            if not waiting:
                log.info("waiting up to %.0f s for the API at %s to list its models", wait_s, client.base_url)
            waiting = True
            time.sleep(every_s)
