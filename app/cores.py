"""Which worker processes hold requests: a board they share, so that a request alone on the server can
take the cores that no other worker is using, and run on them as fast as they allow.

With several workers each ONNX Runtime session has a share of the cores (Settings.session_threads),
which keeps a loaded server from running more threads than it has cores; but a request alone on the
server would finish sooner on all of them. A single worker's sessions have every core, but their threads
sleep between the parts of a run (Settings.intra_op_spinning), so that under load they leave the event
loop its core; a request alone would finish sooner with threads that spin within its run. Each worker
(one included) counts its requests in flight on the board, a small file that the serving process makes and
every worker maps (shared_board; app/middleware.py's BoardMiddleware counts). A worker about to run a single
image for its only request, while every other worker has held no request for QUIET_S, runs it on its wide
session (app/engine.py: the default model's, every available core, spinning within the run). Under load
a worker rarely holds one request alone, and the others are rarely quiet that long, so the sessions keep
their shares (benchmarks/serve_bench.py measures both). While a worker serves alone, its event loop's
thread and its batchers' threads also stay on one core of its own (Home): a lone request is handed from one
to the other and back, and each hand-over wakes a thread, which is cheaper on the core the waker leaves idle
than on another.
"""

import contextlib
import fcntl
import logging
import mmap
import os
import time
from functools import cache
from pathlib import Path

import numpy as np

from app.settings import available_cores

log = logging.getLogger(__name__)

BOARD = "CAPSNET_CORES_BOARD"  # the board's path, set by the serving process (shared_board; not a setting)
QUIET_S = 0.05  # how long every other worker must have held no request for a lone one to take every core
# a worker's slot: its pid, its requests in flight and when its last one ended (time.monotonic, which is
# the same clock in every process), in the host's byte order: three 8-byte words
_SLOT = np.dtype([("pid", "=i8"), ("requests", "=i8"), ("ended", "=f8")])
WORDS = _SLOT.itemsize // 8


def make_board(path: Path, workers: int) -> Path:
    """An empty board at path for `workers` workers: a slot for each and one more each for its replacement (a
    worker the supervisor kills keeps its slot until it is reaped). Each request reads every slot (Board.alone):
    as few as the server's workers, not as many as it could have."""
    path.write_bytes(bytes(2 * workers * _SLOT.itemsize))
    return path


@contextlib.contextmanager
def shared_board(folder: Path, workers: int):
    """An empty board in folder for `workers` workers, named (BOARD) to this process and the workers it starts, for
    the block."""
    os.environ[BOARD] = str(make_board(folder / "cores.board", workers))
    try:
        yield
    finally:  # nothing started after this may look for it
        os.environ.pop(BOARD, None)


class Board:
    """This worker's slot on the board at path, claimed under a lock: the first one free or left by a
    worker that is gone (the supervisor's replacement for a dead worker takes its slot). Its counts are
    written by the event loop's thread alone and read by any thread of any worker."""

    def __init__(self, path: Path):
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if not size or size % _SLOT.itemsize:
                raise RuntimeError(f"the workers' board {path} is {size} bytes, not a whole number of slots")
            self._map = mmap.mmap(fd, size)
            self._slots = np.frombuffer(self._map, _SLOT)
            fcntl.lockf(fd, fcntl.LOCK_EX)
            gone = [i for i, pid in enumerate(self._slots["pid"]) if pid != 0 and not Path(f"/proc/{pid}").exists()]
            self._slots[gone] = (0, 0, 0.0)  # a worker that died holding requests holds none now
            free = np.flatnonzero(self._slots["pid"] == 0)
            if not free.size:
                raise RuntimeError(f"the workers' board {path} has no free slot of {len(self._slots)}")
            self.slot = int(free[0])
            self._slots[self.slot] = (os.getpid(), 0, 0.0)
        finally:
            os.close(fd)  # and its lock
        # the counts as each request reads and writes them: memoryviews of Python ints and floats, whose reads
        # take 50 us right after a model run (which leaves the caches cold) where numpy's indexing takes 100
        words = memoryview(self._map)
        self._requests, self._ended = words.cast("q")[1::WORDS], words.cast("d")[2::WORDS]

    @contextlib.contextmanager
    def request(self):
        """Counts a request in flight on this worker for the duration of the block."""
        self._requests[self.slot] += 1
        try:
            yield
        finally:
            self._ended[self.slot] = time.monotonic()  # first: no worker sees this one quiet before it is
            self._requests[self.slot] -= 1

    def alone(self) -> bool:
        """Whether this worker holds one request and every other has held none for QUIET_S."""
        if self._requests[self.slot] != 1 or sum(self._requests) != 1:  # counts are never below 0
            return False
        quiet, ended = time.monotonic() - QUIET_S, self._ended
        return max(ended[: self.slot], default=quiet) <= quiet and max(ended[self.slot + 1 :], default=quiet) <= quiet


