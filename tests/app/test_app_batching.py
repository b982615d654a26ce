"""Dynamic batching: the batcher alone (a fake model), then 32 concurrent requests through the app."""

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from app.batcher import DynamicBatcher, QueueFullError
from app.metrics import EngineMetrics
from tests.harness import encode, upload_scope


class FakeModel:
    """Doubles its input; blocks while `gate` is clear (`running` set meanwhile); records batch sizes."""

    def __init__(self):
        self.gate, self.running, self.sizes = threading.Event(), threading.Event(), []
        self.gate.set()

    def __call__(self, x):
        self.running.set()
        self.gate.wait(10)
        self.sizes.append(len(x))
        return [x * 2, x.sum(axis=1)]


def batcher(model, **kwargs) -> DynamicBatcher:
    settings = {"max_batch": 8, "max_wait": 0.002, "max_queue": 100} | kwargs
    b = DynamicBatcher(model, "fake", **settings)
    b.start()
    return b


async def submit_while_blocked(b: DynamicBatcher, model: FakeModel, xs: list[np.ndarray]):
    """Submit xs while the model is busy with a first job, so that they queue up."""
    model.gate.clear()
    first = asyncio.ensure_future(b.submit(np.zeros((1, 3), np.float32)))
    await asyncio.sleep(0.05)  # the batcher takes it and blocks in the model
    rest = [asyncio.ensure_future(b.submit(x)) for x in xs]
    await asyncio.sleep(0.01)
    model.gate.set()
    return await first, await asyncio.gather(*rest)


def test_queued_jobs_run_together_and_get_their_own_outputs():
    model = FakeModel()
    b = batcher(model)
    xs = [np.full((1, 3), i, np.float32) for i in range(7)]
    _, outs = asyncio.run(submit_while_blocked(b, model, xs))
    b.close()
    assert model.sizes == [1, 7]
    for x, (doubled, summed) in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(doubled, x * 2)
        np.testing.assert_array_equal(summed, x.sum(axis=1))


