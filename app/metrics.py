"""Prometheus metrics: every HTTP request's count and duration by route (HttpMetrics, which
app/middleware.py's HttpMetricsMiddleware records) and the engine's own (EngineMetrics), at GET /metrics.

Each app gets its own CollectorRegistry, so several apps (tests, the benchmark) can live in one
process without "duplicated timeseries" errors. With several workers (CAPSNET_WORKERS, app/workers.py)
prometheus_client runs in multiprocess mode: each worker writes its values to files in
PROMETHEUS_MULTIPROC_DIR and GET /metrics, answered by any worker, adds up every worker's files
(the process, platform and GC collectors are then left out, as prometheus_client does there).
"""

import os
from collections import deque
from collections.abc import Callable

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.gc_collector import GCCollector
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
SECONDS_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class EngineMetrics:
    """What the batcher records (how big the batches are and how long they take), how many runs the engine
    gave every core (a request alone on the server, app/cores.py) and how many it replayed as a CUDA graph
    (app/cuda_graph.py).

    Those values are recorded once the answers that waited on them have gone: the batchers' threads and the
    engine only queue each recording (`later`), and the event loop makes them after each answer (`flush`,
    app/middleware.py's HttpMetricsMiddleware) and before GET /metrics reads them. Right after a model run, which
    leaves the caches cold, recording a batch's four values takes 66-82 us (prometheus_client's multiprocess files:
    the larger), where queueing them takes 11-13.
    """

    def __init__(self, registry: CollectorRegistry):
        self._queued: deque[tuple[Callable[..., object], tuple[object, ...]]] = deque()
        self.batch_size = Histogram(
            "capsnet_batch_size",
            "Images per ONNX Runtime run (dynamic batching)",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.inference_seconds = Histogram(
            "capsnet_inference_seconds",
            "Wall time of one session.run",
            ["model"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.queue_seconds = Histogram(
            "capsnet_queue_seconds", "Time a request waited for its batch", buckets=SECONDS_BUCKETS, registry=registry
        )
        # every worker's queue together; a dead worker's value goes with it (app/workers.py marks it dead)
        self.queue_depth = Gauge(
            "capsnet_queue_depth", "Requests waiting for the batcher", registry=registry, multiprocess_mode="livesum"
        )
        self.lone_runs = Counter(
            "capsnet_lone_runs",
            "Images of a request alone on the server, run on every core",
            ["model"],
            registry=registry,
        )
        self.graph_replays = Counter(
            "capsnet_graph_replays",
            "Single images run as a replayed CUDA graph (CAPSNET_CUDA_GRAPH)",
            ["model"],
            registry=registry,
        )
        # one sample per live worker (labelled pid with several workers)
        self.model_ready = Gauge(
            "capsnet_model_ready",
            "1 once the model is loaded and warmed up in this worker",
            ["model"],
            registry=registry,
            multiprocess_mode="liveall",
        )

    def later(self, record: Callable[..., object], *args: object) -> None:
        """Queue record(*args), from any thread: `flush` calls it."""
        self._queued.append((record, args))

    def flush(self) -> None:
        """Make every queued recording, in the order queued."""
        while True:
            try:
                record, args = self._queued.popleft()
            except IndexError:  # none left (another thread may have taken the last)
                return
            record(*args)

    @staticmethod
    def count(counter: Counter, model: str) -> None:
        """One more of `counter` (lone_runs, graph_replays) for `model`."""
        counter.labels(model).inc()

    def batch(self, batcher: str, rows: int, seconds: float, waits: list[float], queued: int) -> None:
        """One run of a batcher: its rows and time, each job's wait for it, and the jobs queued after it."""
        self.batch_size.labels(batcher).observe(rows)
        self.inference_seconds.labels(batcher).observe(seconds)
        self.queue_depth.set(queued)
        for wait in waits:
            self.queue_seconds.observe(wait)


class HttpMetrics:
    """HTTP requests (app/middleware.py's HttpMetricsMiddleware records them) counted by method, status
    class (2xx...) and the template of the route that took it (`none` where no route did), and their
    durations in the app, by method and route."""

    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter(
            "http_requests_total", "HTTP requests", ["method", "status", "handler"], registry=registry
        )
        self.duration = Histogram(
            "http_request_duration_seconds",
            "HTTP requests' durations in the app",
            ["method", "handler"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )


def exposition(registry: CollectorRegistry) -> bytes:
    """The text format of the app's metrics; with several workers, every worker's files added up."""
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
    return generate_latest(registry)


def setup_metrics(app: FastAPI) -> tuple[HttpMetrics, EngineMetrics]:
    """The app's metrics in a registry of its own, exposed at GET /metrics."""
    registry = CollectorRegistry()
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=registry)
    engine = EngineMetrics(registry)

    @app.head("/metrics", include_in_schema=False)  # as app/router.py's Router answers HEAD
    @app.get(
        "/metrics",
        tags=["health"],
        response_class=PlainTextResponse,
        summary="Prometheus metrics (text format): HTTP, batch sizes, inference time",
    )
    def metrics() -> PlainTextResponse:  # a plain def: the thread pool reads every worker's files
        engine.flush()
        return PlainTextResponse(exposition(registry), media_type=CONTENT_TYPE_LATEST)

    return HttpMetrics(registry), engine
