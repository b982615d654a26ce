"""benchmarks.run_binding runs on the CPU and writes its report (a smoke test: CUDA graphs need a GPU)."""

import json

from benchmarks import run_binding


def test_run_binding_writes_its_report(tmp_path):
    run_binding.main(
        ["--provider", "CPUExecutionProvider", "--batches", "1,3", "--runs", "3", "--out", str(tmp_path / "r.json")]
    )
    report = json.loads((tmp_path / "r.json").read_text())
    rows = {(row["batch"], row["variant"]): row for row in report["rows"]}
    assert set(rows) == {(b, v) for b in (1, 3) for v in ("run", "binding")}  # no CUDA graph without CUDA
    assert all(row["p50_ms"] > 0 and row["max_abs_diff"] == 0.0 for row in rows.values())
    assert "| 3 | binding |" in (tmp_path / "r.md").read_text()