def test_a_batch_wakes_its_event_loop_once():
    """The batching thread hands a batch's outputs back with one call_soon_threadsafe for the loop that
    submitted them, not one per job: each is a wake-up of that loop."""
    model = FakeModel()
    b = batcher(model)
    xs = [np.full((1, 3), i, np.float32) for i in range(5)]
    handed = []

    async def counted():
        loop = asyncio.get_running_loop()
        call = loop.call_soon_threadsafe

        def counting(*args):
            handed.append(threading.get_ident())
            return call(*args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        return await submit_while_blocked(b, model, xs)

    _, outs = asyncio.run(counted())
    b.close()
    assert model.sizes == [1, 5] and len(handed) == 2  # the first job's batch, then the five's
    assert threading.get_ident() not in handed  # both from the batching thread
    for x, (doubled, _) in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(doubled, x * 2)


def test_the_batching_thread_leaves_its_recordings_to_the_flush():
    """A batch's figures are queued, not recorded, as its answers go back (recording them costs a lone request
    66-82 us right after a run): the registry has none of them until EngineMetrics.flush, then each run's rows
    and time, each job's wait and the queue's depth, in the order queued."""
    registry = CollectorRegistry()
    metrics = EngineMetrics(registry)
    model = FakeModel()
    b = batcher(model, metrics=metrics)
    xs = [np.full((1, 3), i, np.float32) for i in range(7)]
    asyncio.run(submit_while_blocked(b, model, xs))
    b.close()

    def value(name: str, **labels) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("capsnet_batch_size_count", model="fake") is None and value("capsnet_queue_seconds_count") == 0
    assert value("capsnet_queue_depth") == 0
    metrics.flush()
    assert model.sizes == [1, 7]
    assert value("capsnet_batch_size_count", model="fake") == 2 and value("capsnet_batch_size_sum", model="fake") == 8
    assert value("capsnet_batch_size_bucket", model="fake", le="1.0") == 1
    assert value("capsnet_inference_seconds_count", model="fake") == 2
    assert value("capsnet_queue_seconds_count") == 8
    assert value("capsnet_queue_depth") == 0  # the last run's: nothing left after it
    metrics.flush()  # nothing twice
    assert value("capsnet_batch_size_count", model="fake") == 2


def test_a_request_records_its_batch_once_answered(app, client, digits):
    """Through the app, the engine's recordings are made as the request ends (HttpMetricsMiddleware flushes them),
    not only when GET /metrics reads them."""

    def batches() -> float:
        return sum(
            s.value
            for family in app.state.metrics.batch_size.collect()
            for s in family.samples
            if s.name == "capsnet_batch_size_count"
        )

    before = batches()
    assert client.post("/predict", files={"file": ("d.png", encode(digits[0][0]), "image/png")}).status_code == 200
    assert batches() - before == 1


def test_a_job_of_a_loop_that_is_gone_leaves_the_batcher_serving():
    """A request whose event loop closed while the model ran it (a test client's call that ended) is
    dropped; the next request, on another loop, is answered."""
    model = FakeModel()
    b = batcher(model, deadline=10.0)  # a batcher whose thread died would fail the second request, not hang

    async def leave():
        model.gate.clear()
        job = asyncio.ensure_future(b.submit(np.ones((1, 3), np.float32)))
        while not model.running.is_set():  # held in the model; asyncio.run then cancels it and closes the loop
            await asyncio.sleep(0.005)
        return job

    asyncio.run(leave())
    model.gate.set()
    (doubled, _) = asyncio.run(b.submit(np.ones((1, 3), np.float32)))
    b.close()
    np.testing.assert_array_equal(doubled, np.full((1, 3), 2.0))
    assert model.sizes == [1, 1]


def test_jobs_that_do_not_stack_fail_and_the_batcher_goes_on():
    """Two jobs batched together whose rows differ in shape fail as a failed run does (each gets the
    error); the thread lives on and answers the next job."""
    model = FakeModel()
    b = batcher(model, deadline=10.0)

    async def odd_pair():
        model.gate.clear()
        first = asyncio.ensure_future(b.submit(np.zeros((1, 3), np.float32)))
        while not model.running.is_set():  # the first job runs alone, held in the model
            await asyncio.sleep(0.005)
        odd = [asyncio.ensure_future(b.submit(np.zeros((1, k), np.float32))) for k in (3, 4)]
        await asyncio.sleep(0.05)  # both queued behind the held run
        model.gate.set()
        await first
        return await asyncio.gather(*odd, return_exceptions=True), await b.submit(np.ones((1, 3), np.float32))

    failed, (doubled, _) = asyncio.run(odd_pair())
    b.close()
    assert all(isinstance(error, ValueError) for error in failed), failed
    np.testing.assert_array_equal(doubled, np.full((1, 3), 2.0))


def test_a_closed_batcher_refuses_jobs_at_once():
    b = batcher(FakeModel())
    b.close()
    with pytest.raises(RuntimeError, match="shutting down"):
        asyncio.run(asyncio.wait_for(b.submit(np.ones((1, 3), np.float32)), 5))


def test_on_start_runs_on_the_batching_thread_before_start_returns():
    """What must happen on the thread that runs the batches (a CUDA graph's capture) happens before the first
    job; a start that fails is logged and the batches still run."""
    seen = []
    model = FakeModel()

    def on_start():
        time.sleep(0.05)  # start() waits for it
        seen.append(threading.get_ident())

    b = batcher(model, on_start=on_start)
    assert seen == [b._thread.ident]
    b.close()
    failing = batcher(model, on_start=lambda: 1 / 0)
    out = asyncio.run(asyncio.wait_for(failing.submit(np.ones((1, 3), np.float32)), 5))
    failing.close()
    np.testing.assert_array_equal(out[0], np.full((1, 3), 2.0))


def test_max_batch_is_respected_and_big_jobs_run_alone():
    model = FakeModel()
    b = batcher(model, max_batch=4)
    xs = [np.ones((1, 3), np.float32)] * 9 + [np.ones((6, 3), np.float32)]
    _, outs = asyncio.run(submit_while_blocked(b, model, xs))
    b.close()
    assert max(model.sizes[:-1]) <= 4 and model.sizes[-1] == 6 and sum(model.sizes) == 16
    assert outs[-1][0].shape == (6, 3)


def test_a_lone_request_does_not_wait():
    model = FakeModel()
    b = batcher(model, max_wait=5.0)  # would be felt if a lone request waited for company

    async def one():
        loop = asyncio.get_running_loop()
        start = loop.time()
        await b.submit(np.ones((1, 3), np.float32))
        return loop.time() - start

    assert asyncio.run(one()) < 1.0
    b.close()


def test_a_full_queue_refuses_more_jobs():
    model = FakeModel()
    b = batcher(model, max_queue=2)

    async def flood():
        model.gate.clear()
        jobs = [asyncio.ensure_future(b.submit(np.ones((1, 3), np.float32))) for _ in range(2)]
        await asyncio.sleep(0.05)  # the first is running, the second waits
        more = [asyncio.ensure_future(b.submit(np.ones((1, 3), np.float32))) for _ in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFullError, match="busy"):
            await b.submit(np.ones((1, 3), np.float32))
        model.gate.set()
        await asyncio.gather(*jobs, *more)

    asyncio.run(flood())
    b.close()


def test_a_failing_batch_fails_its_requests_only():
    calls = []

    def flaky(x):
        calls.append(len(x))
        if len(calls) == 1:
            raise RuntimeError("boom")
        return [x]

    b = batcher(flaky)

    async def two():
        with pytest.raises(RuntimeError, match="boom"):
            await b.submit(np.ones((1, 3), np.float32))
        return await b.submit(np.ones((1, 3), np.float32))

    (out,) = asyncio.run(two())
    b.close()
    assert out.shape == (1, 3)


def batch_counts(client) -> tuple[float, float]:
    """(batches run, batches of more than one image) of the capsnet model, from GET /metrics."""
    samples = {
        (s.name, s.labels.get("le")): s.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for s in family.samples
        if s.labels.get("model") == "mnist"
    }
    total = samples[("capsnet_batch_size_count", None)]
    return total, total - samples[("capsnet_batch_size_bucket", "1.0")]


def test_32_concurrent_requests_share_batches(app, client, engine, digits, monkeypatch):
    """Through the real app (ASGI, one event loop): batches > 1 show up in /metrics, answers unchanged. The
    requests that arrive while a batch runs share the next one; each batch takes 20 ms more here, so that the
    burst (each request prepared on the event loop in turn) arrives faster than the model runs on any machine."""
    images = [digits[0][i % 20] for i in range(32)]
    alone = [
        client.post("/predict", params={"include": ""}, files={"file": ("d.png", encode(x))}).json() for x in images[:4]
    ]
    before_total, before_multi = batch_counts(client)
    batcher, run_batch = engine._capsnet_batcher, engine._capsnet_batcher.run_batch

    def slow(x: np.ndarray):
        time.sleep(0.02)
        return run_batch(x)

    monkeypatch.setattr(batcher, "run_batch", slow)

    async def burst():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as ac:
            return await asyncio.gather(
                *[ac.post("/predict", params={"include": ""}, files={"file": ("d.png", encode(x))}) for x in images]
            )

    responses = asyncio.run(burst())
    assert all(r.status_code == 200 for r in responses)
    total, multi = batch_counts(client)
    assert multi - before_multi >= 1, "no batch larger than 1"
    assert total - before_total < 32, "every request ran alone"
    for r, single in zip(responses[:4], alone, strict=True):  # batching does not change the answers
        np.testing.assert_allclose(r.json()["probabilities"], single["probabilities"], atol=1e-5)


def test_metrics_expose_inference_time_and_http(client, digits):
    client.post("/predict", files={"file": ("d.png", encode(digits[0][0]), "image/png")})
    text = client.get("/metrics").text
    assert "capsnet_inference_seconds_bucket" in text and "capsnet_queue_seconds_bucket" in text
    assert "http_requests_total" in text and "http_request_duration_seconds" in text


def test_http_metrics_count_each_request_by_its_route_and_status_class(app, client, digits):
    """A request counts under its route's template, its status class and method; a path no route has, or
    a body refused before routing, under `none`; a client gone as a 4xx (499); GET /metrics never; each
    count has its duration."""

    def http() -> dict:
        return {
            (s.name, s.labels.get("handler"), s.labels.get("status"), s.labels.get("method")): s.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for s in family.samples
            if s.name in ("http_requests_total", "http_request_duration_seconds_count")
        }

    async def gone(message):  # a client that goes away while its body is read: 499
        raise AssertionError(f"nobody is left to answer, yet the app sent {message}")

    async def disconnect():
        return {"type": "http.disconnect"}

    before = http()
    client.post("/predict?include=", files={"file": ("d.png", encode(digits[0][0]), "image/png")})
    client.post("/predict", files={"file": ("d.txt", b"not an image", "text/plain")})
    client.get("/models/nope/anything")
    client.post("/predict", content=b"{}", headers={"content-length": str(100 * 2**20)})  # 413 before routing
    asyncio.run(app({**upload_scope(), "state": {}}, disconnect, gone))
    after = http()
    changes = {key: after[key] - before.get(key, 0.0) for key in after if after[key] != before.get(key, 0.0)}
    assert changes == {
        ("http_requests_total", "/predict", "2xx", "POST"): 1.0,
        ("http_requests_total", "/predict", "4xx", "POST"): 2.0,  # the text file's 422 and the client gone
        ("http_requests_total", "none", "4xx", "GET"): 1.0,
        ("http_requests_total", "none", "4xx", "POST"): 1.0,
        ("http_request_duration_seconds_count", "/predict", None, "POST"): 3.0,
        ("http_request_duration_seconds_count", "none", None, "GET"): 1.0,
        ("http_request_duration_seconds_count", "none", None, "POST"): 1.0,
    }


def test_a_full_queue_answers_503_with_retry_after_over_http(app, client, digits, monkeypatch):
    """Through the real app: one request running (held in the model), one waiting, the next is refused
    with 503, Retry-After and a sentence; the held ones then get their answers."""
    batcher = app.state.engines["mnist"]._capsnet_batcher
    running, release, run = threading.Event(), threading.Event(), batcher.run_batch

    def held(x):
        running.set()
        release.wait(10)
        return run(x)

    monkeypatch.setattr(batcher, "run_batch", held)
    monkeypatch.setattr(batcher, "max_queue", 1)
    body = {"files": {"file": ("d.png", encode(digits[0][0]))}, "params": {"include": ""}}

    async def until(condition):
        for _ in range(1000):  # at most ~10 s
            if condition():
                return
            await asyncio.sleep(0.01)
        raise AssertionError("timed out")

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as ac:
            first = asyncio.ensure_future(ac.post("/predict", **body))
            await until(running.is_set)  # the batcher took it and is held in the model
            second = asyncio.ensure_future(ac.post("/predict", **body))
            await until(lambda: batcher._queue.qsize() == 1)  # it waits in the queue
            refused = await ac.post("/predict", **body)
            release.set()
            return refused, await first, await second

    refused, first, second = asyncio.run(scenario())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "busy" in refused.json()["detail"]
    assert first.status_code == second.status_code == 200


def test_a_request_past_its_deadline_answers_504_over_http(app, client, digits, monkeypatch):
    """A request that waits for the model longer than request_deadline_s gets 504 and a sentence, and
    a request still queued then is dropped, not run."""
    batcher = app.state.engines["mnist"]._capsnet_batcher
    running, release, run, ran = threading.Event(), threading.Event(), batcher.run_batch, []

    def held(x):
        running.set()
        release.wait(10)
        ran.append(len(x))
        return run(x)

    monkeypatch.setattr(batcher, "run_batch", held)
    monkeypatch.setattr(batcher, "deadline", 0.3)
    body = {"files": {"file": ("d.png", encode(digits[0][0]))}, "params": {"include": ""}}

    async def scenario():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as ac:
            first = asyncio.ensure_future(ac.post("/predict", **body))  # runs, held in the model
            for _ in range(1000):
                if running.is_set():
                    break
                await asyncio.sleep(0.01)
            late = await ac.post("/predict", **body)  # queued behind it past the deadline
            release.set()
            return late, await first

    late, first = asyncio.run(scenario())
    assert late.status_code == 504 and "did not answer within 0.3 s" in late.json()["detail"]
    assert first.status_code == 504  # it ran, but past its deadline
    monkeypatch.setattr(batcher, "deadline", 30.0)
    assert client.post("/predict", **body).status_code == 200
    assert ran == [1, 1]  # the held request, then this one: the late one was dropped from the queue


def test_the_deadline_answer_is_in_the_openapi(app):
    """Both routes that wait on a batcher say they may answer 504 (the test above shows that they do)."""
    paths = app.openapi()["paths"]
    assert "504" in paths["/predict"]["post"]["responses"] and "504" in paths["/reconstruct"]["post"]["responses"]
