"""A single image replayed as a CUDA graph (app/cuda_graph.py), tested on the CPU: the graph folded for batch 1,
the run on fixed buffers (what ONNX Runtime captures on CUDA), and which runs an engine sends through it."""

import logging

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


def test_one_pass_of_the_optimiser_leaves_shape_arithmetic(tmp_path):
    """Why fold fixes the batch and passes again: ONNX Runtime's basic optimiser (which runs before a provider
    takes the nodes) folds Shape and ConstantOfShape only with the batch fixed, and leaves a Range on
    constants that the exporter's CastLike hid from it."""

    def ops(batch: int | None) -> set[str]:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(tmp_path / f"{batch}.onnx")
        if batch is not None:
            options.add_free_dimension_override_by_name(contract.BATCH, batch)
        ort.InferenceSession(str(GRAPH), options, providers=["CPUExecutionProvider"])
        return {node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node}

    assert {"Shape", "ConstantOfShape", "Range"} <= ops(None)
    assert "Range" in ops(1) and not {"Shape", "ConstantOfShape"} & ops(1)


def test_the_folded_graph_has_no_shape_arithmetic_and_the_same_outputs(images):
    """ONNX Runtime's basic optimiser, fed its own result until nothing changes, leaves at batch 1 none of the
    nodes its CUDA provider would run on the CPU, and the first routing iteration's softmax of zero logits is
    a constant."""
    model = fold(GRAPH, 1)
    ops = [node.op_type for node in onnx.load_model_from_string(model).graph.node]
    assert not {"Shape", "ConstantOfShape", "Range"} & set(ops)
    assert ops.count("Softmax") == 2  # of the 3 routing iterations
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == [1, 1, contract.IMAGE_SIZE, contract.IMAGE_SIZE]
    for got, want in zip(session.run(NAMES, {contract.IMAGE: images[:1]}), plain(images[:1]), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)  # the same kernels; folding may reorder a float sum


def test_a_run_on_fixed_buffers_answers_each_image_with_its_own_outputs(images):
    """Every run overwrites the same bound buffers; what a run returned is a copy that the next one leaves alone."""
    graph = CudaGraph(GRAPH, NAMES, CPU, capture=False)
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
    """Counts the runs of what it wraps; `fail` makes every run raise instead, as a refused capture does."""

    def __init__(self, wrapped, fail: bool = False):
        self.wrapped, self.fail, self.runs = wrapped, fail, 0

    def run(self, *args):
        self.runs += 1
        if self.fail:
            raise RuntimeError("This session cannot use the graph capture feature as requested")
        return self.wrapped.run(*args)


def test_an_engine_replays_a_single_image_of_a_plain_request_and_nothing_else(images, caplog):
    settings = Settings(models=["mnist"], workers=1, providers=["CPUExecutionProvider"], cuda_graph=True)
    with caplog.at_level(logging.INFO, logger=engine_module.__name__):
        engine = Engine("mnist", contract.SHIPPED["mnist"], settings)
    assert engine.capsnet_graph is None  # the CPU runs the model: it says so
    assert "cuda_graph is set but the model runs on CPUExecutionProvider" in caplog.text
    # CUDA's fp32 graph, its single images on fixed buffers as CUDA would replay them
    graph = engine.capsnet_graph = Spy(CudaGraph(GRAPH, NAMES, CPU, capture=False))
    engine.capsnet = Spy(ort.InferenceSession(str(GRAPH), providers=["CPUExecutionProvider"]))
    engine.warm_up()  # the replays a capture needs, before the first request
    assert graph.runs == engine_module.CUDA_GRAPH_WARM_RUNS
    one = engine._run_capsnet(images[:1], engine.output_names)
    assert graph.runs == engine_module.CUDA_GRAPH_WARM_RUNS + 1
    runs = engine.capsnet.runs
    both = engine._run_capsnet(images, engine.output_names)  # a batch of two: the session
    engine._run_capsnet(images[:1], engine.every_output)  # the iterations, which the graph does not fetch
    assert engine.capsnet.runs == runs + 2 and graph.runs == engine_module.CUDA_GRAPH_WARM_RUNS + 1
    for single, batch in zip(one, both, strict=True):
        np.testing.assert_allclose(single[0], batch[0], atol=1e-5)


def test_a_graph_that_cannot_be_captured_leaves_plain_runs(images, caplog):
    settings = Settings(models=["mnist"], workers=1, providers=["CPUExecutionProvider"])
    engine = Engine("mnist", contract.SHIPPED["mnist"], settings)
    engine.capsnet_graph = Spy(None, fail=True)
    with caplog.at_level(logging.WARNING, logger=engine_module.__name__):
        engine.warm_up()
    assert engine.capsnet_graph is None and engine.ready
    assert "no CUDA graph, single images run as batches do" in caplog.text
    lengths = engine._run_capsnet(images[:1], engine.output_names)[0]
    assert lengths.shape == (1, contract.NUM_CLASSES)


def test_cuda_graph_is_a_setting(monkeypatch):
    assert Settings().cuda_graph is False
    monkeypatch.setenv("CAPSNET_CUDA_GRAPH", "1")
    assert Settings().cuda_graph is True
