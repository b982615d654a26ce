"""The served graph's session.run four ways, by batch: plain, with I/O binding, on a folded graph of one batch
size, and replayed as a CUDA graph; and the folded graph in fp16, and its CUDA graph under other options.

$ python -m benchmarks.run_binding                       # CUDA where onnxruntime-gpu has a device, else CPU
$ python -m benchmarks.run_binding --provider CPUExecutionProvider --batches 1 --runs 20 --out r.json

  run          session.run with numpy in and out, as app/engine.py runs it
  conv as matmul  session.run of the graph with PrimaryCaps' convolution as one matrix product of its patches
               (app/conv_matmul.py), its batch axis free as the batcher's sessions run it
  binding      I/O binding: the input bound from numpy, the outputs bound on the provider's device and
               copied back to numpy after the run (the host needs them to write the answer)
  fixed batch  session.run of app/cuda_graph.py's fold(): the graph with its batch axis fixed to the
               batch's size, its constants folded by ONNX Runtime's basic optimiser until nothing more
               folds (the report gives each graph's nodes; on a GPU each node is a kernel launch).
  fixed batch, fp16  the same graph with its weights and arithmetic in fp16, its input and outputs float32
               (ONNX Runtime's converter, `half`): what half precision costs the outputs (the last column)
  fixed batch, conv as matmul  the folded graph with that convolution as a matrix product: how a GEMM
               library's split of its long dot products compares with the convolution's kernel, at a batch
               too small to fill the device otherwise
  cuda graph   (CUDA only) app/cuda_graph.py's CudaGraph, the engine's replay of a single image
               (Settings.cuda_graph), of the folded graph: the provider's enable_cuda_graph (a captured
               graph has one shape), input and outputs bound to fixed device buffers, the graph captured after
               ONNX Runtime's first runs and replayed from then on; the input copied in place and the outputs
               copied back each run. ONNX Runtime refuses the capture when a node still runs on the CPU: the
               reason is reported instead of a time, with the nodes its log places on the CPU.
  cuda graph, fp16 / conv as matmul / TF32 / exhaustive search  (CUDA only) the same of the fp16 graph, of
               the graph with its convolution as a matmul (the graph the engine replays), with TF32
               convolutions and matmuls (use_tf32 1), with cuDNN's convolution algorithms timed rather than
               guessed (cudnn_conv_algo_search EXHAUSTIVE): what each would take off a single image's run
Each variant's outputs are compared with plain run's (largest |difference|). Medians of --runs runs after
warm-up, with the service's provider options (app/engine.py's PROVIDER_OPTIONS) unless the variant names
others. Writes benchmarks/results/run_binding.json and .md. Not a test: the figures that matter need a GPU.
"""

import argparse
import contextlib
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.conv_matmul import conv_as_matmul
from app.cuda_graph import CudaGraph, fold
from app.engine import PROVIDER_OPTIONS
from app.settings import cuda_devices
from benchmarks.cpu_profile import median_ms
from benchmarks.report import write_report
from model import contract
from tests.harness import machine

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
NAMES = list(contract.CAPSNET_OUTPUTS)
# the CUDA graph's variants beside the service's own: their provider options over PROVIDER_OPTIONS, the graph
CUDA_VARIANTS = {
    "cuda graph, fp16": ({}, "fp16"),
    "cuda graph, conv as matmul": ({}, "matmul"),
    "cuda graph, TF32": ({"use_tf32": "1"}, "fp32"),
    "cuda graph, exhaustive search": ({"cudnn_conv_algo_search": "EXHAUSTIVE"}, "fp32"),
}


def session(graph: Path | bytes, provider: str, log: int = 3) -> ort.InferenceSession:
    """A session of graph (a file or its bytes) on provider (the service's options); `log`: ONNX Runtime's
    severity (3, errors: as app/engine.py, which leaves out the optimiser's warnings about CastLike; 0:
    verbose, node placements included)."""
    options = PROVIDER_OPTIONS.get(provider, {})
    settings = ort.SessionOptions()
    settings.log_severity_level = log
    model = graph if isinstance(graph, bytes) else str(graph)
    return ort.InferenceSession(model, settings, providers=[(provider, options)] if options else [provider])


PLACED = re.compile(r"(?:Node\(s\)|All nodes) placed on \[(\w+)\]")
NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s{3,}(\S.*)$")


