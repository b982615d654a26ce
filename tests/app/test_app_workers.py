"""Several workers (CAPSNET_WORKERS=2, app/workers.py), run as a user runs them (`python -m app`, mnist only):
both answer and GET /metrics counts them together; a worker killed under load is replaced, and the only
requests without an answer are those on its own connections; SIGTERM answers what is in flight, then
the port refuses and every process exits 0. A worker that cannot load its models stops the server. On
the default threads a request alone on the server runs on every core, one worker's too, and under load few do."""

import http.client
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from app import cores, memory
from app.settings import available_cores
from model import contract
from tests.harness import (
    MULTIPART,
    connections,
    cpu_seconds,
    digit_png,
    free_port,
    hey_outcomes,
    multipart,
    start_api,
    wait_for_workers,
)

pytestmark = pytest.mark.skipif(shutil.which("hey") is None, reason="needs hey (apt-get install hey)")

ENV = {
    "CAPSNET_MODELS": "mnist",
    "CAPSNET_WORKERS": "2",
    "CAPSNET_PROVIDERS": "CPUExecutionProvider",
    "CAPSNET_INTRA_OP_THREADS": "1",
}
CLIENTS = 16
SWEEPS = 6  # slow requests (/explain: 64 images each) in flight when SIGTERM comes


class Sweep(threading.Thread):
    """One POST of the multipart body to url on a thread of its own: `sent` once the whole request has gone out (or
    failed to), `status` once it has its answer, or `error`."""

    def __init__(self, url: str, body):
        super().__init__()
        self.url, self.body, self.status, self.error = urllib.parse.urlsplit(url), body.read_bytes(), 0, ""
        self.sent = threading.Event()

    def run(self) -> None:
        connection = http.client.HTTPConnection(self.url.hostname, self.url.port, timeout=60)
        try:
            connection.request("POST", f"{self.url.path}?{self.url.query}", self.body, {"Content-Type": MULTIPART})
            self.sent.set()
            self.status = connection.getresponse().status
        except OSError as exc:  # a reset or refused connection
            self.error = repr(exc)
        finally:
            self.sent.set()
            connection.close()


def wait_for(condition, timeout: float = 60.0):
    """condition()'s first true value, polled until timeout seconds have passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    raise TimeoutError(f"{condition} did not hold within {timeout:.0f} s")


def predictions_counted(url: str) -> int:
    """The /predict answers of every worker, as GET /metrics (answered by one of them) counts them."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(int(float(n)) for n in re.findall(r'^http_requests_total\{handler="/predict".*\} (\S+)$', text, re.M))


