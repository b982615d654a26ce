"""benchmarks.run_binding runs on the CPU and writes its report (a smoke test: CUDA graphs need a GPU)."""

import json

import numpy as np

from benchmarks import run_binding
from model import contract


def test_run_binding_writes_its_report(tmp_path):
    run_binding.main(
        ["--provider", "CPUExecutionProvider", "--batches", "1,3", "--runs", "3", "--out", str(tmp_path / "r.json")]
    )
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {(row["batch"], row["variant"]): row for row in report["rows"]}
    assert set(rows) == {(b, v) for b in (1, 3) for v in ("run", "binding")}  # no CUDA graph without CUDA
    assert all(row["p50_ms"] > 0 and row["max_abs_diff"] == 0.0 for row in rows.values())
    assert "| 3 | binding |" in (tmp_path / "r.md").read_text()


def test_a_session_for_cuda_graphs_has_its_batch_fixed_and_the_same_outputs():
    """The CUDA-graph variant's session fixes the batch axis (what lets ONNX Runtime fold the shape
    arithmetic it would run on the CPU); the outputs must not change."""
    graph = contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX
    x = np.random.default_rng(0).random((2, 1, contract.IMAGE_SIZE, contract.IMAGE_SIZE), np.float32)
    free, fixed = (
        run_binding.session(graph, "CPUExecutionProvider"),
        run_binding.session(graph, "CPUExecutionProvider", 2),
    )
    assert free.get_outputs()[0].shape == [contract.BATCH, contract.NUM_CLASSES]
    assert fixed.get_outputs()[0].shape == [2, contract.NUM_CLASSES]
    for a, b in zip(run_binding.plain(free, x)(), run_binding.plain(fixed, x)(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)  # the same kernels; folding may reorder a float sum


def test_fixing_the_batch_folds_the_shape_arithmetic(tmp_path):
    """What the CUDA-graph session's fixed batch is for: ONNX Runtime's optimiser (its basic level, which
    runs before a provider takes the nodes) folds Shape and ConstantOfShape only when the batch is fixed."""
    import onnx
    import onnxruntime as ort

    def ops(batch: int | None) -> set[str]:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(tmp_path / f"{batch}.onnx")
        if batch is not None:
            options.add_free_dimension_override_by_name(contract.BATCH, batch)
        ort.InferenceSession(str(contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX), options)
        return {node.op_type for node in onnx.load(options.optimized_model_filepath).graph.node}

    assert {"Shape", "ConstantOfShape"} <= ops(None)
    assert not {"Shape", "ConstantOfShape"} & ops(1)
