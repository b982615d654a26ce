"""benchmarks.run_binding runs on the CPU and writes its report (a smoke test: CUDA graphs need a GPU)."""

import json

from benchmarks import run_binding
from model import contract


def test_run_binding_writes_its_report(tmp_path):
    run_binding.main(
        ["--provider", "CPUExecutionProvider", "--batches", "1,3", "--runs", "3", "--out", str(tmp_path / "r.json")]
    )
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {(row["batch"], row["variant"]): row for row in report["rows"]}
    variants = ("run", "conv as matmul", "binding", "fixed batch", "fixed batch, fp16", "fixed batch, conv as matmul")
    assert set(rows) == {(b, v) for b in (1, 3) for v in variants}
    assert all(row["p50_ms"] > 0 for row in rows.values())
    assert all(row["max_abs_diff"] == 0.0 for row in rows.values() if row["variant"] in ("run", "binding"))
    assert all(rows[(b, "fixed batch")]["max_abs_diff"] < 1e-5 for b in (1, 3))  # folded constants: the same floats
    for b in (1, 3):  # fp16's rounding (a relative 5e-4) shows, and stays far below what a reader would see
        assert 0 < rows[(b, "fixed batch, fp16")]["max_abs_diff"] < 0.02
    assert rows[(1, "fixed batch")]["nodes"] < rows[(1, "run")]["nodes"] == rows[(3, "binding")]["nodes"]
    for b in (1, 3):  # the convolution as a matmul sums the same products in another order (no CUDA graph here)
        assert rows[(b, "conv as matmul")]["max_abs_diff"] < 1e-5
        assert rows[(b, "fixed batch, conv as matmul")]["max_abs_diff"] < 1e-5
    assert "| 3 | binding |" in (tmp_path / "r.md").read_text()


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


def test_a_graph_the_fp16_converter_refuses_costs_its_rows_alone(tmp_path, monkeypatch):
    def refuse(graph: bytes) -> bytes:
        raise ValueError("an op it cannot convert")

    monkeypatch.setattr(run_binding, "half", refuse)
    report = run_binding.main(
        ["--provider", "CPUExecutionProvider", "--batches", "1", "--runs", "3", "--out", str(tmp_path / "r.json")]
    )
    rows = {row["variant"]: row for row in report["rows"]}
    assert (
        rows["fixed batch, fp16"]["p50_ms"] is None and "an op it cannot convert" in rows["fixed batch, fp16"]["error"]
    )
    assert all(rows[v]["p50_ms"] > 0 for v in ("run", "binding", "fixed batch"))
