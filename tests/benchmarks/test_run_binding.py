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
    variants = ("run", "binding", "fixed batch")  # no CUDA graph without CUDA
    assert set(rows) == {(b, v) for b in (1, 3) for v in variants}
    assert all(row["p50_ms"] > 0 for row in rows.values())
    assert all(row["max_abs_diff"] == 0.0 for row in rows.values() if row["variant"] != "fixed batch")
    assert all(row["max_abs_diff"] < 1e-5 for row in rows.values())  # folded constants: the same kernels' floats
    assert "| 3 | binding |" in (tmp_path / "r.md").read_text()


def test_a_session_for_cuda_graphs_has_its_batch_fixed_and_the_same_outputs():
    """The CUDA-graph variant's graph has the batch axis fixed (what lets ONNX Runtime fold the shape
    arithmetic it would run on the CPU); the outputs must not change."""
    graph = contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX
    x = np.random.default_rng(0).random((2, 1, contract.IMAGE_SIZE, contract.IMAGE_SIZE), np.float32)
    free, fixed = (
        run_binding.session(graph, "CPUExecutionProvider"),
        run_binding.session(run_binding.folded(graph, 2), "CPUExecutionProvider"),
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


def test_the_folded_graph_of_one_batch_size_runs_fewer_nodes_with_the_same_outputs():
    """folded() feeds ONNX Runtime's basic optimiser its own result until nothing more folds: at batch 1 the
    Casts of constants and the Range left by the first pass go too (each node is a kernel launch on a GPU)."""
    import onnx

    graph = contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX
    model = run_binding.folded(graph, 1)
    ops = [node.op_type for node in onnx.load_model_from_string(model).graph.node]
    assert not {"Shape", "ConstantOfShape", "Range"} & set(ops)
    assert ops.count("Softmax") == 2  # of 3 routing iterations: the first one's, of zero logits, is a constant
    x = np.random.default_rng(0).random((1, 1, contract.IMAGE_SIZE, contract.IMAGE_SIZE), np.float32)
    for a, b in zip(
        run_binding.plain(run_binding.session(graph, "CPUExecutionProvider"), x)(),
        run_binding.fixed_batch(model, "CPUExecutionProvider", x)(),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_placements_are_read_from_onnx_runtimes_log():
    """The nodes ONNX Runtime keeps off the GPU are what a refused CUDA graph reports: read from its verbose
    log, here a real CPU session's and lines in the form its CUDA sessions write."""
    graph = contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX
    assert run_binding.placements(graph, "CPUExecutionProvider") == {"CPUExecutionProvider": ["all"]}
    prefix = "2026-11-26 00:15:01.1 [V:onnxruntime:, session_state.cc:1581 VerifyEachNodeIsAssignedToAnEp]"
    log = [
        f"{prefix} Node placements",
        f"{prefix}  Node(s) placed on [CUDAExecutionProvider]. Number of nodes: 2",
        f"{prefix}   Conv (node_conv)",
        f"{prefix}   MemcpyFromHost (Memcpy)",
        f"{prefix}  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 1",
        f"{prefix}   Range (node_arange)",
        "2026-11-26 00:15:01.2 [W:onnxruntime:, session_state.cc:1583 VerifyEachNodeIsAssignedToAnEp] Some nodes "
        "were not assigned to the preferred execution providers",
        f"{prefix}   Softmax (not a placement: after the block)",
    ]
    assert run_binding.read_placements(log) == {
        "CUDAExecutionProvider": ["Conv (node_conv)", "MemcpyFromHost (Memcpy)"],
        "CPUExecutionProvider": ["Range (node_arange)"],
    }
