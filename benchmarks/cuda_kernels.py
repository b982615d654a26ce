"""Where a single image's CUDA graph spends the GPU's time: the kernels and copies it runs, by name, from
PyTorch's profiler (CUPTI records every kernel of the process, ONNX Runtime's included).

$ python3 -m benchmarks.cuda_kernels --out $OUT/cuda_kernels.json    # on a GPU, with PyTorch (the GPU machine's)

The served fp32 graph folded for batch 1 (app/cuda_graph.py's fold), PrimaryCaps' convolution a matmul of its
patches (app/conv_matmul.py), replayed as the engine replays a single image (CudaGraph, the service's
provider options), beside the folded graph as it is, under TF32 and in fp16 (benchmarks/run_binding.py's
variants). For each: the replay's median wall time after warm-up (the capture
included), then --runs replays under the profiler, and per name (a kernel, a copy or a memset) its launches
and GPU µs per replay. The sum of their µs beside the wall time tells a run bound by its kernels from one
bound by the gaps between them (launches, the host); a profiler that sees none says so. Writes
benchmarks/results/cuda_kernels.json and .md. Not a test; without CUDA it says so and exits.
"""

import argparse
import collections
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from app.conv_matmul import conv_as_matmul
from app.cuda_graph import fold
from app.settings import cuda_devices
from benchmarks.report import write_report
from benchmarks.run_binding import CUDA_VARIANTS, cuda_graph, half, timed
from model import contract
from tests.harness import machine

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
PROVIDER = "CUDAExecutionProvider"
VARIANTS = ("cuda graph, conv as matmul", "cuda graph", "cuda graph, TF32", "cuda graph, fp16")
GRAPHS = {"fp32": lambda g: g, "fp16": half, "matmul": conv_as_matmul}  # each variant's graph from the folded one
SHOWN = 15  # names a variant's table lists, the longest first
NAME_CHARS = 90  # cuDNN's and cuBLAS's kernel names are long templates


def kernel_table(kernels: Iterable[tuple[str, float]], runs: int) -> dict:
    """(name, µs) of every kernel and copy the profiler saw over `runs` replays -> the GPU µs per replay, and
    per name its launches and µs per replay, the longest first."""
    launches: collections.Counter[str] = collections.Counter()
    micros: collections.defaultdict[str, float] = collections.defaultdict(float)
    for name, us in kernels:
        launches[name] += 1
        micros[name] += us
    rows = [
        {"kernel": name, "launches": launches[name] / runs, "us": round(micros[name] / runs, 2)}
        for name in sorted(micros, key=micros.__getitem__, reverse=True)
    ]
    return {"gpu_us": round(sum(micros.values()) / runs, 2), "kernels": rows}


def profiled(step: Callable[[], object], runs: int, device: str = "CUDA") -> list[tuple[str, float]]:
    """(name, µs) of each event on `device` (torch.autograd.DeviceType's name) during `runs` calls of step: on
    CUDA each kernel, memory copy and set that the GPU ran."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:  # PyTorch's own ops: none
        for _ in range(runs):
            step()  # done when it returns: its outputs are copied back to the host
    kind = getattr(torch.autograd.DeviceType, device)
    return [(event.name, event.time_range.elapsed_us()) for event in prof.events() if event.device_type == kind]


def measure(graph: Path, runs: int) -> list[dict]:
    x = np.random.default_rng(0).random((1, 1, contract.IMAGE_SIZE, contract.IMAGE_SIZE), np.float32)
    fixed = fold(graph, 1)
    rows: list[dict] = []
    for variant in VARIANTS:
        options, precision = CUDA_VARIANTS.get(variant, ({}, "fp32"))
        try:
            step = cuda_graph(GRAPHS[precision](fixed), x, PROVIDER, options)
            wall, _ = timed(step, runs)  # its warm-up runs capture the graph, as the engine's do
            seen = profiled(step, runs)
            if not seen:
                raise RuntimeError("PyTorch's profiler saw no kernel of ONNX Runtime's on the GPU")
            table = kernel_table(seen, runs)
        except Exception as exc:  # a refused capture, or a profiler that cannot start or see: the finding
            rows.append({"variant": variant, "error": " ".join(str(exc).split())})
            continue
        rows.append({"variant": variant, "wall_ms": wall, **table})
    return rows


def markdown(report: dict) -> str:
    lines = [
        f"# The kernels of a single image's CUDA graph ({report['device']})",
        "",
        f"{report['when']}; {report['graph']} folded for batch 1, replayed (app/cuda_graph.py); wall: the median "
        f"replay, input copy and outputs' copies back included; GPU: the µs of its kernels and copies per replay, "
        f"from PyTorch's profiler over {report['runs']} replays.",
    ]
    for row in report["rows"]:
        lines += ["", f"## {row['variant']}", ""]
        if "error" in row:
            lines.append(f"No figures: {row['error'][:300]}")
            continue
        lines += [
            f"Wall {row['wall_ms']} ms a replay; on the GPU {row['gpu_us']} µs, "
            f"{sum(k['launches'] for k in row['kernels']):g} kernels and copies.",
            "",
            "| kernel or copy | launches a replay | µs a replay |",
            "|---|---:|---:|",
        ]
        for kernel in row["kernels"][:SHOWN]:
            lines.append(f"| `{kernel['kernel'][:NAME_CHARS]}` | {kernel['launches']:g} | {kernel['us']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cuda_kernels", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=contract.SHIPPED["mnist"])
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--out", type=Path, default=RESULTS / "cuda_kernels.json", help="the JSON (and its .md beside it)")
    args = p.parse_args(argv)
    import onnxruntime as ort

    if PROVIDER not in ort.get_available_providers() or cuda_devices() == 0:
        sys.exit("benchmarks.cuda_kernels profiles a CUDA graph: it needs onnxruntime-gpu and a CUDA device")
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    graph = args.model_dir / contract.CAPSNET_ONNX  # fp32: the graph a GPU serves
    report = {
        "device": machine(),
        "graph": f"{args.model_dir.name}/{graph.name}",
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "runs": args.runs,
        "rows": measure(graph, args.runs),
    }
    write_report(args.out, report, markdown(report))
    return report


if __name__ == "__main__":
    main()
