"""What the benchmarks and the tests share to run the service as a user does: a free port, the API
started as its own process and waited for, an image as PNG bytes, an upload's multipart body, and the
machine in words. Written once here; nothing in it imports torch or the app.
"""

import io
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
BOUNDARY = "capsnet-bench-boundary"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"  # the Content-Type of multipart()'s bodies


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


def start_api(port: int, env: dict[str, str] | None = None, timeout: float = 180.0) -> subprocess.Popen:
    """`python -m app` on 127.0.0.1:port (CAPSNET_* settings from env), returned once /ready answers;
    a RuntimeError that says why if it stops or is not ready within timeout seconds."""
    env = {**os.environ, "CAPSNET_PORT": str(port), "CAPSNET_LOG_LEVEL": "warning", **(env or {})}
    server = subprocess.Popen([sys.executable, "-m", "app"], cwd=REPO, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the API stopped during start-up (exit {server.returncode}; its log is above)")
        if ready(f"http://127.0.0.1:{port}/ready"):
            return server
        time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"the API was not ready within {timeout:.0f} s")


def encode(image: Image.Image | np.ndarray, fmt: str = "PNG", **save_args) -> bytes:
    """An image as file bytes (PNG unless fmt says otherwise); an array is (H, W[, C]) uint8, or float in
    [0, 1]."""
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8:
            image = np.round(np.clip(image, 0.0, 1.0) * 255).astype(np.uint8)
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save_args)
    return buffer.getvalue()


def multipart(payload: bytes, filename: str = "digit.png", mime: str = "image/png") -> bytes:
    """The body of a multipart/form-data upload of payload as the field `file` (what curl -F sends), sent
    with the Content-Type MULTIPART."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        f"Content-Type: {mime}\r\n\r\n"
    ).encode()
    return head + payload + f"\r\n--{BOUNDARY}--\r\n".encode()


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
