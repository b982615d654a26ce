"""benchmarks.slow_clients runs end to end against `python -m app` and writes its report (a smoke test: a
few connections and a 1 s deadline; the figures come from the full run)."""

import json
import shutil

import pytest

from benchmarks import slow_clients


@pytest.mark.skipif(shutil.which("hey") is None, reason="needs the load generator hey (apt-get install hey)")
def test_slow_clients_writes_its_report(tmp_path):
    out = tmp_path / "slow.json"
    report = slow_clients.main(["--connections", "8", "--deadline", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == report and (tmp_path / "slow.md").read_text().startswith("#")
    assert report["answered_408"] == 8 and 1.0 <= report["cut_after_s"][0] <= report["cut_after_s"][1] < 6
    assert report["predict_during"]["requests"] > 0  # hey fails the run unless every answer is 200
    assert report["log_gone_lines"] == 8 and report["log_tracebacks"] == 0
