"""What a process holds for its ONNX Runtime sessions on the CPU, kept small enough to run several workers.

Four measures, each measured by benchmarks/engine_memory.py (benchmarks/results/engine_memory.md):
- one CPU arena for every session of the process (`share_cpu_arena`): ONNX Runtime's default gives each
  session its own, which keeps the largest working set that session ever ran, so four models held the
  sum of their peaks; a shared one holds about the largest;
- runs of at most `rows_per_run` images (`in_slices`): a CapsNet's working set grows with its votes,
  images x primary capsules x 10 x 16 floats (2.9 MB an image for the 40x40 model, 0.7 MB for MNIST's),
  while per image a run of a few costs the same time as a run of 64;
- no memory pattern: ONNX Runtime would keep, per input shape, one block planned for the whole run. The
  session that runs a lone request's single image (app/cores.py) keeps it: one shape, so one block, and
  each run skips its allocations;
- the heap that loading and warming up freed given back to the system (`release_freed_heap`).
On a GPU, sessions keep ONNX Runtime's defaults: their working set is in GPU memory, and a GPU needs
large batches to be fast.
"""

import ctypes
import ctypes.util
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np
import onnxruntime as ort

from model import contract

# A run on the CPU holds at most the votes of 16 MNIST images (11.8 MB of float32): 16 rows of the 28x28
# models, 5 of the 36x36 one (3,200 primary capsules), 4 of the 40x40 one (4,608). Longer runs hold more
# memory per worker for no more images/s at batch 64 (benchmarks/engine_memory.py, its run-size variants).
RUN_PRIMARY_CAPSULES = 16 * contract.NUM_PRIMARY
USE_SHARED_ARENA = "session.use_env_allocators"  # the session config entry that takes the shared arena
NEXT_POWER_OF_TWO = 0  # ONNX Runtime's default arena extend strategy


@cache
def share_cpu_arena() -> None:
    """Register one CPU arena with ONNX Runtime's environment, for the sessions of this process whose options
    set USE_SHARED_ARENA (once per process)."""
    memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(memory, ort.OrtArenaCfg({"arena_extend_strategy": NEXT_POWER_OF_TWO}))


def configure(options: ort.SessionOptions, one_shape: bool = False) -> None:
    """Options of a session on the CPU: the process's shared arena, and no memory pattern unless the session
    only ever runs `one_shape`."""
    share_cpu_arena()
    options.add_session_config_entry(USE_SHARED_ARENA, "1")
    options.enable_mem_pattern = one_shape


def rows_per_run(primary_capsules: int) -> int:
    """The most images of one session.run on the CPU: those whose votes fit RUN_PRIMARY_CAPSULES, at least one."""
    return max(1, RUN_PRIMARY_CAPSULES // primary_capsules)


def in_slices(run: Callable[[np.ndarray], Sequence[np.ndarray]], x: np.ndarray, rows: int) -> list[np.ndarray]:
    """run(x) in slices of at most `rows` rows along x's first axis, each output concatenated back."""
    if len(x) <= rows:
        return list(run(x))
    parts = [run(x[start : start + rows]) for start in range(0, len(x), rows)]
    return [np.concatenate(outputs) for outputs in zip(*parts, strict=True)]


@cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def release_freed_heap() -> None:
    """Give the free heap back to the system (glibc's malloc_trim; nothing with another C library): loading
    a model frees most of what its graph optimisations allocated, and glibc would keep it."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
