"""Reliability: the real server under sustained load, its memory over many requests, and SIGTERM under load.

$ python -m benchmarks.reliability                                    # the full counts (minutes)
$ python -m benchmarks.reliability --requests 2000 --soak 5000        # quicker

Starts `python -m app` (CPU provider, one process: CAPSNET_WORKERS=1, a free port) and, as clients on
loopback, measures:
- load: `requests` POST /predict (full answer) from `clients` concurrent clients: answers by status,
  client-side failures by exception type, p50/p99 latency;
- soak: the server's resident memory (VmRSS) after a warm-up and after `soak` more requests from 8 clients;
- SIGTERM under load: 32 clients post continuously, the server gets SIGTERM after 2 s; every request
  is classed as answered (any HTTP status), refused and never sent (connection refused: the
  server had stopped accepting), or accepted but unanswered (sent, then the connection dropped): the
  last is the number that must be 0 for a graceful shutdown.
- workers: `python -m app` with CAPSNET_WORKERS=2 and every model: each worker's resident memory once
  ready and after `hey` loads every model at once, and the parent's; then, counted by hey, /predict under
  load while the busier worker is killed (SIGKILL: the requests lost beside the connections it held,
  how long until its replacement is ready) and while the parent gets SIGTERM (answered, refused, reset).
Writes benchmarks/results/reliability.json. A benchmark, not a test.
"""

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from tests.harness import (
    connections,
    digit_png,
    free_port,
    hey_outcomes,
    machine,
    multipart,
    rss_mb,
    start_api,
    wait_for_workers,
)

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "reliability.json"
ONE_PROCESS = {"CAPSNET_PROVIDERS": "CPUExecutionProvider", "CAPSNET_WORKERS": "1"}


async def fire(url: str, body: bytes, clients: int, total: int | None = None, until: float | None = None):
    """`clients` loops posting /predict until `total` requests are done or the clock passes `until`;
    returns (statuses, failures by exception type, latencies in ms, failures classed for SIGTERM)."""
    statuses: Counter[int] = Counter()
    failures: Counter[str] = Counter()
    classes: Counter[str] = Counter()
    latencies: list[float] = []
    files = {"file": ("digit.png", body, "image/png")}
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    sent = 0
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def one():
            nonlocal sent
            while (total is None or sent < total) and (until is None or time.monotonic() < until):
                sent += 1
                start = time.perf_counter()
                try:
                    r = await client.post("/predict", files=files)
                except httpx.ConnectError as exc:  # refused: never reached the server
                    failures[type(exc).__name__] += 1
                    classes["refused, never sent"] += 1
                    await asyncio.sleep(0.01)
                    continue
                except httpx.TransportError as exc:  # sent, then no answer
                    failures[type(exc).__name__] += 1
                    classes["accepted, unanswered"] += 1
                    continue
                latencies.append(1000 * (time.perf_counter() - start))
                statuses[r.status_code] += 1
                classes["answered"] += 1

        await asyncio.gather(*[one() for _ in range(clients)])
    return statuses, failures, latencies, classes


