"""Dynamic batching: concurrent requests are gathered and run as one batch (Triton's idea).

A job is an array with a leading batch axis (a single image is (1, 1, 28, 28)); jobs are stacked
up to `max_batch` rows and the outputs are split back per job. The gathering loop and
`session.run` live on one dedicated thread, so the event loop never blocks and any event loop can
submit (uvicorn has one loop; test clients run one per call). A job crosses to that thread through a
queue.SimpleQueue and comes back as its event loop's own future, which the thread settles with one
call_soon_threadsafe per batch and loop: the fewest wake-ups and allocations a round trip can have
(benchmarks/cpu_profile.py's batcher hop).

Wait policy (`max_wait`, Triton's max_queue_delay): a batch waits up to max_wait after its first
job arrived for more jobs, but only under load, i.e. when it already holds several jobs or the last
batch did. A lone request at low load runs at once, so batching adds no latency there.
"""

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from app.metrics import EngineMetrics

log = logging.getLogger(__name__)

RunBatch = Callable[[np.ndarray], Sequence[np.ndarray]]
Outcome = list[np.ndarray] | BaseException  # a job's outputs, or why it has none


class QueueFullError(Exception):
    """More requests are waiting than max_queue allows; the client should retry later."""


class DeadlineError(Exception):
    """A request waited for the model longer than its deadline; it is dropped if it has not run yet."""


@dataclass
class _Job:
    x: np.ndarray  # (n, ...)
    loop: asyncio.AbstractEventLoop  # the submitter's: the future is its, and is settled on it
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)


def _settle(settled: list[tuple[asyncio.Future, Outcome]]) -> None:
    """On the submitters' event loop: each future gets its outputs or its exception, unless its request
    was cancelled meanwhile (its deadline passed, its client left)."""
    for future, outcome in settled:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


_STOP = object()


