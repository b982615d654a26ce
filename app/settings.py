"""Service settings, read from the environment with the prefix CAPSNET_ (e.g. CAPSNET_MAX_BATCH=32).

List settings take JSON or a comma list: CAPSNET_PROVIDERS=CPUExecutionProvider,
CAPSNET_CORS_ORIGINS='["http://localhost:7860"]'. Bad values stop start-up with a message
(full-stack-fastapi-template's "typed settings that fail loudly").
"""

import ctypes
import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

import onnxruntime as ort
from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from model import contract

DEFAULT_PROVIDERS = ["CUDAExecutionProvider", "CPUExecutionProvider"]
MB = 1024 * 1024
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "QUOTA PERIOD" or "max PERIOD" (docker --cpus)
MAX_WORKERS = 256  # the most workers a server runs
# the most a server runs on one GPU by default: on an H200 with 8 cores for the server, four answered `?include=`
# 1.3-1.6 times what eight did at 64 clients, 3.5-4.6 times one (docs/benchmarks.md#serving-on-a-gpu)
GPU_WORKERS = 4


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a cpuset), capped by a cgroup v2 CPU
    quota rounded up (`docker run --cpus 2.5` gives 3)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()
    except (OSError, ValueError):
        return cores
    return cores if quota == "max" else max(1, min(cores, math.ceil(int(quota) / int(period))))


