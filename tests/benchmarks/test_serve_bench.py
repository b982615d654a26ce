"""benchmarks.serve_bench runs end to end, load from hey, and writes its report (a smoke test: the
figures come from the full run, `make bench`)."""

import json
import shutil

import pytest

from benchmarks import serve_bench


@pytest.mark.skipif(shutil.which("hey") is None, reason="needs the load generator hey (apt-get install hey)")
def test_serve_bench_writes_its_report(tmp_path):
    out = str(tmp_path / "serve.json")  # the Ray Serve rows are ray_serve_bench's, smoke-tested beside this
    args = ["--seconds", "0.3", "--clients", "1,2", "--workers", "1,2", "--replicas", "", "--cuda-graph"]
    report = serve_bench.main([*args, "--rounds", "2", "--out", out])
    rows = json.loads((tmp_path / "serve.json").read_text())["rows"]
    cases = (
        ("/predict", "all"),
        ("/predict", "none"),
        ("/predict", "none, preprocess=none"),
        ("no-op", "-"),
        ("/health", "-"),
    )
    assert {(r["batching"], r["endpoint"], r["include"], r["clients"]) for r in rows} == {
        (b, e, i, c) for b in ("on", "off") for c in (1, 2) for e, i in cases
    } | {("template", "/predict", "-", c) for c in (1, 2)} | {
        ("default", e, i, c) for c in (1, 2) for e, i in cases if e != "no-op"
    } | {("no cuda graph", "/predict", i, c) for c in (1, 2) for e, i in cases if e == "/predict"}
    assert all(r["requests"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"] and r["rps"] > 0 for r in rows)
    assert all(r["mean_batch"] >= 1 for r in rows if r["endpoint"] == "/predict" and r["batching"] != "template")
    served = [r for r in rows if r["batching"] in ("default", "no cuda graph") and r["endpoint"] == "/predict"]
    assert served and all(r["replayed"] == 0 for r in served)  # on the CPU the engine has no CUDA graph
    assert [r["include"] for r in report["stages"]] == ["all", "none", "none, preprocess=none"]  # Server-Timing
    for r in report["stages"]:
        inside = r["prepare_ms"] + r["model_ms"] + r["render_ms"]
        assert r["requests"] == serve_bench.STAGE_REQUESTS and 0 < inside < r["client_ms"], r
    assert report["load_generator"] == "hey" and report["bare_session_run"]["batch_1_p50_ms"] > 0
    assert "Bare session.run" in (tmp_path / "serve.md").read_text()
    workers = report["workers"]  # `python -m app` with one and two worker processes, at one client and the most
    assert sorted((r["workers"], r["include"], r["clients"]) for r in workers) == [
        (w, include, c) for w in (1, 2) for include in ("all", "none") for c in (1, 2)
    ]
    assert all(r["rps"] > 0 and len(r["rps_rounds"]) == 2 for r in workers)
    assert report["ray"] == []
    figures = {t["figure"]: t for t in report["targets"]}  # every figure with a target
    assert len(figures) == 9 + (report["providers"][0] != "CPUExecutionProvider") and all(
        t["met"] in (True, False, None) and t["target"] for t in figures.values()
    )
    assert "?include= req/s at 2 clients / bare batch-64 images/s" in figures
    beside = [t for t in report["targets"] if "the template's" in t["target"]]  # 1 and 2 clients, none and include=
    assert len(beside) == 4 and report["bare_session_run"]["threads"] >= 1
    judged = [t for t in report["targets"] if t["met"] is not None]  # and judged round by round
    assert all(len(t["rounds"]) == 2 and 0 <= t["met_rounds"] <= 2 for t in judged)
    served = [r for r in rows if r["batching"] in ("default", "template")]
    assert all(r["p50_ms"] in r["p50_rounds"] and r["rps"] in r["rps_rounds"] for r in served)
    assert "| figure | measured | target | met |" in (tmp_path / "serve.md").read_text()


def test_a_run_cut_short_leaves_the_rows_it_measured(tmp_path, monkeypatch):
    """A lease can end mid-run: what was measured before is on disk, marked unfinished."""
    row = {"batching": "on", "endpoint": "/predict", "include": "none", "clients": 1, "p50_ms": 3.0}
    bare = {"batch_1_p50_ms": 1.4}

    def cut(*args):
        raise TimeoutError("the lease ended")

    monkeypatch.setattr(serve_bench.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(serve_bench.os, "sched_setaffinity", lambda *a: None)  # this process keeps its cores
    monkeypatch.setattr(serve_bench, "bench_server", lambda *a: ([row], ["CUDAExecutionProvider"], "fp32", bare))
    monkeypatch.setattr(serve_bench, "bench_default_and_template", cut)
    out = tmp_path / "serve.json"
    with pytest.raises(TimeoutError):
        serve_bench.main(["--clients", "1", "--out", str(out)])
    kept = json.loads(out.read_text())
    assert kept["unfinished"] is True and kept["rows"] == [row, row] and kept["bare"] == [bare, bare]
    assert kept["providers"] == ["CUDAExecutionProvider"] and not out.with_suffix(".md").exists()


def test_rounds_must_be_at_least_one(capsys):
    with pytest.raises(SystemExit) as exit_:
        serve_bench.main(["--rounds", "0"])
    assert exit_.value.code == 2 and "--rounds must be at least 1" in capsys.readouterr().err
