"""benchmarks.engine_memory runs end to end and writes its report (a smoke test: two variants, one round,
one timed batch; the figures come from the full run)."""

import json

from benchmarks import engine_memory


def test_engine_memory_writes_its_report(tmp_path):
    out = tmp_path / "memory.json"
    served = len(engine_memory.VARIANTS) - 1  # the service's own Engines, what app/memory.py does
    engine_memory.main(["--rounds", "1", "--repeats", "1", "--variants", f"0,{served}", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [row["variant"]["served"] for row in rows] == [False, True]
    for row in rows:
        assert 0 < row["ready_mb"] <= row["after_load_mb"] + 1
        assert set(row["images_per_s"]) == {"mnist", "fashion-mnist", "multimnist", "affine"}
        assert all(rate > 0 for rate in row["images_per_s"].values())
    assert out.with_suffix(".md").read_text().startswith("#")
