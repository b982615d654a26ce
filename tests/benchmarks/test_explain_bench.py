"""benchmarks.explain_bench runs end to end with hey and writes its report (a smoke test: the figures come
from the full run)."""

import json
import shutil

import pytest

from benchmarks import explain_bench


@pytest.mark.skipif(shutil.which("hey") is None, reason="needs the load generator hey (apt-get install hey)")
def test_explain_bench_writes_its_report(tmp_path):
    out = tmp_path / "explain.json"
    explain_bench.main(["--seconds", "0.3", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {(r["model"], r["route"]) for r in rows} == {
        (m, r) for m in explain_bench.MODELS for r in explain_bench.ROUTES
    }
    assert all(r["requests"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] for r in rows)
    assert "/explain" in out.with_suffix(".md").read_text()
