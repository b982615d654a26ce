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
    steps = report["prepare_steps_ms"]
    assert len(steps) == 5 and all(ms > 0 for ms in steps.values())
    # the steps are the whole of decode+prepare (its few calls between them aside), run by run within the noise
    assert 0.4 < sum(steps.values()) / report["stages_ms"]["decode+prepare"] < 2, (steps, report["stages_ms"])
    assert set(report["libraries"]) == {"numpy", "scipy", "opencv", "pillow", "onnxruntime"}
    text = (tmp_path / "profile.md").read_text()
    assert "| operator (batch 1) | ms per run |" in text and "| decode+prepare, step by step | median ms |" in text
