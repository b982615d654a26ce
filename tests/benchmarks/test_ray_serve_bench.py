"""benchmarks.ray_serve_bench runs end to end with hey and writes its report (a smoke test: one replica; the
figures come from the full run)."""

import json
import shutil

import pytest

pytest.importorskip("ray.serve", reason="needs Ray Serve, the ray extra: pip install -e '.[ray]'")

from benchmarks import ray_serve_bench


@pytest.mark.skipif(shutil.which("hey") is None, reason="needs the load generator hey (apt-get install hey)")
def test_ray_serve_bench_writes_its_report(tmp_path):
    out = tmp_path / "ray.json"
    ray_serve_bench.main(["--seconds", "0.3", "--replicas", "1", "--clients", "1,2", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert {(r["server"], r["clients"]) for r in rows} == {
        (s, c) for s in ("python -m app", "Ray Serve, 1 replica") for c in (1, 2)
    }
    assert all(r["requests"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] for r in rows)
    assert "Ray Serve, 1 replica" in out.with_suffix(".md").read_text()