@contextlib.contextmanager
def stderr_into(path: Path):
    """Writes to file descriptor 2 (ONNX Runtime's log, from C++) go to path within the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with path.open("wb") as sink:
            os.dup2(sink.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def placements(graph: Path | bytes, provider: str) -> dict[str, list[str]]:
    """Which provider ONNX Runtime places each node of graph on, read from its verbose log of the session's
    loading (read_placements)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "ort.log"
        with stderr_into(log):
            session(graph, provider, log=0)
        return read_placements(log.read_text(errors="replace").splitlines())


def read_placements(log: list[str]) -> dict[str, list[str]]:
    """ONNX Runtime's "Node placements" lines -> provider -> ["OpType (node name)", ...]; ["all"] for a
    provider that took every node."""
    placed: dict[str, list[str]] = {}
    current = None
    for line in log:
        if header := PLACED.search(line):
            current = header.group(1)
            placed[current] = ["all"] if "All nodes" in line else []
        elif current is not None and (node := NODE.search(line)):
            placed[current].append(node.group(1))
        else:
            current = None
    return placed


def off_provider(graph: bytes, provider: str) -> dict[str, list[str]]:
    """The nodes of graph that ONNX Runtime places on another provider than `provider`, by provider; what
    prevents reading its log, instead of them."""
    try:
        return {other: nodes for other, nodes in placements(graph, provider).items() if other != provider}
    except Exception as exc:
        return {"unread": [" ".join(str(exc).split())]}


def timed(step: Callable[[], list[np.ndarray]], runs: int) -> tuple[float, list[np.ndarray]]:
    """The median ms of `runs` calls of step after warm-up (a CUDA graph is captured there), and its outputs."""
    outputs = step()
    for _ in range(3):
        step()
    return median_ms(step, runs), outputs


def device_of(provider: str) -> str:
    return "cuda" if provider == "CUDAExecutionProvider" else "cpu"


def plain(sess: ort.InferenceSession, x: np.ndarray) -> Callable[[], list[np.ndarray]]:
    return lambda: sess.run(NAMES, {contract.IMAGE: x})


def binding(sess: ort.InferenceSession, x: np.ndarray, device: str) -> Callable[[], list[np.ndarray]]:
    io = sess.io_binding()

    def step() -> list[np.ndarray]:
        io.bind_cpu_input(contract.IMAGE, x)
        for name in NAMES:
            io.bind_output(name, device)
        sess.run_with_iobinding(io)
        return io.copy_outputs_to_cpu()

    return step


def run_of(graph: bytes, provider: str, x: np.ndarray) -> Callable[[], list[np.ndarray]]:
    """session.run of a serialized graph (the folded graph of x's batch, or a rewrite) on provider."""
    return plain(session(graph, provider), x)


def half(graph: bytes) -> bytes:
    """graph with its float weights and arithmetic in fp16, its input and outputs float32 (ONNX Runtime's
    converter, which keeps casts at the graph's edges)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    return convert_float_to_float16(onnx.load_from_string(graph), keep_io_types=True).SerializeToString()


def cuda_graph(graph: bytes, x: np.ndarray, provider: str, options: dict | None = None) -> Callable[[], list]:
    """app/cuda_graph.py's replay of the graph folded for x's batch, as the engine runs a single image (the first
    runs capture it, on this thread, which runs it from then on); `options` over the service's."""
    replay = CudaGraph(graph, NAMES, (provider, {**PROVIDER_OPTIONS.get(provider, {}), **(options or {})}))
    return lambda: replay.run(x)


def node_count(model: Path | bytes) -> int:
    """The nodes of a graph after one pass of ONNX Runtime's basic optimiser."""
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(Path(tmp) / "once.onnx")
        graph = model if isinstance(model, bytes) else str(model)
        ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        return len(onnx.load(options.optimized_model_filepath).graph.node)