def cuda_devices() -> int:
    """CUDA devices the NVIDIA driver reports; 0 without a driver or a GPU.

    cuInit and cuDeviceGetCount from libcuda through ctypes: a probe that needs no CUDA toolkit and
    runs before onnxruntime's CUDA loader, which logs an ERROR for every library it cannot load.
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def default_workers(providers: list[str]) -> int:
    """Server processes by default: one per available core (most of a request's CPU time is a worker's Python:
    HTTP, preprocessing, the answer, about one core at most; benchmarks/serve_bench.py measures one worker
    beside several), at most MAX_WORKERS; at most GPU_WORKERS where the providers will run on CUDA (asked for,
    in this onnxruntime build, and a device usable): each worker holds a CUDA context and they take turns on
    the GPU."""
    workers = min(available_cores(), MAX_WORKERS)
    cuda = "CUDAExecutionProvider"
    if cuda in providers and cuda in ort.get_available_providers() and cuda_devices():
        return min(workers, GPU_WORKERS)
    return workers


def _split_list(value):
    """'a,b' or '["a", "b"]' -> ['a', 'b']; lists pass through."""
    if isinstance(value, str):
        value = value.strip()
        if value.startswith("["):
            return json.loads(value)
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CAPSNET_", env_ignore_empty=True, extra="ignore")

    # --- model and execution ---------------------------------------------------------------------
    # the models to serve, each NAME (a shipped model: contract.SHIPPED) or NAME=DIR (a folder holding
    # capsnet.onnx, decoder.onnx and capsnet.json, as training/export.py writes it)
    models: Annotated[list[str], NoDecode] = Field(default_factory=lambda: list(contract.SHIPPED))
    default_model: str = Field(
        default="mnist",
        description="the model of /predict and /reconstruct without ?model= "
        "(the first of models when mnist is not served and this is not set)",
    )
    providers: Annotated[list[str], NoDecode] = Field(default_factory=lambda: list(DEFAULT_PROVIDERS))
    # fp32: capsnet.onnx; int8: capsnet.int8.onnx (training/quantize.py); auto: int8 when the model runs
    # on the CPU and its card ships the int8 graph (as accurate to 0.05 points, and faster), else fp32
    precision: Literal["auto", "fp32", "int8"] = "auto"
    intra_op_threads: int = Field(
        default=0,
        ge=0,
        description="ONNX Runtime intra-op threads per session; 0 = its default with one worker, "
        "else the available cores divided between the workers (a single image alone on the server, of the "
        "default model: all of them)",
    )
    # ORT's CPU threads busy-wait between runs by default; in a server they would starve the event
    # loop and the image decoding threads of the same cores, so they sleep unless this is set
    intra_op_spinning: bool = False
    cuda_graph: bool = Field(
        default=True,
        description="on CUDA, a single image runs as a CUDA graph of the model folded for batch 1, replayed "
        "(app/cuda_graph.py; a graph ONNX Runtime cannot capture leaves plain runs, with a warning); "
        "elsewhere it does nothing",
    )
    # --- dynamic batching (Triton's max_batch_size / max_queue_delay) ----------------------------
    max_batch: int = Field(default=64, ge=1, le=1024, description="1 turns batching off")
    max_wait_ms: float = Field(default=2.0, ge=0.0, le=1000.0)
    max_queue: int = Field(default=1024, ge=1)
    request_deadline_s: float = Field(
        default=30.0,
        gt=0,
        description="a request still waiting for the model "
        "after this long answers 504 (and is dropped if it has not run)",
    )
    # --- request limits --------------------------------------------------------------------------
    max_body_bytes: int = Field(default=5 * MB, ge=1024)
    max_pixels: int = Field(default=contract.MAX_PIXELS, ge=1024)
    max_reconstruct_batch: int = Field(default=256, ge=1, le=4096)
    # --- HTTP server -----------------------------------------------------------------------------
    workers: int = Field(
        default_factory=lambda data: default_workers(data.get("providers", DEFAULT_PROVIDERS)),
        ge=1,
        le=MAX_WORKERS,
        description="server processes, each with its own engines and batchers (default: one per available core, "
        f"at most {MAX_WORKERS}, and at most {GPU_WORKERS} where they run on CUDA)",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    host: str = "127.0.0.1"  # 0.0.0.0 in a container
    port: int = Field(default=8000, ge=1, le=65535)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    shutdown_timeout_s: float = Field(
        default=20.0, gt=0, description="graceful shutdown: in-flight requests finish first"
    )
    read_deadline_s: float = Field(
        default=30.0,
        gt=0,
        description="a request's head and body must arrive within this long of its first byte; "
        "a slower client is answered 408 and its connection closed",
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        description="connections and requests one worker holds at most (uvicorn's limit_concurrency); "
        "a request beyond them is answered 503",
    )
    # above the idle timeouts of common load balancers (AWS ALB and GCP's 60 s, nginx upstream 60 s), so
    # that the balancer, not the server, closes an idle connection and never sends on a closing one
    keep_alive_s: int = Field(default=75, ge=1, description="HTTP keep-alive timeout of idle connections")

    @field_validator("providers", "cors_origins", "models", mode="before")
    @classmethod
    def _lists(cls, value):
        return _split_list(value)

    @field_validator("providers")
    @classmethod
    def _known_providers(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("name at least one ONNX Runtime execution provider")
        unknown = [p for p in value if p not in ort.get_all_providers()]
        if unknown:
            raise ValueError(f"unknown execution provider(s) {unknown}; ONNX Runtime knows {ort.get_all_providers()}")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value):
        return value.lower() if isinstance(value, str) else value

    @property
    def model_dirs(self) -> dict[str, Path]:
        """Served model name -> its folder, in the order of `models`."""
        return dict(contract.model_folder(entry) for entry in self.models)

    @property
    def session_threads(self) -> int:
        """Intra-op threads of each ONNX Runtime session: intra_op_threads when set; else ONNX Runtime's
        default (0) in one process, and the available cores divided between the workers in several."""
        if self.intra_op_threads or self.workers == 1:
            return self.intra_op_threads
        return max(1, available_cores() // self.workers)

    @property
    def lone_request_threads(self) -> int:
        """Intra-op threads of the default model's session for a single image alone on the server, on the CPU
        (app/cores.py): every available core where there are several and intra_op_threads is unset, else 0:
        no such session (nor for one worker whose sessions spin already: they have every core)."""
        if self.intra_op_threads or (self.workers == 1 and self.intra_op_spinning):
            return 0
        cores = available_cores()
        return cores if cores > 1 else 0

    @model_validator(mode="after")
    def _model_files_exist(self) -> "Settings":
        if not self.models:
            raise ValueError("name at least one model to serve (models: " + ", ".join(contract.SHIPPED) + ")")
        names = [contract.model_folder(entry)[0] for entry in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models names a model twice: {names}")
        for name, folder in self.model_dirs.items():
            for file in (contract.CAPSNET_ONNX, contract.DECODER_ONNX, contract.MODEL_CARD):
                if not (folder / file).is_file():
                    raise ValueError(
                        f"model {name}: {folder} has no {file} (export one with `python -m training.export`)"
                    )
            if self.precision == "int8" and not (folder / contract.CAPSNET_INT8_ONNX).is_file():
                raise ValueError(
                    f"precision int8 needs {folder / contract.CAPSNET_INT8_ONNX} for model {name} "
                    "(make it with `python -m training.quantize`); use precision auto or fp32, "
                    "or serve only the models that have one"
                )
        if self.default_model not in names:
            if "default_model" in self.model_fields_set:
                raise ValueError(f"default_model {self.default_model!r} is not among the served models {names}")
            self.default_model = names[0]
        return self


@lru_cache
def get_settings() -> Settings:
    return Settings()
