"""benchmarks.reliability runs its four phases (load, soak, SIGTERM under load, two workers) against
`python -m app` serving mnist, briefly, and writes its report (a smoke test: the figures, requests accepted
and left unanswered included, come from the full run)."""

import json
import shutil
import signal

import pytest

from benchmarks import reliability


@pytest.mark.skipif(shutil.which("hey") is None, reason="needs the load generator hey (apt-get install hey)")
def test_reliability_writes_its_report(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSNET_MODELS", "mnist")  # start_api passes the environment on
    quick = ["--requests", "40", "--clients", "4", "--soak", "40", "--workers-seconds", "1.5"]
    reliability.main([*quick, "--out", str(tmp_path / "rel.json")])
    report = json.loads((tmp_path / "rel.json").read_text())
    assert report["load"]["statuses"] == {"200": 40} and report["soak"]["statuses"] == {"200": 40}
    sigterm = report["sigterm"]
    # uvicorn stops gracefully, then raises the signal it caught again: the process ends by SIGTERM
    assert sigterm["exit_status"] == -signal.SIGTERM and sigterm["answered"] > 0
    assert sigterm["refused_before_sending"] > 0  # the port closed: clients were refused, not left hanging
    workers = report["workers"]
    assert len(workers["rss_mb_ready"]) == len(workers["rss_mb_after_load"]) == 2 and workers["parent_rss_mb"] > 0
    assert [load["statuses"].keys() for load in workers["every_model_at_once"]] == [{"200"}]
    kill = workers["kill"]
    assert set(kill["statuses"]) == {"200"} and kill["sent_unanswered"] <= kill["connections_held"]
    assert kill["refused_before_sending"] == 0 and kill["replaced_after_s"] > 0
    assert workers["sigterm"]["exit_status"] == 0 and workers["sigterm"]["refused_before_sending"] > 0
