"""The API on Ray Serve: the same FastAPI app as the ingress deployment, each replica with its own engines.

$ pip install -e '.[serve,ray]'
$ serve run deploy/ray/serve.yaml                                 # a local Ray, http://127.0.0.1:8000
$ serve deploy deploy/ray/serve.yaml --address http://HEAD:8265   # a running cluster (docs/deployment.md)

Each replica (a Ray actor) builds `create_app()` from the CAPSNET_* variables of its environment (the
config's runtime_env env_vars), loads and warms up every model before Serve sends it a request, as
`python -m app` does, and Serve then runs the app's lifespan, which starts those engines and closes them
when the replica stops. Nothing else changes: /predict, /explain, /models, /ready, /metrics and /v2 answer
as the single process does; /metrics counts one replica's requests. Every response names the replica
that answered (X-Serve-Replica). Not imported by `python -m app`; the `ray` extra installs Ray.
"""

import math

import ray
from fastapi import FastAPI
from ray import serve
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.engine import Engines
from app.http_protocol import REQUEST_ID
from app.main import create_app
from app.settings import Settings, get_settings

REPLICA = "X-Serve-Replica"


class ServeHeaders:
    """Names the replica in every HTTP response's X-Serve-Replica (Serve's replica id, as `serve status` and
    the replica's log name it) and leaves X-Request-ID to Serve's proxy, which sends the app the client's id
    (or a new one) and writes it on the response itself: without this the response would carry it twice."""

    def __init__(self, app: ASGIApp, replica: str):
        self.app, self.replica = app, replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                del headers[REQUEST_ID]
                headers.append(REPLICA, self.replica)
            await send(message)

        await self.app(scope, receive, send_named)


def replica_settings() -> Settings:
    """The CAPSNET_* settings of this replica's environment. Without CAPSNET_INTRA_OP_THREADS, ONNX Runtime
    gets one thread per CPU that Ray gave the replica (ray_actor_options num_cpus, at least one) instead of
    its default, a thread per core of the node, which replicas sharing a node would each take."""
    settings = get_settings()
    if "intra_op_threads" in settings.model_fields_set:
        return settings
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
    return settings.model_copy(update={"intra_op_threads": max(1, math.ceil(cpus))})


def build_app() -> FastAPI:
    """The replica's app, its models loaded and warmed up (a model that cannot serve fails the replica,
    and `serve status` says why)."""
    settings = replica_settings()
    app = create_app(settings)
    app.state.preloaded = Engines(settings, app.state.metrics)
    app.state.preloaded.warm_up()
    app.add_middleware(ServeHeaders, replica=serve.get_replica_context().replica_id.unique_id)
    return app


@serve.ingress(build_app)
class CapsNetAPI:
    """The ingress deployment; its replicas, CPUs and GPUs come from the config (deploy/ray/serve.yaml)."""


app = serve.deployment()(CapsNetAPI).bind()  # serve.deployment as a call: mypy keeps a class decorator's class
