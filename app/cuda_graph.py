"""A single image's run replayed as a CUDA graph (ONNX Runtime's enable_cuda_graph), for a model on CUDA.

At batch 1 a GPU waits on kernel launches: the CapsNet graph's hundred-odd small kernels take longer to
launch than to run. A CUDA graph launches them as one. ONNX Runtime captures one for a session whose every
node runs on CUDA, with its input and outputs bound to fixed device buffers, and replays it from then on. A
captured graph has one shape, so the session runs the graph folded for batch 1 (fold): its batch axis fixed
and its constants folded until nothing more folds, which leaves none of the shape arithmetic (Shape,
ConstantOfShape, Range) that the CUDA provider would run on the CPU. benchmarks/run_binding.py times it
beside session.run; app/engine.py runs a single image through it when Settings.cuda_graph is set.
"""

import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from model import contract

FOLDING_PASSES = 5  # at most; the shipped graphs stop changing after two


def fold(graph: Path, batch: int) -> bytes:
    """graph (an ONNX file) with its batch axis fixed to `batch` and its constants folded until nothing more
    folds: ONNX Runtime's basic optimiser (provider-independent, run on the CPU), its result fed back to it
    until it stops changing. The first pass folds the shape arithmetic that the fixed batch makes constant;
    the second folds what the first could not see as constant yet (the exporter's CastLike nodes, which it
    inlines as Casts of constants after folding, the Range they feed, and the first routing iteration's
    softmax of zero logits); a third changes nothing in the shipped graphs."""
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.log_severity_level = 3  # the optimiser's warnings about CastLike, as app/engine.py
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.add_free_dimension_override_by_name(contract.BATCH, batch)
        options.optimized_model_filepath = str(Path(tmp) / "folded.onnx")
        model: str | bytes = str(graph)
        for _ in range(FOLDING_PASSES):
            ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            folded = Path(options.optimized_model_filepath).read_bytes()
            if folded == model:
                break
            model = folded
        return folded


class CudaGraph:
    """A batch's run of graph on fixed buffers of the provider's device: the graph folded for that batch size,
    its input and every output bound to buffers that never move (the outputs `names` copied back), replayed
    as a CUDA graph (`capture`, on CUDA; without it the same bound run, which is how the CPU tests it). ONNX
    Runtime captures the graph on the first runs and raises from the session or its first run when it cannot
    (a node on the CPU). Not thread-safe: one thread runs it (an engine's batcher).

    Args:
        graph: the CapsNet ONNX file.
        names: the outputs to fetch (contract.CAPSNET_OUTPUTS).
        provider: an execution provider's name, and its options.
        batch: the images of every run (an engine's: 1).
        capture: enable_cuda_graph (CUDA only).
    """

    def __init__(self, graph: Path, names: list[str], provider: tuple[str, dict], batch: int = 1, capture: bool = True):
        name, options = provider
        if capture:
            options = {**options, "enable_cuda_graph": "1"}
        settings = ort.SessionOptions()
        settings.log_severity_level = 3
        self.session = ort.InferenceSession(fold(graph, batch), settings, providers=[(name, options)])
        device = "cuda" if name == "CUDAExecutionProvider" else "cpu"
        image = self.session.get_inputs()[0]
        self._input = ort.OrtValue.ortvalue_from_shape_and_type(image.shape, np.float32, device, 0)
        self._binding = self.session.io_binding()
        self._binding.bind_ortvalue_input(contract.IMAGE, self._input)
        outputs = self.session.get_outputs()
        for output in outputs:  # every output on a fixed buffer, so that no run allocates one
            buffer = ort.OrtValue.ortvalue_from_shape_and_type(output.shape, np.float32, device, 0)
            self._binding.bind_ortvalue_output(output.name, buffer)
        order = [output.name for output in outputs]
        self._fetched = [order.index(name) for name in names]

    def run(self, images: np.ndarray) -> list[np.ndarray]:
        """images (batch, 1, size, size) float32 -> the outputs `names`, copied to numpy (a replay overwrites
        the buffers)."""
        self._input.update_inplace(np.ascontiguousarray(images, np.float32))
        self.session.run_with_iobinding(self._binding)
        outputs = self._binding.copy_outputs_to_cpu()
        return [outputs[i] for i in self._fetched]
