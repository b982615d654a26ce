"""A single image's run replayed as a CUDA graph (ONNX Runtime's enable_cuda_graph), for a model on CUDA.

At batch 1 a GPU waits on kernel launches: the CapsNet graph's hundred-odd small kernels take longer to
launch than to run. A CUDA graph launches them as one. ONNX Runtime captures one for a session whose every
node runs on CUDA, with its input and outputs bound to fixed device buffers, and replays it from then on. A
captured graph has one shape, so the session runs the graph folded for batch 1 (fold): its batch axis fixed
and its constants folded until nothing more folds, which leaves none of the shape arithmetic (Shape,
ConstantOfShape, Range) that the CUDA provider would run on the CPU. benchmarks/run_binding.py times it
beside session.run; app/engine.py runs a single image through it when Settings.cuda_graph is set, and on the
CPU runs a lone request's single image on the graph folded for batch 1 (no CUDA graph there).
"""

import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from model import contract

FOLDING_PASSES = 5  # at most; the shipped graphs stop changing after two


def fold(graph: Path | bytes, batch: int | None) -> bytes:
    """graph (an ONNX file, or its bytes) with its batch axis fixed to `batch` (None: left free) and its
    constants folded until nothing more folds: ONNX Runtime's basic optimiser (provider-independent, run on
    the CPU), its result fed back to it until it stops changing. The first pass folds the shape arithmetic
    that the fixed batch makes constant; the second folds what the first cannot see as constant yet (the
    exporter's CastLike nodes, which it inlines as Casts of constants after folding, the Range they feed,
    and the first routing iteration's softmax of zero logits); a third changes nothing in the shipped
    graphs."""
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.log_severity_level = 3  # the optimiser's warnings about CastLike, as app/engine.py
        options.intra_op_num_threads = 1  # it only rewrites the graph: no thread pool of every core per pass
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        if batch is not None:
            options.add_free_dimension_override_by_name(contract.BATCH, batch)
        options.optimized_model_filepath = str(Path(tmp) / "folded.onnx")
        model = graph if isinstance(graph, bytes) else str(graph)
        for _ in range(FOLDING_PASSES):
            ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            folded = Path(options.optimized_model_filepath).read_bytes()
            if folded == model:
                break
            model = folded
        return folded


class CudaGraph:
    """Runs of a graph of one batch size (fold's) on fixed buffers of the provider's device: its input and every
    output bound to buffers that never move (the outputs `names` copied back), replayed as a CUDA graph
    (`capture`, on CUDA; without it the same bound runs, which is how the CPU tests them). ONNX Runtime keeps
    a CUDA graph per thread and captures it on that thread's first runs, raising from one of them when it
    cannot (a node on the CPU): one thread runs it, and nothing else of the process may run on the GPU while
    it captures.

    Args:
        model: the serialized graph, its batch axis fixed (fold).
        names: the outputs to fetch (contract.CAPSNET_OUTPUTS).
        provider: an execution provider's name, and its options.
        capture: enable_cuda_graph (CUDA only).
    """

    def __init__(self, model: bytes, names: list[str], provider: tuple[str, dict], capture: bool = True):
        name, options = provider
        if capture:
            options = {**options, "enable_cuda_graph": "1"}
        settings = ort.SessionOptions()
        settings.log_severity_level = 2 if capture else 3  # on a GPU, the nodes it leaves on the CPU are warned of
        self.session = ort.InferenceSession(model, settings, providers=[(name, options)])
        if (used := self.session.get_providers()[0]) != name:  # ONNX Runtime's fallback when a provider cannot start
            raise RuntimeError(f"the session runs on {used}; a CUDA graph needs it on {name}")
        device = "cuda" if name == "CUDAExecutionProvider" else "cpu"
        self._on_cpu = device == "cpu"
        image = self.session.get_inputs()[0]
        self._input = ort.OrtValue.ortvalue_from_shape_and_type(image.shape, np.float32, device, 0)
        self._binding = self.session.io_binding()
        self._binding.bind_ortvalue_input(contract.IMAGE, self._input)
        outputs = {}
        for output in self.session.get_outputs():  # every output on a fixed buffer, so that no run allocates one
            outputs[output.name] = ort.OrtValue.ortvalue_from_shape_and_type(output.shape, np.float32, device, 0)
            self._binding.bind_ortvalue_output(output.name, outputs[output.name])
        self._fetched = [outputs[name] for name in names]

    def run(self, images: np.ndarray) -> list[np.ndarray]:
        """images (batch, 1, size, size) float32 -> the outputs `names` as numpy arrays of their own (a replay
        overwrites the buffers)."""
        self._input.update_inplace(np.ascontiguousarray(images, np.float32))
        self.session.run_with_iobinding(self._binding)
        if self._on_cpu:  # numpy() of a CPU buffer is a view of it
            return [value.numpy().copy() for value in self._fetched]
        return [value.numpy() for value in self._fetched]  # numpy() copies a device's buffer to the host
