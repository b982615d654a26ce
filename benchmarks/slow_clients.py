"""Slow and vanishing clients against the real `python -m app` (mnist, its default settings otherwise).

$ python -m benchmarks.slow_clients                      # 800 stalled uploads, the default 30 s deadline
$ python -m benchmarks.slow_clients --connections 200 --deadline 5

Opens `connections` connections that each send the head of a 100 kB multipart upload to /predict and then
stall; while they stall, `hey` sends /predict?include= from one client (p50, and that every answer is 200);
then it waits for the server to cut them: how many were answered 408 and closed, and when, from the
stalled heads' sending. Then as many connections send a head and a few bytes and go away. Counted in the
server's log: lines naming the deadline's cuts or the clients gone, tracebacks and lines matching
"error". The workers' resident memory before and during the stall. Writes
benchmarks/results/slow_clients.json and .md. Not a test.
"""

import argparse
import re
import selectors
import socket
import tempfile
import time
from pathlib import Path

from app.settings import Settings, available_cores
from benchmarks.load import hey
from benchmarks.report import write_report
from tests.harness import BOUNDARY, digit_png, free_port, machine, multipart, rss_mb, start_api, wait_for_workers

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 180  # for `python -m app` to load, warm up and open its port
RESULTS = REPO / "benchmarks" / "results"
UPLOAD = 100_000  # bytes each stalled upload announces
HOST = "127.0.0.1"


def stalled(port: int) -> socket.socket:
    """A connection that sent the head of a 100 kB upload to /predict and a first part of its body."""
    sock = socket.create_connection((HOST, port), timeout=120)
    head = (
        f"POST /predict HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {UPLOAD}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n"
    )
    sock.sendall(head.encode() + multipart(digit_png())[:100])
    return sock


def replies(socks: list[socket.socket], since: float, timeout: float) -> list[tuple[bytes, float]]:
    """Each connection's first bytes from the server and when they came (seconds after `since`), read until
    the server closes it; (b"", timeout) for one still open after timeout seconds."""
    selector = selectors.DefaultSelector()
    got: dict[socket.socket, tuple[bytes, float]] = {}
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, sock)
    end = time.monotonic() + timeout
    while len(got) < len(socks) and time.monotonic() < end:
        for key, _ in selector.select(timeout=1.0):
            sock = key.data
            data = sock.recv(65536)
            if sock not in got:
                got[sock] = (data[:12], time.monotonic() - since)
            if not data:
                selector.unregister(sock)
    return [got.get(sock, (b"", timeout)) for sock in socks]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--connections", type=int, default=800)
    p.add_argument("--deadline", type=float, default=None, help="CAPSNET_READ_DEADLINE_S (default: the service's)")
    p.add_argument("--out", type=Path, default=RESULTS / "slow_clients.json")
    args = p.parse_args(argv)
    port = free_port()
    deadline = Settings.model_fields["read_deadline_s"].default if args.deadline is None else args.deadline
    env = {"CAPSNET_MODELS": "mnist", "CAPSNET_LOG_LEVEL": "info", "CAPSNET_READ_DEADLINE_S": str(deadline)}
    with tempfile.TemporaryDirectory() as tmp:
        log_path, body = Path(tmp) / "server.log", Path(tmp) / "body"
        body.write_bytes(multipart(digit_png()))
        server = start_api(port, env, START_TIMEOUT_S, log=log_path)
        try:
            url = f"http://{HOST}:{port}"
            count = available_cores()  # the default: a worker per core
            workers = sorted(wait_for_workers(url, count)) if count > 1 else [server.pid]
            rss_before = [round(rss_mb(w), 1) for w in workers]
            sent = time.monotonic()
            socks = [stalled(port) for _ in range(args.connections)]
            opened = time.monotonic() - sent
            time.sleep(1)
            rss_stalled = [round(rss_mb(w), 1) for w in workers]
            during = hey(f"{url}/predict?include=", body, 1, 3.0)  # fails unless every answer is 200
            answers = replies(socks, sent, deadline + 60)
            for sock in socks:
                sock.close()
            cut = [t for status, t in answers if status == b"HTTP/1.1 408"]
            log_lines = len(log_path.read_text().splitlines())
            for _ in range(args.connections):  # clients that go away mid-upload
                stalled(port).close()
            time.sleep(3)
            log = log_path.read_text().splitlines()
        finally:
            server.terminate()
            server.wait(60)
    gone = [line for line in log[log_lines:] if "went away" in line]
    report = {
        "device": machine(),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "workers": len(workers),
        "connections": args.connections,
        "deadline_s": deadline,
        "opened_s": round(opened, 2),
        "rss_mb_before": rss_before,
        "rss_mb_stalled": rss_stalled,
        "predict_during": during,
        "answered_408": len(cut),
        "cut_after_s": [round(min(cut), 2), round(max(cut), 2)] if cut else None,
        "log_cut_lines": sum("cut off by the read deadline" in line for line in log),
        "log_gone_lines": len(gone),
        "log_tracebacks": sum(line.startswith("Traceback") for line in log),
        "log_error_lines": sum(bool(re.search("error", line, re.IGNORECASE)) for line in log),
    }
    write_report(args.out, report, markdown(report))
    return report


def markdown(r: dict) -> str:
    cut = f"{r['cut_after_s'][0]}–{r['cut_after_s'][1]} s" if r["cut_after_s"] else "none"
    return (
        f"# Slow and vanishing clients ({r['device']}, {r['workers']} workers)\n\n"
        f"{r['when']}; `python -m app`, mnist, read deadline {r['deadline_s']:g} s.\n\n"
        "| figure | measured |\n|---|---:|\n"
        f"| stalled uploads (head of a 100 kB body, then nothing) | {r['connections']} "
        f"(opened in {r['opened_s']} s) |\n"
        f"| /predict?include= meanwhile, 1 client (hey) | p50 {r['predict_during']['p50_ms']} ms, "
        f"{r['predict_during']['requests']} answers, all 200 |\n"
        f"| answered 408 and closed | {r['answered_408']} of {r['connections']}, {cut} after their heads |\n"
        f"| workers' RSS before / while stalled, MB | {r['rss_mb_before']} / {r['rss_mb_stalled']} |\n"
        f"| log lines: cut by the deadline / clients gone ({r['connections']} went away) | "
        f"{r['log_cut_lines']} / {r['log_gone_lines']} |\n"
        f'| log: tracebacks / lines matching "error" | {r["log_tracebacks"]} / {r["log_error_lines"]} |\n'
    )


if __name__ == "__main__":
    main()
