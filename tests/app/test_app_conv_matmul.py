"""Long convolutions as matrix products of their patches (app/conv_matmul.py): PrimaryCaps' alone is rewritten,
the outputs are the convolution's to float32's rounding, folded for one image or with the batch axis free, and
the engine's CUDA graph replays the rewritten graph."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app import engine as engine_module
from app.conv_matmul import conv_as_matmul
from app.cuda_graph import fold
from app.engine import Engine
from app.settings import Settings
from model import contract

GRAPH = contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX
NAMES = list(contract.CAPSNET_OUTPUTS)


def run(graph: bytes, images: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(graph, providers=["CPUExecutionProvider"]).run(NAMES, {contract.IMAGE: images})


def ops(graph: bytes) -> list[str]:
    return [node.op_type for node in onnx.load_model_from_string(graph).graph.node]


@pytest.fixture
def images(mnist_fixture) -> np.ndarray:
    return mnist_fixture[0][:3, None].astype(np.float32) / 255


def test_the_primary_capsules_convolution_alone_becomes_a_matmul_of_its_patches(images):
    """PrimaryCaps' 9x9 stride-2 convolution (dot products of 256 x 81) becomes Gather + MatMul; conv1's (81 long)
    stays a convolution; its weights go, the matrix made of them stays; the outputs agree to float32's rounding."""
    folded = fold(GRAPH, 1)
    rewritten = conv_as_matmul(folded)
    assert ops(folded).count("Conv") == 2
    assert ops(rewritten).count("Conv") == 1 and ops(rewritten).count("Gather") == 1
    weights = {w.name: w for w in onnx.load_model_from_string(rewritten).graph.initializer}
    assert "model.primary.conv.weight" not in weights
    (matrix,) = [w for name, w in weights.items() if name.endswith("_weight")]
    assert list(matrix.dims) == [256 * 9 * 9, 256]  # (C kh kw, O)
    for image in images:
        for got, want in zip(run(rewritten, image[None]), run(folded, image[None]), strict=True):
            np.testing.assert_allclose(got, want, atol=1e-5)  # one long sum in another order


def test_the_batch_axis_may_stay_free(images):
    """The served graph folded with its batch axis free (its weights' casts computed, as ONNX Runtime does as it
    loads a graph): one rewrite answers a batch of three and of one."""
    whole = GRAPH.read_bytes()
    rewritten = conv_as_matmul(fold(whole, None))
    assert ops(rewritten).count("Conv") == 1
    for batch in (images, images[:1]):
        for got, want in zip(run(rewritten, batch), run(whole, batch), strict=True):
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_convolution_shorter_than_the_bound_stays():
    folded = fold(GRAPH, 1)
    assert ops(conv_as_matmul(folded, min_reduction=10**6)) == ops(folded)


def test_the_engines_cuda_graph_replays_the_rewritten_graph(monkeypatch, images):
    """On CUDA the engine replays a single image through the graph folded for one image with PrimaryCaps'
    convolution a matmul (the session's provider and the CudaGraph stood in for here, on the CPU)."""
    made = []

    class Recorder:
        def __init__(self, model: bytes, names: list[str], provider: tuple[str, dict]):
            made.append((model, names, provider[0]))

    settings = Settings(
        models=["mnist"], workers=1, providers=["CPUExecutionProvider"], cuda_graph=False, precision="fp32"
    )
    engine = Engine("mnist", contract.SHIPPED["mnist"], settings)
    monkeypatch.setattr(engine_module, "CudaGraph", Recorder)
    monkeypatch.setattr(engine.capsnet, "get_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert isinstance(engine._cuda_graph(), Recorder)
    ((model, names, provider),) = made
    assert provider == "CUDAExecutionProvider" and names == NAMES
    assert ops(model).count("Conv") == 1 and "MatMul" in ops(model)
    for got, want in zip(run(model, images[:1]), run(GRAPH.read_bytes(), images[:1]), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("fails", ["rewrite", "session"])
def test_the_engines_cuda_graph_replays_the_folded_graph_where_the_rewrite_fails(monkeypatch, caplog, fails):
    """A graph onnx cannot rewrite, or whose rewrite ONNX Runtime makes no CUDA graph's session of, still has its
    single images replayed as a CUDA graph: of the graph folded for one image, its convolutions as they are."""
    made = []

    class Recorder:
        def __init__(self, model: bytes, names: list[str], provider: tuple[str, dict]):
            if fails == "session" and ops(model).count("Conv") == 1:  # the rewrite's
                raise RuntimeError("no session of this graph")
            made.append(model)

    def no_rewrite(graph: bytes) -> bytes:
        raise ValueError("this graph cannot be rewritten")

    settings = Settings(
        models=["mnist"], workers=1, providers=["CPUExecutionProvider"], cuda_graph=False, precision="fp32"
    )
    engine = Engine("mnist", contract.SHIPPED["mnist"], settings)
    monkeypatch.setattr(engine_module, "CudaGraph", Recorder)
    if fails == "rewrite":
        monkeypatch.setattr(engine_module, "conv_as_matmul", no_rewrite)
    monkeypatch.setattr(engine.capsnet, "get_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert isinstance(engine._cuda_graph(), Recorder)
    assert [ops(model) for model in made] == [ops(fold(GRAPH, 1))]
    assert "replays the folded graph, its convolutions as they are" in caplog.text
