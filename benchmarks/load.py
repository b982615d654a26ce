"""Load from hey (Debian's package, a Go load generator): concurrent clients sending one request for a
while, every request's time from hey's CSV. A Python client on the same cores would measure itself more
than the server."""

import csv
import io
import subprocess
from pathlib import Path

import numpy as np

from tests.harness import MULTIPART

RESOLUTION_MS = 0.1  # hey writes each request's time in seconds, to four decimals


def percentile(ms: np.ndarray, q: float, step: float = RESOLUTION_MS) -> float:
    """The q-th percentile of times written to the nearest `step` ms, interpolated within its step (the
    median of grouped data): a written time stands for the step around it, its times taken as spread evenly
    over it. A percentile of the written values alone moves in whole steps (0.1 ms: a twentieth of a lone
    request's time here). Never below 0 (a time written as 0.0000), nor past the last step's top."""
    if not 0 <= q <= 100 or not len(ms):
        raise ValueError(f"a percentile is of some times and between 0 and 100, not the {q}th of {len(ms)}")
    steps, counts = np.unique(np.round(np.asarray(ms) / step).astype(np.int64), return_counts=True)
    cumulative = np.cumsum(counts)
    rank = q / 100 * cumulative[-1]
    i = int(np.searchsorted(cumulative, rank))  # the first step that holds the rank-th time
    below = cumulative[i] - counts[i]
    return max(0.0, float((steps[i] - 0.5 + (rank - below) / counts[i]) * step))


def hey(url: str, body: Path | None, clients: int, seconds: float) -> dict:
    """`clients` concurrent connections posting the multipart `body` to `url` (a GET without one) for
    `seconds` (hey -z): p50/p99 and requests/s; any answer but 200 fails the run."""
    post = ["-m", "POST", "-D", str(body), "-T", MULTIPART] if body else []
    command = ["hey", "-z", f"{seconds}s", "-c", str(clients), *post, "-o", "csv", url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    if not rows:
        raise RuntimeError(f"hey sent no request to {url}")
    statuses = {row["status-code"] for row in rows}
    if statuses != {"200"}:
        raise RuntimeError(f"{url} answered {sorted(statuses)} under load (only 200 expected)")
    ms = np.array([float(row["response-time"]) for row in rows]) * 1000
    elapsed = max(float(row["offset"]) + float(row["response-time"]) for row in rows)
    return {
        "requests": len(ms),
        "p50_ms": round(percentile(ms, 50), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "rps": round(len(ms) / elapsed, 1),
    }