class DynamicBatcher:
    """Runs `run_batch` on stacked jobs from a queue, on its own thread.

    Args:
        run_batch: (B, ...) -> a sequence of outputs, each with the leading axis B.
        max_batch: most rows per run; 1 turns batching off. A larger single job runs alone.
        max_wait: seconds a batch under load waits for more jobs after its first one arrived.
        max_queue: most jobs waiting; beyond it `submit` raises QueueFullError.
        deadline: seconds a job may wait for its outputs, queue included; beyond it `submit` raises
            DeadlineError (None: no deadline).
        on_start: run on the batching thread before its first job (what must happen on the thread that runs
            the batches: capturing a CUDA graph); `start` returns once it has.
    """

    def __init__(
        self,
        run_batch: RunBatch,
        name: str,
        max_batch: int,
        max_wait: float,
        max_queue: int,
        metrics: EngineMetrics | None = None,
        deadline: float | None = None,
        on_start: Callable[[], None] | None = None,
    ):
        self.run_batch, self.name, self.deadline, self.on_start = run_batch, name, deadline, on_start
        self.max_batch, self.max_wait, self.max_queue = max_batch, max_wait, max_queue
        self.metrics = metrics
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._held: _Job | None = None  # a job that did not fit in the last batch
        self._last_size = 1
        self._closed = False  # close() was called: jobs are refused, none would be run
        self._thread = threading.Thread(target=self._loop, name=f"batcher-{name}", daemon=True)
        self._started = threading.Event()

    def start(self) -> None:
        """Start the batching thread; return once its on_start has run."""
        self._thread.start()
        self._started.wait()

    @property
    def native_id(self) -> int | None:
        """The batching thread's id in the kernel, once started."""
        return self._thread.native_id

    def close(self, timeout: float = 10.0) -> None:
        self._closed = True
        if self._thread.ident is None:  # never started
            return
        self._queue.put(_STOP)
        self._thread.join(timeout)

    async def submit(self, x: np.ndarray) -> list[np.ndarray]:
        """Queue x (n, ...) and wait for its outputs, each (n, ...)."""
        if self._closed:
            raise RuntimeError("the server is shutting down")
        if self._queue.qsize() >= self.max_queue:
            raise QueueFullError(f"the server is busy: {self.max_queue} requests are already waiting; retry shortly")
        loop = asyncio.get_running_loop()
        job = _Job(x, loop, loop.create_future())
        self._queue.put(job)
        if (metrics := self.metrics) is not None:
            metrics.later(metrics.queue_depth.set, self._queue.qsize())
        try:  # past the deadline (or cancelled) the future is cancelled: a job still queued is then dropped
            async with asyncio.timeout(self.deadline):
                return await job.future
        except TimeoutError:
            raise DeadlineError(
                f"the model did not answer within {self.deadline:g} s (the server is overloaded); retry shortly"
            ) from None

    # --- the batching thread ---------------------------------------------------------------------
    def _next(self, timeout: float | None):
        """The held job, else the next queued one; None when none came within timeout."""
        if self._held is not None:
            job, self._held = self._held, None
            return job
        try:
            return self._queue.get(timeout=timeout) if timeout != 0 else self._queue.get_nowait()
        except queue.Empty:
            return None

    def _gather(self) -> list[_Job] | None:
        """Block for a first job, then add jobs until max_batch rows or the wait is over."""
        first = self._next(timeout=None)
        if first is _STOP:
            return None
        jobs, rows = [first], len(first.x)
        deadline = first.enqueued + self.max_wait
        while rows < self.max_batch:
            job = self._next(timeout=0)
            if job is None:
                under_load = len(jobs) > 1 or self._last_size > 1
                remaining = deadline - time.monotonic()
                if not under_load or remaining <= 0:
                    break
                job = self._next(timeout=remaining)
                if job is None:
                    break
            if job is _STOP or rows + len(job.x) > self.max_batch:
                self._held = job  # runs first next time (_STOP: ends the loop after this batch)
                break
            jobs.append(job)
            rows += len(job.x)
        return jobs

    def _loop(self) -> None:
        try:
            if self.on_start is not None:
                self.on_start()
        except Exception:  # the batches still run
            log.exception("%s: its start failed", self.name)
        finally:
            self._started.set()
        while (jobs := self._gather()) is not None:
            jobs = [job for job in jobs if not job.future.cancelled()]  # drop those whose request is over
            if jobs:
                self._run(jobs)
        self._fail_waiting()

    def _run(self, jobs: list[_Job]) -> None:
        start = time.monotonic()
        try:  # jobs whose rows do not stack (a client's odd tensor) fail as a failed run does
            x = jobs[0].x if len(jobs) == 1 else np.concatenate([job.x for job in jobs])
            outputs = self.run_batch(x)
        except Exception as exc:  # every job of the batch fails with it (the route answers 500); the thread goes on
            log.exception("%s: a batch of %d job(s) failed", self.name, len(jobs))
            self._answer([(job, exc) for job in jobs])
            return
        self._last_size = len(x)
        if (metrics := self.metrics) is not None:
            waits = [start - job.enqueued for job in jobs]
            elapsed = time.monotonic() - start
            metrics.later(metrics.batch, self.name, len(x), elapsed, waits, self._queue.qsize())
        answers: list[tuple[_Job, Outcome]] = []
        offset = 0
        for job in jobs:
            n = len(job.x)
            answers.append((job, [out[offset : offset + n] for out in outputs]))
            offset += n
        self._answer(answers)

    @staticmethod
    def _answer(answers: Sequence[tuple[_Job, Outcome]]) -> None:
        """Hand each job its outcome on its event loop: one wake-up per loop, however many jobs it has."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for job, outcome in answers:
            by_loop.setdefault(job.loop, []).append((job.future, outcome))
        for loop, settled in by_loop.items():
            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits for these any more
                loop.call_soon_threadsafe(_settle, settled)

    def _fail_waiting(self) -> None:
        """On shutdown, answer whatever is still queued instead of leaving it hanging."""
        waiting: list[tuple[_Job, Outcome]] = []
        while (job := self._next(timeout=0)) is not None:
            if job is not _STOP:
                waiting.append((job, RuntimeError("the server is shutting down")))
        self._answer(waiting)
