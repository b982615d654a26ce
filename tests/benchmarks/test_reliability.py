"""benchmarks.reliability runs its three phases (load, soak, SIGTERM under load) against `python -m app`
serving mnist, briefly, and writes its report (a smoke test: the figures, requests accepted and left
unanswered included, come from the full run)."""

import json
import signal

from benchmarks import reliability


def test_reliability_writes_its_report(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSNET_MODELS", "mnist")  # start_api passes the environment on
    reliability.main(["--requests", "40", "--clients", "4", "--soak", "40", "--out", str(tmp_path / "rel.json")])
    report = json.loads((tmp_path / "rel.json").read_text())
    assert report["load"]["statuses"] == {"200": 40} and report["soak"]["statuses"] == {"200": 40}
    sigterm = report["sigterm"]
    # uvicorn stops gracefully, then raises the signal it caught again: the process ends by SIGTERM
    assert sigterm["exit_status"] == -signal.SIGTERM and sigterm["answered"] > 0
    assert sigterm["refused_before_sending"] > 0  # the port closed: clients were refused, not left hanging
