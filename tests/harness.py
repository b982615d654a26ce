"""What the tests run the service with as a user does, and the benchmarks borrow: a free port, the API
started as its own process and waited for, an image as PNG bytes (the first MNIST test digit among them),
an upload's multipart body, the machine in words, and, for several workers, hey's answers and errors, the
workers that /metrics lists and a process's resident memory, CPU time and connections. It imports neither
torch, the app nor the benchmarks: benchmarks/ imports it, never the other way round.
"""

import contextlib
import io
import os
import platform
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
BOUNDARY = "capsnet-bench-boundary"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"  # the Content-Type of multipart()'s bodies
FIXTURES = REPO / "tests" / "fixtures"
REAL_WORLD = FIXTURES / "robustness"  # six pictures of each kind of benchmarks/robustness.py
# A 7 as drawing apps export it: black ink whose strokes are held in the alpha channel of a 280x280 PNG
TRANSPARENT_SEVEN = REAL_WORLD / "transparent" / "transparent-03213-7.png"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready(url: str, timeout: float = 2.0) -> bool:
    """Whether GET url answers 200 (the API's /ready: every model loaded and warmed up)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start_api(
    port: int,
    env: dict[str, str] | None = None,
    timeout: float = 180.0,
    cpus: set[int] | None = None,
    log: Path | None = None,
) -> subprocess.Popen:
    """`python -m app` on 127.0.0.1:port (CAPSNET_* settings from env; on `cpus` when given; its output to
    the file `log` when given, else this process's), returned once /ready answers; a RuntimeError that
    says why if it stops or is not ready within timeout seconds."""
    env = {**os.environ, "CAPSNET_PORT": str(port), "CAPSNET_LOG_LEVEL": "warning", **(env or {})}
    pin = None if cpus is None else lambda: os.sched_setaffinity(0, cpus)
    output = None if log is None else log.open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "app"], cwd=REPO, env=env, preexec_fn=pin, stdout=output, stderr=output
    )
    if output is not None:
        output.close()  # the server writes through its own copy of the descriptor

    def failed(why: str) -> RuntimeError:
        return RuntimeError(f"{why}; its log is above" if log is None else f"{why}; its log:\n{log.read_text()}")

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise failed(f"the API stopped during start-up (exit {server.returncode})")
        if ready(f"http://127.0.0.1:{port}/ready"):
            return server
        time.sleep(0.2)
    server.kill()
    raise failed(f"the API was not ready within {timeout:.0f} s")


def encode(image: Image.Image | np.ndarray, fmt: str = "PNG", **save_args) -> bytes:
    """An image as file bytes (PNG unless fmt says otherwise); an array is (H, W[, C]) uint8, or float in
    [0, 1]."""
    if isinstance(image, np.ndarray):
        pixels = image if image.dtype == np.uint8 else np.round(np.clip(image, 0.0, 1.0) * 255).astype(np.uint8)
        image = Image.fromarray(pixels)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save_args)
    return buffer.getvalue()


def digit_png() -> bytes:
    """The first MNIST test digit of the fixture, as a PNG (the request the serving tests and benchmarks send)."""
    with np.load(FIXTURES / "mnist_test_1000.npz") as f:
        return encode(f["images"][0])


def multipart(payload: bytes, filename: str = "digit.png", mime: str = "image/png") -> bytes:
    """The body of a multipart/form-data upload of payload as the field `file` (what curl -F sends), sent
    with the Content-Type MULTIPART."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        f"Content-Type: {mime}\r\n\r\n"
    ).encode()
    return head + payload + f"\r\n--{BOUNDARY}--\r\n".encode()


def upload_scope() -> dict:
    """The ASGI scope of a POST /predict whose body is a multipart() upload (Content-Type MULTIPART)."""
    headers = [(b"content-type", MULTIPART.encode())]
    return {"type": "http", "method": "POST", "path": "/predict", "query_string": b"", "headers": headers}


def machine() -> str:
    """The CPU model and core count (and the GPU's name, when nvidia-smi answers)."""
    cpu, cpuinfo = platform.machine(), Path("/proc/cpuinfo")
    if cpuinfo.exists():
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in cpuinfo.read_text().splitlines()
                if line.startswith("model name")
            ),
            cpu,
        )
    try:
        gpu = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        gpu = ""
    return f"{gpu} + {cpu} x{os.cpu_count()}" if gpu else f"{cpu} x{os.cpu_count()}"


def hey_outcomes(
    url: str, body: Path, clients: int, seconds: float, keep_alive: bool = True
) -> tuple[dict[int, int], dict[str, int]]:
    """`hey` posting the multipart `body` to url from `clients` clients for `seconds` (a new connection for
    every request unless keep_alive): the answers by status and the requests that got none by hey's error
    (`... connect: connection refused`, `... EOF`)."""
    command = ["hey", "-z", f"{seconds}s", "-c", str(clients), "-m", "POST", "-D", str(body), "-T", MULTIPART]
    command += [url] if keep_alive else ["-disable-keepalive", url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    statuses = {int(code): int(n) for code, n in re.findall(r"^\s+\[(\d{3})\]\s+(\d+) responses$", out, re.M)}
    failures = out.split("Error distribution:", 1)[1] if "Error distribution:" in out else ""
    errors = {error.strip(): int(n) for n, error in re.findall(r"^\s+\[(\d+)\]\s+(.+)$", failures, re.M)}
    return statuses, errors


def workers_ready(url: str) -> set[int]:
    """The worker processes whose models are all warm, from GET /metrics (capsnet_model_ready's pid labels,
    there when the API runs several workers)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    ready = [s for s in samples if s.name == "capsnet_model_ready" and "pid" in s.labels]
    pids = {int(s.labels["pid"]) for s in ready}
    return {pid for pid in pids if all(s.value == 1 for s in ready if int(s.labels["pid"]) == pid)}


def wait_for_workers(url: str, count: int, gone: int = 0, timeout: float = 180.0) -> set[int]:
    """The ready workers' PIDs (workers_ready) once there are `count` of them and `gone` is not among them;
    a RuntimeError if that does not happen within timeout seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = workers_ready(url)
        if len(pids) == count and gone not in pids:
            return pids
        time.sleep(0.2)
    raise RuntimeError(f"{count} workers were not ready within {timeout:.0f} s")


def rss_mb(pid: int | str = "self") -> float:
    """A process's resident memory in MB (/proc/PID/status VmRSS); this process's by default."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def connections(pid: int, port: int) -> int:
    """TCP connections to 127.0.0.1:port that process pid holds open, established (/proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    rows = [line.split() for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]]
    established = "01"
    return sum(1 for r in rows if int(r[1].split(":")[1], 16) == port and r[3] == established and r[9] in inodes)
