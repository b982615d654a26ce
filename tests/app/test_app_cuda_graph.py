"""A single image replayed as a CUDA graph (app/cuda_graph.py), tested on the CPU: the graph folded for batch 1,
the runs on fixed buffers (what ONNX Runtime captures on CUDA), and which runs an engine sends through it, on
which thread."""

import asyncio
import logging
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from app import engine as engine_module
from app.cuda_graph import CudaGraph, fold
from app.engine import Engine
from app.settings import Settings
from model import contract

GRAPH = contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX
NAMES = list(contract.CAPSNET_OUTPUTS)
CPU = ("CPUExecutionProvider", {})


def plain(images: np.ndarray) -> list[np.ndarray]:
    return ort.InferenceSession(str(GRAPH), providers=["CPUExecutionProvider"]).run(NAMES, {contract.IMAGE: images})


@pytest.fixture
def images(mnist_fixture) -> np.ndarray:
    return mnist_fixture[0][:2, None].astype(np.float32) / 255


def test_the_folded_graph_has_no_shape_arithmetic_and_the_same_outputs(images):
    """ONNX Runtime's basic optimiser, fed its own result until nothing changes, leaves at batch 1 none of the
    nodes its CUDA provider would run on the CPU, and the first routing iteration's softmax of zero logits is
    a constant; one more pass changes nothing."""
    model = fold(GRAPH, 1)
    ops = [node.op_type for node in onnx.load_model_from_string(model).graph.node]
    assert not {"Shape", "ConstantOfShape", "Range"} & set(ops)
    assert ops.count("Softmax") == 2  # of the 3 routing iterations
    assert fold(model, 1) == model
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == [1, 1, contract.IMAGE_SIZE, contract.IMAGE_SIZE]
    for got, want in zip(session.run(NAMES, {contract.IMAGE: images[:1]}), plain(images[:1]), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)  # the same kernels; folding may reorder a float sum


def test_runs_on_fixed_buffers_answer_each_image_with_its_own_outputs(images):
    """Every run overwrites the same bound buffers; what a run returned is its own, which the next leaves alone."""
    graph = CudaGraph(fold(GRAPH, 1), NAMES, CPU, capture=False)
    first = graph.run(images[:1])
    kept = [out.copy() for out in first]
    second = graph.run(images[1:])
    for outputs, image in ((first, images[:1]), (second, images[1:])):
        for got, want in zip(outputs, plain(image), strict=True):
            np.testing.assert_allclose(got, want, atol=1e-5)
    for out, copy in zip(first, kept, strict=True):
        np.testing.assert_array_equal(out, copy)
    assert first[0].argmax() != second[0].argmax()  # two different digits


class Spy:
    """Notes the thread of each run of what it wraps; `fail` makes every run raise instead, as a refused
    capture does."""

    def __init__(self, wrapped, fail: bool = False):
        self.wrapped, self.fail, self.threads = wrapped, fail, []

    def run(self, *args):
        self.threads.append(threading.get_ident())
        if self.fail:
            raise RuntimeError("This session cannot use the graph capture feature as requested")
        return self.wrapped.run(*args)


@pytest.fixture
def replaying(monkeypatch):
    """An engine (mnist, on the CPU) whose single images go through a Spy of a CudaGraph on the CPU, as an
    engine on CUDA with CAPSNET_CUDA_GRAPH would have one; its CapsNet session the same fp32 graph, spied."""

    def make(graph: Spy) -> Engine:
        monkeypatch.setattr(Engine, "_cuda_graph", lambda self: graph)
        settings = Settings(models=["mnist"], workers=1, providers=["CPUExecutionProvider"], cuda_graph=True)
        engine = Engine("mnist", contract.SHIPPED["mnist"], settings)
        engine.capsnet = Spy(ort.InferenceSession(str(GRAPH), providers=["CPUExecutionProvider"]))
        return engine

    return make


def test_an_engine_captures_and_replays_single_images_on_its_batchers_thread(replaying, images):
    """ONNX Runtime keeps a CUDA graph per thread: it is captured on the CapsNet batcher's thread as the batcher
    starts, and only that thread runs it, for a single image of a plain request and nothing else."""
    graph = Spy(CudaGraph(fold(GRAPH, 1), NAMES, CPU, capture=False))
    engine = replaying(graph)
    engine.start_batchers()  # returns once captured
    batcher = engine._capsnet_batcher._thread.ident
    assert graph.threads == [batcher] * engine_module.CUDA_GRAPH_WARM_RUNS
    engine.warm_up()  # here, on this thread: the session alone
    assert len(graph.threads) == engine_module.CUDA_GRAPH_WARM_RUNS

    async def requests():
        one = await engine.predict(images[0, 0])
        both = await engine.predict_many(images[:, 0])  # a batch of two: the session
        await engine.predict(images[0, 0], iterations=True)  # what the graph does not fetch: the session
        return one, both

    try:
        runs = len(engine.capsnet.threads)
        one, both = asyncio.run(requests())
    finally:
        engine.close()
    assert graph.threads == [batcher] * (engine_module.CUDA_GRAPH_WARM_RUNS + 1)
    assert len(engine.capsnet.threads) == runs + 2
    for name in NAMES:
        np.testing.assert_allclose(one[name], both[0][name], atol=1e-5)


def test_a_graph_that_cannot_be_captured_or_replayed_leaves_plain_runs(replaying, images, caplog):
    engine = replaying(Spy(None, fail=True))
    with caplog.at_level(logging.WARNING, logger=engine_module.__name__):
        engine.start_batchers()  # its capture fails
    assert engine.capsnet_graph is None
    assert "no CUDA graph, single images run as batches do" in caplog.text
    engine.warm_up()
    engine.capsnet_graph = Spy(None, fail=True)  # a replay that fails: that image runs plainly, and every later one
    lengths = engine._run_capsnet(images[:1], engine.output_names)[0]
    assert lengths.shape == (1, contract.NUM_CLASSES) and engine.capsnet_graph is None
    engine.close()


def test_an_engine_on_the_cpu_has_no_cuda_graph(caplog):
    settings = Settings(models=["mnist"], workers=1, providers=["CPUExecutionProvider"], cuda_graph=True)
    with caplog.at_level(logging.DEBUG, logger=engine_module.__name__):
        engine = Engine("mnist", contract.SHIPPED["mnist"], settings)
    assert engine.capsnet_graph is None
    assert "model mnist runs on CPUExecutionProvider: no CUDA graph" in caplog.text
    # the setting is on by default: off CUDA it says nothing above debug
    assert not [r for r in caplog.records if "CUDA graph" in r.getMessage() and r.levelno >= logging.INFO]


def test_cuda_graph_is_a_setting_on_by_default(monkeypatch):
    assert Settings().cuda_graph is True
    monkeypatch.setenv("CAPSNET_CUDA_GRAPH", "0")
    assert Settings().cuda_graph is False


@pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(), reason="onnxruntime without CUDA")
@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="a GPU here: the session starts on CUDA")
def test_a_session_that_falls_back_from_cuda_is_refused():
    """ONNX Runtime starts a CUDA session on the CPU when CUDA cannot start: a graph refuses it, naming both."""
    with pytest.raises(
        RuntimeError, match=r"the session runs on CPUExecutionProvider; a CUDA graph needs it on CUDAExecutionProvider"
    ):
        CudaGraph(fold(GRAPH, 1), NAMES, ("CUDAExecutionProvider", {}))