def load(url: str, body: bytes, requests: int, clients: int) -> dict:
    start = time.perf_counter()
    statuses, failures, ms, _ = asyncio.run(fire(url, body, clients, total=requests))
    return {
        "requests": requests,
        "clients": clients,
        "seconds": round(time.perf_counter() - start, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "client_failures": dict(failures),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
    }


def soak(url: str, body: bytes, pid: int, requests: int) -> dict:
    asyncio.run(fire(url, body, 8, total=500))  # warm: allocator pools, batcher, first-use imports
    before = rss_mb(pid)
    statuses, failures, _, _ = asyncio.run(fire(url, body, 8, total=requests))
    after = rss_mb(pid)
    return {
        "requests": requests,
        "clients": 8,
        "rss_mb_before": round(before, 1),
        "rss_mb_after": round(after, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "client_failures": dict(failures),
    }


def sigterm_under_load(body: bytes, clients: int = 32, after_s: float = 2.0) -> dict:
    port = free_port()
    server = start_api(port, ONE_PROCESS, timeout=120)

    async def scenario():
        asyncio.get_running_loop().call_later(after_s, server.send_signal, signal.SIGTERM)
        return await fire(f"http://127.0.0.1:{port}", body, clients, until=time.monotonic() + after_s + 8)

    statuses, failures, _, classes = asyncio.run(scenario())
    server.wait(60)
    return {
        "clients": clients,
        "sigterm_after_s": after_s,
        "exit_status": server.returncode,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "client_failures": dict(failures),
        "answered": classes["answered"],
        "refused_before_sending": classes["refused, never sent"],
        "accepted_unanswered": classes["accepted, unanswered"],
    }


def outcomes(statuses: dict[int, int], errors: dict[str, int]) -> dict:
    """hey's counts classed: answered (by status), refused and never sent, and sent but left without an answer."""
    refused = sum(n for error, n in errors.items() if "connection refused" in error)
    return {
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "refused_before_sending": refused,
        "sent_unanswered": sum(errors.values()) - refused,
        "errors": {error.split(": ", 1)[-1]: n for error, n in errors.items() if "connection refused" not in error},
    }


def every_model_at_once(url: str, body: Path, clients: int, seconds: float) -> list[dict]:
    """hey on /predict of every served model at the same time, `clients` connections each."""
    with urllib.request.urlopen(f"{url}/models", timeout=10) as response:
        names = [m["name"] for m in json.loads(response.read())["models"]]
    with ThreadPoolExecutor(len(names)) as pool:
        runs = list(pool.map(lambda n: hey_outcomes(f"{url}/predict?model={n}", body, clients, seconds), names))
    return [{"model": n, **outcomes(*run)} for n, run in zip(names, runs, strict=True)]


def killed_under_load(url: str, body: Path, port: int, workers: set[int], clients: int, seconds: float) -> dict:
    """hey on /predict for `seconds`; a third of the way, the worker holding more connections gets SIGKILL.
    What hey counts, the connections that worker held (at most one request in flight each) and how long
    its replacement took to be ready."""
    held: dict[int, int] = {}
    replaced_after: list[float] = []

    def kill_the_busier() -> None:
        held.update({pid: connections(pid, port) for pid in workers})
        victim, killed = max(held, key=held.__getitem__), time.monotonic()
        os.kill(victim, signal.SIGKILL)
        wait_for_workers(url, len(workers), gone=victim)
        replaced_after.append(time.monotonic() - killed)

    killer = threading.Timer(seconds / 3, kill_the_busier)
    killer.start()
    counted = outcomes(*hey_outcomes(f"{url}/predict", body, clients, seconds))
    killer.join()
    return {"connections_held": max(held.values()), **counted, "replaced_after_s": round(replaced_after[0], 1)}


def workers_under_load(body: Path, workers: int = 2, clients: int = 64, seconds: float = 6.0) -> dict:
    """The workers' memory, a worker killed under load and SIGTERM under load, counted by hey (module doc)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {"CAPSNET_PROVIDERS": "CPUExecutionProvider", "CAPSNET_WORKERS": str(workers)}
    server = start_api(port, env, timeout=180)
    try:
        first = wait_for_workers(url, workers)
        report: dict = {"workers": workers, "clients": clients, "rss_mb_ready": [round(rss_mb(p)) for p in first]}
        report["every_model_at_once"] = every_model_at_once(url, body, clients // 4, seconds)
        report["rss_mb_after_load"] = [round(rss_mb(p)) for p in first]
        report["parent_rss_mb"] = round(rss_mb(server.pid))
        report["kill"] = killed_under_load(url, body, port, first, clients, seconds)
        threading.Timer(seconds / 3, server.send_signal, [signal.SIGTERM]).start()
        stopped = outcomes(*hey_outcomes(f"{url}/predict", body, clients, seconds))
        report["sigterm"] = {"after_s": round(seconds / 3, 1), **stopped, "exit_status": server.wait(60)}
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(30)
    return report


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.reliability", description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=10_000, help="requests of the load phase")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients of the load phase")
    p.add_argument("--soak", type=int, default=50_000, help="requests between the two RSS readings")
    p.add_argument("--workers-seconds", type=float, default=6.0, help="each hey load of the workers phase")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if shutil.which("hey") is None:
        sys.exit("reliability's workers phase needs the load generator hey: apt-get install hey")
    body = digit_png()
    port = free_port()
    server = start_api(port, ONE_PROCESS, timeout=120)
    url = f"http://127.0.0.1:{port}"
    try:
        report = {
            "device": machine(),
            "when": time.strftime("%Y-%m-%d %H:%M"),
            "load": load(url, body, args.requests, args.clients),
        }
        print(json.dumps(report["load"]), flush=True)
        report["soak"] = soak(url, body, server.pid, args.soak)
        print(json.dumps(report["soak"]), flush=True)
    finally:
        server.terminate()
        server.wait(60)
    report["sigterm"] = sigterm_under_load(body)
    print(json.dumps(report["sigterm"]), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        upload = Path(tmp) / "body"
        upload.write_bytes(multipart(body))
        report["workers"] = workers_under_load(upload, clients=args.clients, seconds=args.workers_seconds)
    print(json.dumps(report["workers"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
