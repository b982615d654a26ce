"""A local Ray Serve of deploy/ray/serve.yaml, as `serve run` starts it: what the Ray Serve test
(tests/deploy/test_ray_serve.py) and benchmark (benchmarks/ray_serve_bench.py) serve the API with. Needs the
`ray` extra."""

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager

import ray
import yaml
from ray import serve
from ray.serve._private.api import serve_start  # what `serve run CONFIG` starts Serve with
from ray.serve.schema import ApplicationStatus, ServeDeploySchema

from tests.harness import REPO, free_port, ready

CONFIG = REPO / "deploy" / "ray" / "serve.yaml"
DEPLOY_TIMEOUT_S = 120.0


def serve_config(replicas: int, port: int, env: dict[str, str]) -> ServeDeploySchema:
    """deploy/ray/serve.yaml as `serve deploy` reads it, on 127.0.0.1:port, with `replicas` replicas and env
    added to its CAPSNET_* variables."""
    config = yaml.safe_load(CONFIG.read_text())
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    (application,) = config["applications"]
    application["runtime_env"]["env_vars"].update(env)
    (deployment,) = application["deployments"]
    deployment["num_replicas"] = replicas
    return ServeDeploySchema.model_validate(config)


@contextmanager
def ray_serve(replicas: int, env: dict[str, str]) -> Iterator[str]:
    """A local Ray with the CPUs the replicas ask for (no dashboard) serving serve_config(replicas, ...): its
    URL once the application runs and answers /ready; Serve and Ray stop when the block ends. A replica that
    cannot start is a RuntimeError with Serve's reason."""
    port = free_port()
    config = serve_config(replicas, port, env)
    (application,) = config.applications
    (deployment,) = application.deployments
    cpus = deployment.ray_actor_options.num_cpus
    assert cpus is not None, "deploy/ray/serve.yaml gives each replica its CPUs"
    ray.init(
        num_cpus=math.ceil(replicas * cpus),
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        serve_start(http_options=config.http_options.model_dump(), proxy_location=config.proxy_location).deploy_apps(
            config
        )
        url = f"http://127.0.0.1:{port}"
        wait_running(application.name, url)
        yield url
    finally:
        serve.shutdown()
        ray.shutdown()


def wait_running(name: str, url: str) -> None:
    """Until Serve's application `name` runs and url/ready answers; Serve's reason if it fails to deploy."""
    deadline = time.monotonic() + DEPLOY_TIMEOUT_S
    while time.monotonic() < deadline:
        status = serve.status().applications.get(name)
        if status is not None and status.status == ApplicationStatus.DEPLOY_FAILED:
            raise RuntimeError(f"Ray Serve could not deploy {name}: {status.message}")
        if status is not None and status.status == ApplicationStatus.RUNNING and ready(f"{url}/ready"):
            return
        time.sleep(0.5)
    raise RuntimeError(f"Ray Serve's {name} was not ready within {DEPLOY_TIMEOUT_S:.0f} s")