def lone_runs(url: str) -> int:
    """The images every worker ran alone on every core (app/cores.py), from GET /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(int(float(n)) for n in re.findall(r'^capsnet_lone_runs_total\{model="mnist"\} (\S+)$', text, re.M))


@pytest.mark.skipif(available_cores() < 2, reason="one core: a worker's sessions have it all")
@pytest.mark.parametrize("workers", [1, 2])
def test_a_request_alone_on_the_server_runs_on_every_core_and_none_under_load(tmp_path, workers):
    port = free_port()
    url, body = f"http://127.0.0.1:{port}", tmp_path / "body"
    body.write_bytes(multipart(digit_png()))
    env = {key: value for key, value in ENV.items() if key != "CAPSNET_INTRA_OP_THREADS"}  # the default threads
    server = start_api(port, {**env, "CAPSNET_WORKERS": str(workers)}, timeout=120)
    try:
        if workers > 1:  # one worker is ready once /ready answers (start_api)
            wait_for_workers(url, workers, timeout=60)
        for _ in range(3):
            time.sleep(2 * cores.QUIET_S)  # with two, the other worker quiet (it may have answered the last one)
            request = urllib.request.Request(f"{url}/predict?include=", body.read_bytes(), {"Content-Type": MULTIPART})
            with urllib.request.urlopen(request, timeout=30) as response:
                assert response.status == 200
        # each worker records its runs once their answers have gone (EngineMetrics.flush): the third's may be a
        # moment behind its answer, whichever worker answers /metrics
        wait_for(lambda: lone_runs(url) >= 3, timeout=5)
        assert lone_runs(url) == 3
        statuses, errors = hey_outcomes(f"{url}/predict?include=", body, CLIENTS, 2, keep_alive=False)
        assert list(statuses) == [200] and not errors, (statuses, errors)
        assert lone_runs(url) - 3 < 0.05 * statuses[200], "requests under load ran on every core"
    finally:
        server.terminate()
        server.wait(30)


def test_two_workers_share_the_load_survive_a_kill_and_stop_gracefully(tmp_path):
    port = free_port()
    url, body = f"http://127.0.0.1:{port}", tmp_path / "body"
    body.write_bytes(multipart(digit_png()))
    predict = f"{url}/predict?include="
    server = start_api(port, ENV, timeout=120)
    try:
        first = wait_for_workers(url, 2, timeout=60)
        cpu = {pid: cpu_seconds(pid) for pid in first}
        statuses, errors = hey_outcomes(predict, body, CLIENTS, 2, keep_alive=False)  # connections spread
        assert list(statuses) == [200] and not errors, (statuses, errors)
        assert all(cpu_seconds(pid) - cpu[pid] > 0.1 for pid in first), "a worker took no part"
        assert predictions_counted(url) == statuses[200]  # /metrics adds up both workers

        held: dict[int, int] = {}

        def kill_the_busier() -> None:
            held.update({pid: connections(pid, port) for pid in first})  # each has one request in flight at most
            os.kill(max(held, key=held.__getitem__), signal.SIGKILL)

        threading.Timer(1.0, kill_the_busier).start()
        statuses, errors = hey_outcomes(predict, body, CLIENTS, 4)
        victim = max(held, key=held.__getitem__)
        assert list(statuses) == [200] and statuses[200] > 0, statuses
        assert sum(errors.values()) <= held[victim], (held, errors)  # only the killed worker's requests are lost
        assert not [e for e in errors if "refused" in e], errors  # the port stayed open
        replaced = wait_for_workers(url, 2, gone=victim, timeout=60)

        slow = [Sweep(f"{url}/explain?transform=rotate&steps=64&include=", body) for _ in range(SWEEPS)]

        def stop_with_sweeps_in_flight() -> None:
            for sweep in slow:
                sweep.start()
            for sweep in slow:
                sweep.sent.wait(30)
            time.sleep(0.2)  # the workers accept what the kernel holds for them (a loaded loop takes a moment)
            server.send_signal(signal.SIGTERM)

        threading.Timer(1.0, stop_with_sweeps_in_flight).start()
        statuses, errors = hey_outcomes(predict, body, CLIENTS, 3)
        for sweep in slow:  # in flight at SIGTERM, each is answered, however long the load has made it
            sweep.join(60)
        assert [(sweep.status, sweep.error) for sweep in slow] == [(200, "")] * SWEEPS
        assert list(statuses) == [200] and statuses[200] > 0, statuses
        refused = sum(n for error, n in errors.items() if "connection refused" in error)
        # then the port refuses; a request sent on a kept-alive connection as its worker closes it is reset
        # (HTTP/1.1's race, one at most per connection; uvicorn's single process has it too)
        assert refused > 0 and sum(errors.values()) - refused <= CLIENTS, errors
        assert server.wait(60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    assert not [pid for pid in first | replaced if os.path.exists(f"/proc/{pid}")], "a worker outlived the server"


def test_workers_stop_when_their_supervisor_is_killed():
    """SIGKILL to the parent (the OOM killer, say): its workers get SIGTERM and go, the port with them."""
    port = free_port()
    server = start_api(port, ENV, timeout=120)
    try:
        workers = wait_for_workers(f"http://127.0.0.1:{port}", 2, timeout=60)
    finally:
        server.kill()
        server.wait(30)
    wait_for(lambda: not [pid for pid in workers if os.path.exists(f"/proc/{pid}")], timeout=30)


def test_a_worker_that_cannot_load_stops_the_server(tmp_path):
    """A graph that runs one image (the parent's check passes) but not the warm-up's batch: the workers fail,
    and the server exits 1 with one line instead of starting workers again and again."""
    onnx = pytest.importorskip("onnx")
    for name in (contract.DECODER_ONNX, contract.MODEL_CARD):
        shutil.copy(contract.SHIPPED["mnist"] / name, tmp_path / name)
    graph = onnx.load(str(contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX))
    graph.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1  # a batch of one, nothing else
    onnx.save(graph, str(tmp_path / contract.CAPSNET_ONNX))
    env = {**ENV, "CAPSNET_MODELS": f"one={tmp_path}", "CAPSNET_PRECISION": "fp32", "CAPSNET_PORT": str(free_port())}
    proc = subprocess.run(
        [sys.executable, "-m", "app"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=contract.SHIPPED["mnist"].parent.parent,
        env={"PATH": os.environ["PATH"], **env},
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"cannot serve the models: worker \d+ could not load them \(its line above says why\)", last)
    rows = memory.rows_per_run(contract.NUM_PRIMARY)  # the warm-up's batch, in runs of this many images
    assert re.search(rf"worker \d+ cannot serve model one \(.*\): warm-up failed: .*Got: {rows}", proc.stderr), (
        proc.stderr
    )