def measure(graph: Path, provider: str, batches: list[int], runs: int) -> list[dict]:
    rows = []
    base = session(graph, provider)
    rng = np.random.default_rng(0)
    free_nodes = node_count(graph)
    free_matmul = conv_as_matmul(fold(graph, None))  # its batch axis free, as the batcher's sessions run it
    for batch in batches:
        x = rng.random((batch, 1, contract.IMAGE_SIZE, contract.IMAGE_SIZE), np.float32)
        ms, expected = timed(plain(base, x), runs)
        rows.append({"batch": batch, "variant": "run", "nodes": free_nodes, "p50_ms": ms, "max_abs_diff": 0.0})
        fixed = fold(graph, batch)
        graphs: dict[str, tuple[bytes | None, int | None, str]] = {"fp32": (fixed, node_count(fixed), "")}
        try:
            halved = half(fixed)
            graphs["fp16"] = (halved, node_count(halved), "")
        except Exception as exc:  # the converter's refusal: the fp16 rows say it, the others run
            graphs["fp16"] = (None, None, f"no fp16 graph: {exc}")
        unfolded = conv_as_matmul(fixed)
        graphs["matmul"] = (unfolded, node_count(unfolded), "")
        graphs["free matmul"] = (free_matmul, node_count(free_matmul), "")
        # each variant: the graph it runs (None: the session's own) and how to make its step of that graph
        variants: dict[str, tuple[str | None, Callable[..., Callable[[], list[np.ndarray]]]]] = {
            "binding": (None, partial(binding, base, x, device_of(provider))),
            "conv as matmul": ("free matmul", partial(run_of, provider=provider, x=x)),
            "fixed batch": ("fp32", partial(run_of, provider=provider, x=x)),
            "fixed batch, fp16": ("fp16", partial(run_of, provider=provider, x=x)),
            "fixed batch, conv as matmul": ("matmul", partial(run_of, provider=provider, x=x)),
        }
        if provider == "CUDAExecutionProvider":
            variants["cuda graph"] = ("fp32", partial(cuda_graph, x=x, provider=provider))
            for variant, (options, kind) in CUDA_VARIANTS.items():
                variants[variant] = (kind, partial(cuda_graph, x=x, provider=provider, options=options))
        for variant, (precision, make) in variants.items():
            graph_of, nodes, why = graphs[precision] if precision else (None, free_nodes, "")
            try:
                if precision and graph_of is None:
                    raise RuntimeError(why)
                ms, got = timed(make(graph_of) if precision else make(), runs)
            except Exception as exc:  # ONNX Runtime's refusal is the finding
                error = " ".join(str(exc).split())
                row = {"batch": batch, "variant": variant, "nodes": nodes, "p50_ms": None, "error": error}
                if variant.startswith("cuda graph") and graph_of:  # and the nodes it keeps off the GPU (its log)
                    row["placed_off"] = off_provider(graph_of, provider)
                rows.append(row)
                continue
            diff = max(float(np.abs(a - b).max()) for a, b in zip(got, expected, strict=True))
            rows.append({"batch": batch, "variant": variant, "nodes": nodes, "p50_ms": ms, "max_abs_diff": diff})
    return rows


def markdown(report: dict) -> str:
    lines = [
        f"# session.run, I/O binding, a folded graph and CUDA graphs ({report['device']}, {report['provider']})",
        "",
        f"{report['when']}; {report['graph']}, median of {report['runs']} runs after warm-up. nodes: the graph's "
        "after one pass of ONNX Runtime's basic optimiser (the folded graph's: after every pass).",
        "",
        "| batch | variant | nodes | p50 ms | max abs diff from run |",
        "|---:|---|---:|---:|---:|",
    ]
    for row in report["rows"]:
        figure = row["p50_ms"] if row["p50_ms"] is not None else f"refused: {row['error'][:160]}"
        if row.get("placed_off"):
            figure += "; placed off it: " + "; ".join(f"{p}: {', '.join(n)}" for p, n in row["placed_off"].items())
        cells = [row["batch"], row["variant"], row["nodes"], figure, row.get("max_abs_diff", "")]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run_binding", description=__doc__.splitlines()[0])
    p.add_argument("--provider", help="default: CUDAExecutionProvider where a device is, else CPUExecutionProvider")
    p.add_argument("--model-dir", type=Path, default=contract.SHIPPED["mnist"])
    p.add_argument("--batches", default="1,64", help="comma list")
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--out", type=Path, default=RESULTS / "run_binding.json", help="the JSON (and its .md beside it)")
    args = p.parse_args(argv)
    on_cuda = "CUDAExecutionProvider" in ort.get_available_providers() and cuda_devices() > 0
    provider = args.provider or ("CUDAExecutionProvider" if on_cuda else "CPUExecutionProvider")
    if provider == "CUDAExecutionProvider" and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    graph = args.model_dir / contract.CAPSNET_ONNX  # fp32: the graph a GPU serves
    used = session(graph, provider).get_providers()[0]
    if used != provider:
        sys.exit(f"the session runs on {used}, not on {provider}, the provider asked for")
    report = {
        "device": machine(),
        "provider": provider,
        "graph": f"{args.model_dir.name}/{graph.name}",
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "runs": args.runs,
        "rows": measure(graph, provider, [int(b) for b in args.batches.split(",")], args.runs),
    }
    write_report(args.out, report, markdown(report))
    return report


if __name__ == "__main__":
    main()
