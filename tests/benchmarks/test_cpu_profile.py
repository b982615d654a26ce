"""benchmarks.cpu_profile runs and writes its report (a smoke test: the figures come from the full run)."""

import json

from app import cores
from benchmarks import cpu_profile


def test_cpu_profile_writes_its_report(tmp_path):
    cpu_profile.main(["--out", str(tmp_path / "profile.json")])
    report = json.loads((tmp_path / "profile.json").read_text())
    stages = {
        "multipart",
        "multipart, Starlette's parser",
        "decode+prepare",
        "decode+prepare after a run",
        "session.run",
        "render",
        "render, with the coefficients",
        "render ?include=",
        "app layers",
        "batcher hop",
    }
    stages |= {"batcher hop at home"} if cores.Home(0).pins else set()
    alone = {"session.run alone", "session.run alone, the class capsules"} if report["threads_alone"] else set()
    assert set(report["stages_ms"]) == stages | alone
    assert all(ms > 0 for ms in report["stages_ms"].values()) and report["operators_ms"]
    assert "| operator (batch 1) | ms per run |" in (tmp_path / "profile.md").read_text()