@cache
def this_worker() -> Board | None:
    """This process's slot on the board when the serving process made one (shared_board), else None; None with a
    warning when the board cannot be used (lone requests then keep the worker's share of the cores)."""
    path = os.environ.get(BOARD)
    if not path:
        return None
    try:
        return Board(Path(path))
    except (OSError, RuntimeError) as exc:
        log.warning("the workers' board %s cannot be used (%s): a lone request runs on this worker's share", path, exc)
        return None


class Home:
    """This worker's serving threads (its event loop's and its batchers', `keep`) on one core, its home,
    while it serves a request alone on the server; under load, every thread of the worker on every core
    it may use.

    A lone request crosses between those threads twice: to the batching thread and, answered, back to
    the event loop; each time one thread wakes the other. Waking a thread on another core that sleeps
    costs an interrupt between cores, which a virtual machine's hypervisor delivers, where on the same
    core it is a switch from the thread that goes on to wait (benchmarks/cpu_profile.py measures both).
    Under load the threads rarely wait, and the loop and the batcher of a worker each want a core, so
    they are let go. The lone run's other threads (the wide session's, ONNX Runtime's own) were started
    before and stay free to take the other cores. A thread started while the worker serves alone (a
    thread-pool thread preparing a large picture) starts on the home core too, and goes back to every core
    with the others. Homes follow the board's slots, so two workers have different homes while there are
    cores enough. Nothing is pinned on one core, nor where a CPU quota allows fewer cores than the affinity
    names (a container's `--cpus` on a larger host): there the kernel chooses among cores that other tenants
    may be using. Should the kernel refuse an affinity (the cpuset changed under the worker), the worker
    stops pinning and says so once.
    """

    def __init__(self, slot: int):
        self.cores = frozenset(os.sched_getaffinity(0))
        ordered = sorted(self.cores)
        self.home = frozenset({ordered[slot % len(ordered)]})
        self.pins = len(ordered) > 1 and available_cores() == len(ordered)
        self.threads: tuple[int, ...] = ()
        self.pinned = False
        self._free: frozenset[str] = frozenset()  # the worker's threads as it pinned: on every core meanwhile

    def keep(self, threads: list[int]) -> None:
        """The native ids of the threads that carry a request: the event loop's and the batchers'."""
        self.threads = tuple(threads)

    def settle(self, alone: bool) -> None:
        """Pin the kept threads to the home core when the worker serves alone, else let them, and the threads
        started while they were pinned (which inherit the home), run on every core again. The others were never
        pinned and are left alone: a worker's sessions hold dozens of threads on many cores, and a worker whose
        requests come one by one settles at most of them."""
        if alone == self.pinned or not self.pins or not self.threads:
            return
        if alone:
            self._free = frozenset(os.listdir("/proc/self/task"))
            threads = self.threads
        else:
            threads = (*self.threads, *(int(tid) for tid in set(os.listdir("/proc/self/task")) - self._free))
        try:
            for tid in threads:
                with contextlib.suppress(ProcessLookupError):  # a thread that has ended meanwhile
                    os.sched_setaffinity(tid, self.home if alone else self.cores)
        except OSError as exc:  # the kernel refuses the cores (the cpuset changed): the kernel's choice from now on
            log.warning("this worker's threads cannot be moved between cores (%s): it stops pinning them", exc)
            self.pins = False
            return
        self.pinned = alone
