"""Serving benchmark: /predict latency and throughput beside the bare model and the HTTP ceiling.

$ python -m benchmarks.serve_bench                       # CPU or GPU, whatever CAPSNET_PROVIDERS gives
$ python -m benchmarks.serve_bench --seconds 2 --clients 1,8 --workers 1,2,4

Starts its own servers on 127.0.0.1 (the default model, mnist; batching on: max_batch 64; off:
max_batch 1), each with two extra routes: a no-op that parses the same multipart body and answers a
small JSON (the HTTP ceiling), and one that times the engine's own session.run in the server process
(the bare model: the same graph, threads and cores as /predict). The load comes from `hey`
(benchmarks/load.py: it writes each time to 0.1 ms, so a percentile is interpolated within its step).
For each server and 1, 8, 64 concurrent clients it measures p50/p99 latency and requests/s
of /predict (the full answer: no include, the default's parts; include= with the default preprocessing and
with preprocess=none), of the no-op and of GET /health. Then the service on its default settings
(`python -m app`, mnist: a worker per core, their threads) beside the fifteen-line template a user would write
(benchmarks/template_app.py: Pillow, the same int8 graph, no batching), both up at once and loaded in
turn at one client and at the most, in three rounds (--rounds; a row is its round of median req/s, and
each target is also judged round by round, against the template's figure of the same round): the rows the
targets read; on CUDA (or with --cuda-graph) the
default service with CAPSNET_CUDA_GRAPH=0 beside them (rows `no cuda graph`: a single image run as
batches are, where the default replays it as a CUDA graph, app/cuda_graph.py), and the stages of its
/predict at one client, as each answer's Server-Timing header reports them (server_stages). Last, the
real `python -m app` (mnist)
with 1, 2, ... worker processes (CAPSNET_WORKERS, its default threads),
all running at once and loaded in turn, /predict?include= and the full answer at one client and at the
most, beside the bare model's batch-64 images/s; and the same app on Ray Serve with 1, 2, ... replicas (with the `ray`
extra; `make bench` installs it). Each figure with a target (targets()) is listed beside it. Where the
machine has four cores or more, the servers are pinned to the first half of them (ONNX Runtime gets that
many threads) and this process, the load generator, to the rest, so that the two do not take each other's
cores; on fewer, both share them all (see split_cpus).
Writes benchmarks/results/serve_bench.json and .md. Not a test.
"""

import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from benchmarks.load import hey
from benchmarks.report import write_report
from model import contract
from tests.harness import MULTIPART, digit_png, free_port, machine, multipart, start_api, wait_for_workers

REPO = Path(__file__).resolve().parents[1]

# -----------------------------------------------------------------------------------------------
HOST = "127.0.0.1"
PORT = 8917
CLIENTS = (1, 8, 64)
SECONDS = 4.0  # per measurement
WARMUP_REQUESTS = 20
BARE_REPEATS = (200, 10)  # session.run repeats at batch 1 and at BATCH
BATCH = 64
ROUNDS = 3  # turns of the default service's and the template's rows, and of the worker-count rows
STAGE_REQUESTS = 200  # one client's requests whose Server-Timing stages are read, per /predict case
RESULTS = REPO / "benchmarks" / "results"
NOOP = "/_bench/noop"
BARE = "/_bench/bare"
# -----------------------------------------------------------------------------------------------


MIN_PINNED_CORES = 2  # the server's event loop, batching thread and ONNX Runtime need two cores


def split_cpus() -> tuple[set[int], set[int]]:
    """(server's cores, load generator's cores): the first half and the rest of this process's cores
    when each half has MIN_PINNED_CORES, else all of them for both: on one core the server's threads
    would take turns through the GIL's switch interval, which the latencies would measure instead."""
    cpus = sorted(os.sched_getaffinity(0))
    half = len(cpus) // 2
    return (set(cpus[:half]), set(cpus[half:])) if half >= MIN_PINNED_CORES else (set(cpus), set(cpus))


def serve(max_batch: int, cores: set[int]) -> None:
    """Child process, pinned to the server's cores: the real app, the no-op route and the bare-model
    route, under uvicorn."""
    import uvicorn
    from fastapi import Request

    from app.image_request import read_image_bytes
    from app.main import create_app
    from app.settings import Settings

    os.sched_setaffinity(0, cores)
    settings = Settings(
        host=HOST, port=PORT, models=["mnist"], max_batch=max_batch, log_level="warning", intra_op_threads=len(cores)
    )
    app = create_app(settings)

    @app.post(NOOP, include_in_schema=False)
    async def noop(request: Request) -> dict:
        await read_image_bytes(request)  # the route's own reading of the body
        return {"prediction": 0}

    @app.get(BARE, include_in_schema=False)
    def bare(batch: int, repeats: int) -> dict:  # a plain def: runs on a worker thread, as the batcher's runs do
        engines = app.state.engines
        engine = engines[engines.default]
        size = engine.capsnet.get_inputs()[0].shape[-1]
        x = np.random.default_rng(0).random((batch, 1, size, size), np.float32)
        engine.capsnet.run(engine.output_names, {contract.IMAGE: x})
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            engine.capsnet.run(engine.output_names, {contract.IMAGE: x})
            times.append((time.perf_counter() - start) * 1000)
        return {"p50_ms": round(float(np.median(times)), 3)}

    uvicorn.run(app, host=HOST, port=PORT, log_level="warning")


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def batches_run(base: str) -> tuple[int, float, int]:
    """How many batches the server's default model has run so far (its batcher's and that of requests for the
    class capsules alone, `mnist_lean`), their session.run seconds in all, and how many of them were single
    images replayed as a CUDA graph (GET /metrics)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = get(f"{base}/metrics").decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model") in ("mnist", "mnist_lean"):
                samples[s.name] = samples.get(s.name, 0.0) + s.value
    batches = int(samples.get("capsnet_batch_size_count", 0))
    seconds = samples.get("capsnet_inference_seconds_sum", 0.0)
    return batches, seconds, int(samples.get("capsnet_graph_replays_total", 0))


def loaded(base: str, path: str, url: str, body: Path | None, clients: int, seconds: float) -> dict:
    """hey's figures for `url`; for /predict also the mean batch, the mean session.run of the batches that the
    server at `base` ran meanwhile and how many of them it replayed as a CUDA graph (its /metrics)."""
    before = batches_run(base)
    result = hey(url, body, clients, seconds)
    after = batches_run(base)
    batches = after[0] - before[0]
    if path == "/predict" and batches:
        result["mean_batch"] = round(result["requests"] / batches, 2)
        result["run_ms"] = round(1000 * (after[1] - before[1]) / batches, 3)  # session.run there, mean
        result["replayed"] = after[2] - before[2]
    return result


def wait_ready(base: str, process: subprocess.Popen, path: str = "/ready") -> dict:
    for _ in range(600):
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}) before it was ready")
        try:
            return json.loads(get(f"{base}{path}"))
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the server did not become ready")


def start_template(port: int, server_cpus: set[int]) -> subprocess.Popen:
    """The fifteen-line template (benchmarks/template_app.py) under uvicorn on the server's cores."""
    cores = ",".join(map(str, sorted(server_cpus)))
    command = ["taskset", "-c", cores, sys.executable, "-m", "uvicorn", "benchmarks.template_app:app"]
    return subprocess.Popen([*command, "--host", HOST, "--port", str(port), "--log-level", "warning"], cwd=REPO)


DEFAULT_CASES = (  # the default service's rows: /predict as the targets name it, and /health
    ("/predict", "all", ""),
    ("/predict", "none", "?include="),
    ("/predict", "none, preprocess=none", "?include=&preprocess=none"),
    ("/health", "-", ""),
)


def server_stages(port: int, target: str, body: Path, requests: int) -> dict:
    """Medians (ms) of the stages a /predict answer reports in its Server-Timing header (prepare, model,
    render), over `requests` sent one after another by one client on one kept-alive connection (as hey's are:
    one worker serves them all), and of the time that client waited (http.client: it reads the header, which
    hey does not; its own overhead is in `client_ms` alone)."""
    sent = body.read_bytes()
    stages: dict[str, list[float]] = {}
    waited = []
    connection = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        for _ in range(requests):
            begun = time.perf_counter()
            connection.request("POST", target, sent, {"Content-Type": MULTIPART})
            response = connection.getresponse()
            response.read()
            waited.append(1000 * (time.perf_counter() - begun))
            for part in response.headers["Server-Timing"].split(", "):
                name, duration = part.split(";dur=")
                stages.setdefault(name, []).append(float(duration))
    finally:
        connection.close()
    medians = {f"{name}_ms": round(float(np.median(values)), 3) for name, values in stages.items()}
    return {"requests": requests, **medians, "client_ms": round(float(np.median(waited)), 3)}


def bench_default_and_template(
    clients_list, seconds: float, body: Path, server_cpus: set[int], cuda_graph: bool = False, rounds: int = ROUNDS
) -> tuple[list[dict], list[dict]]:
    """`python -m app` on its default settings (mnist) and the template, both up at once on the server's
    cores, each loaded in turn at each number of clients, `rounds` times (every other round in the reverse
    order, so that no case always runs first): rows `default` and `template`, each the round of median req/s
    (median_round); with cuda_graph, the default service with CAPSNET_CUDA_GRAPH=0 beside them too (rows
    `no cuda graph`: /predict). Then the stages of the default service's /predict at one client
    (server_stages), a row per case."""
    services = {"default": (free_port(), {"CAPSNET_MODELS": "mnist"})}
    if cuda_graph:
        services["no cuda graph"] = (free_port(), {"CAPSNET_MODELS": "mnist", "CAPSNET_CUDA_GRAPH": "0"})
    apps = {name: start_api(port, env, cpus=server_cpus) for name, (port, env) in services.items()}
    template_port = free_port()
    template = start_template(template_port, server_cpus)
    runs: dict[tuple[str, str, str, int], list[dict]] = {}
    try:
        wait_ready(f"http://{HOST}:{template_port}", template, "/openapi.json")
        if len(server_cpus) > 1:  # the default: a worker per core it may use
            for port, _ in services.values():
                wait_for_workers(f"http://{HOST}:{port}", len(server_cpus))
        cases = [("template", template_port, "/predict", "-", "")]
        for name, (port, _) in services.items():
            cases += [(name, port, *case) for case in DEFAULT_CASES if name == "default" or case[0] != "/health"]
        for turn in range(rounds):
            for clients in clients_list:
                for batching, port, path, include, query in cases if turn % 2 == 0 else cases[::-1]:
                    base, sent = f"http://{HOST}:{port}", None if path == "/health" else body
                    url = f"{base}{path}{query}"
                    if turn == 0:
                        hey(url, sent, 1, 0.5)  # warm-up
                    figures = hey(url, sent, clients, seconds) if batching == "template" else None
                    run = figures or loaded(base, path, url, sent, clients, seconds)
                    runs.setdefault((batching, path, include, clients), []).append(run)
                    case = {"batching": batching, "endpoint": path, "include": include, "clients": clients}
                    print(json.dumps({**case, "round": turn + 1, **run}), flush=True)  # a cut lease keeps the log
        port = services["default"][0]
        stages = [
            {"include": include, **server_stages(port, f"{path}{query}", body, STAGE_REQUESTS)}
            for path, include, query in DEFAULT_CASES
            if path == "/predict"
        ]
    finally:
        for process in (*apps.values(), template):
            process.terminate()
            process.wait(60)
    rows = [
        {"batching": batching, "endpoint": path, "include": include, "clients": clients, **median_round(measured)}
        for (batching, path, include, clients), measured in runs.items()
    ]
    return rows, stages


def bench_server(
    max_batch: int, clients_list, seconds: float, body: Path, server_cpus: set[int]
) -> tuple[list[dict], list[str], str, dict]:
    """Start a server, time the bare model while it idles (same moment, same machine load), then load it."""
    cores = ",".join(map(str, sorted(server_cpus)))
    process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.serve_bench", "--serve", str(max_batch), "--cores", cores], cwd=REPO
    )
    base, rows = f"http://{HOST}:{PORT}", []
    try:
        ready = wait_ready(base, process)
        providers, precision = ready["providers"], ready["precision"]
        bare = bare_session_run(base)
        batching = "on" if max_batch > 1 else "off"
        for clients in clients_list:
            for path, include, query in (*DEFAULT_CASES, (NOOP, "-", "")):
                url, sent = f"{base}{path}{query}", None if path == "/health" else body
                hey(url, sent, 1, 0.5)  # warm-up
                row = {"batching": batching, "endpoint": {NOOP: "no-op"}.get(path, path), "include": include}
                row = {**row, "clients": clients, **loaded(base, path, url, sent, clients, seconds)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        process.terminate()
        process.wait(30)
    return rows, providers, precision, bare


MET = {True: "yes", False: "no", None: "-"}
SCALED = (("none", "?include="), ("all", ""))  # the workers' and replicas' requests: include=, the full answer


def median_round(runs: list[dict]) -> dict:
    """Of several hey runs of one request, the run of median req/s, with every run's req/s and p50, in the
    order they ran."""
    median = sorted(runs, key=lambda run: run["rps"])[len(runs) // 2]
    return {**median, "rps_rounds": [run["rps"] for run in runs], "p50_rounds": [run["p50_ms"] for run in runs]}


def bench_workers(
    workers_list, clients_list, seconds: float, body: Path, server_cpus: set[int], rounds: int = ROUNDS
) -> list[dict]:
    """`python -m app` serving mnist with each number of workers, all started at once on the server's cores,
    then loaded in turn, `rounds` times each (other work on a shared machine then weighs on each alike):
    /predict?include= and the full answer (SCALED) from each number of clients; per row the round of median
    req/s."""
    servers = {}
    try:
        for workers in workers_list:
            port = free_port()
            env = {"CAPSNET_MODELS": "mnist", "CAPSNET_WORKERS": str(workers)}
            servers[workers] = (start_api(port, env, cpus=server_cpus), f"http://{HOST}:{port}")
            if workers > 1:
                wait_for_workers(servers[workers][1], workers)
            hey(f"{servers[workers][1]}/predict", body, max(clients_list), 0.5)  # warm-up
        results: dict[tuple[int, str, int], list[dict]] = {}
        for _ in range(rounds):
            for clients in clients_list:
                for include, query in SCALED:
                    for workers, (_, base) in servers.items():
                        run = hey(f"{base}/predict{query}", body, clients, seconds)
                        results.setdefault((workers, include, clients), []).append(run)
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(60)
    rows = []
    for (workers, include, clients), runs in results.items():
        rows.append(
            {"workers": workers, "endpoint": "/predict", "include": include, "clients": clients, **median_round(runs)}
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def bench_ray(replicas_list, clients: int, seconds: float, body: Path, rounds: int = ROUNDS) -> list[dict]:
    """The same app on Ray Serve (deploy/ray/serve.yaml, benchmarks/ray_serve_bench.py) with each number of
    replicas, one at a time (a local Ray each): SCALED from `clients` clients, `rounds` runs each; [] without
    the `ray` extra."""
    try:
        from benchmarks import ray_serve_bench
    except ImportError:
        print("serve_bench: no Ray Serve rows (pip install -e '.[ray]' or make install-ray)", flush=True)
        return []
    rows = []
    for replicas in replicas_list:
        with ray_serve_bench.ray_serve(replicas, ray_serve_bench.ENV) as base:
            hey(f"{base}/predict", body, clients, 0.5)  # warm-up
            for include, query in SCALED:
                runs = [hey(f"{base}/predict{query}", body, clients, seconds) for _ in range(rounds)]
                rows.append({"replicas": replicas, "include": include, "clients": clients, **median_round(runs)})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def bare_session_run(base: str) -> dict:
    """The engine's session.run alone, timed in the server process while it idles (all outputs, as /predict)."""
    out = {}
    for n, repeats in zip((1, BATCH), BARE_REPEATS, strict=True):
        out[f"batch_{n}_p50_ms"] = json.loads(get(f"{base}{BARE}?batch={n}&repeats={repeats}"))["p50_ms"]
    out[f"batch_{BATCH}_images_per_s"] = round(BATCH / out[f"batch_{BATCH}_p50_ms"] * 1000, 1)
    return out


def scaled_rows(rows: list[dict], key: str, images_per_s: float | None = None) -> list[str]:
    """Markdown rows of the workers' or replicas' table (`key`), with req/s over the bare images/s if given
    (beside the rows of several clients: one client's rate is its latency's)."""
    lines = []
    for r in rows:
        rounds = ", ".join(map(str, r["rps_rounds"]))
        cells = [r[key], r["include"], r["clients"], r["p50_ms"], r["p99_ms"], f"{r['rps']} ({rounds})"]
        if images_per_s:
            cells.append(round(r["rps"] / images_per_s, 3) if r["clients"] > 1 else "")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return lines


def markdown(report: dict) -> str:
    bare = report["bare_session_run"]
    lines = [
        f"# Serving benchmark ({report['device']}, {', '.join(report['providers'])}, {report['precision']})",
        "",
        f"{report['when']}; {report['seconds']} s per row, load from hey; client and server on the same machine, "
        f"the server on cores {report['server_cpus']}, the load generator on {report['client_cpus']}; "
        f"1-min load average {report['load_average'][0]} before, {report['load_average'][1]} after.",
        "",
        f"Bare session.run (the server's session, in the server process): batch 1 p50 {bare['batch_1_p50_ms']} ms; "
        f"batch {BATCH} p50 {bare[f'batch_{BATCH}_p50_ms']} ms ({bare[f'batch_{BATCH}_images_per_s']} images/s).",
        "",
        "run ms: the mean session.run of the row's batches in the server (its /metrics), beside the bare one; "
        "replayed: how many of them were single images replayed as a CUDA graph.",
        "",
        "| batching | endpoint | include | clients | requests | p50 ms | p99 ms | req/s | mean batch | run ms "
        "| replayed |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['batching']} | {r['endpoint']} | {r['include']} | {r['clients']} | {r['requests']} | "
            f"{r['p50_ms']} | {r['p99_ms']} | {r['rps']} | {r.get('mean_batch', '')} | {r.get('run_ms', '')} | "
            f"{r.get('replayed', '')} |"
        )
    lines += [
        "",
        f"`python -m app` on its default settings, one client: the median of each stage its /predict answer reports "
        f"(Server-Timing: prepare, the image's decoding and preparation; model, the run with its batching; render, "
        f"the JSON), of {STAGE_REQUESTS} requests sent one after another on one connection, and the time the "
        "client (Python's http.client) waited:",
        "",
        "| include | prepare ms | model ms | render ms | the three | the client waited, ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in report["stages"]:
        inside = round(r["prepare_ms"] + r["model_ms"] + r["render_ms"], 3)
        lines.append(
            f"| {r['include']} | {r['prepare_ms']} | {r['model_ms']} | {r['render_ms']} | {inside} | {r['client_ms']} |"
        )
    images_per_s = bare[f"batch_{BATCH}_images_per_s"]
    lines += [
        "",
        f"`python -m app` with each number of worker processes (mnist; include: none is `?include=`, all the "
        f"full answer), beside the bare model's {images_per_s} images/s at batch {BATCH}:",
        "",
        "| workers | include | clients | p50 ms | p99 ms | req/s (each round) | req/s / bare images/s |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    lines += scaled_rows(report["workers"], "workers", images_per_s)
    if report["ray"]:
        lines += [
            "",
            "The same app on Ray Serve (deploy/ray/serve.yaml; each replica one process with one ONNX Runtime "
            "thread, a local Ray on this machine):",
            "",
            "| replicas | include | clients | p50 ms | p99 ms | req/s (each round) |",
            "|---:|---|---:|---:|---:|---:|",
            *scaled_rows(report["ray"], "replicas"),
        ]
    lines += [
        "",
        "Targets, on the default settings (`python -m app`, rows `default`; the bare session.run: "
        f"{bare['batch_1_p50_ms']} ms at batch 1, {bare['threads']} threads). The rows `default` and `template` "
        f"ran {report['rounds']} rounds, loaded in turn: measured is each row's round of median req/s, and each "
        "round's figure (against the template's of that round) is listed with how many of them met the target:",
        "",
        "| figure | measured | target | met | each round | rounds met |",
        "|---|---:|---|---|---:|---:|",
    ]
    for t in report["targets"]:
        each = ", ".join(map(str, t.get("rounds", [])))
        met_rounds = f"{t['met_rounds']}/{len(t['rounds'])}" if "rounds" in t else ""
        lines.append(f"| {t['figure']} | {t['measured']} | {t['target']} | {MET[t['met']]} | {each} | {met_rounds} |")
    return "\n".join(lines) + "\n"


def targets(rows: list[dict], bare: dict, on_gpu: bool, workers: list[dict]) -> list[dict]:
    """Each figure the service has a target for, measured in this run on its default settings (rows
    `default`), the template's beside those it must beat: {figure, measured, target, met, rounds, met_rounds};
    measured and met from each row's round of median req/s, rounds the figure of each round (of the rows of
    that round, the template's too) and met_rounds in how many of them it met its target. met is None for a
    figure given for context (no rounds)."""

    def row(batching, endpoint, include, clients):
        return next(
            r
            for r in rows
            if (r["batching"], r["endpoint"], r["include"], r["clients"]) == (batching, endpoint, include, clients)
        )

    def at(r: dict, key: str, turn: int | None) -> float:  # the row's p50 or rps: its median round's, or turn's
        return r[f"{key}_ms" if key == "p50" else key] if turn is None else r[f"{key}_rounds"][turn]

    top = max(r["clients"] for r in rows)
    health, template = row("default", "/health", "-", 1), row("template", "/predict", "-", 1)
    busy_template = row("template", "/predict", "-", top)
    images_per_s = bare[f"batch_{BATCH}_images_per_s"]
    turns = range(len(template["p50_rounds"]))

    def target(figure: str, target: str, measure) -> dict:  # measure(turn) -> (figure, met); turn None: medians
        measured, met = measure(None)
        each = [measure(turn) for turn in turns]
        return {
            "figure": figure,
            "measured": round(measured, 3),
            "target": target,
            "met": met,
            "rounds": [round(value, 3) for value, _ in each],
            "met_rounds": sum(ok for _, ok in each),
        }

    def faster(include: str):  # p50 at one client below the template's, of the same round
        ours = row("default", "/predict", include, 1)
        return lambda turn: (at(ours, "p50", turn), at(ours, "p50", turn) < at(template, "p50", turn))

    def more(include: str):  # req/s at the most clients above the template's, of the same round
        ours = row("default", "/predict", include, top)
        return lambda turn: (at(ours, "rps", turn), at(ours, "rps", turn) > at(busy_template, "rps", turn))

    def over(include: str, most: float):  # p50 at one client over /health's p50 (the round's) + the bare run
        ours = row("default", "/predict", include, 1)

        def measure(turn):
            extra = at(ours, "p50", turn) - at(health, "p50", turn) - bare["batch_1_p50_ms"]
            return extra, extra <= most

        return measure

    def share(turn):  # ?include= req/s at the most clients over the bare model's batch-64 images/s
        ratio = at(row("default", "/predict", "none", top), "rps", turn) / images_per_s
        return ratio, ratio >= 0.5

    out = []
    for include, name in (("none, preprocess=none", "?include=&preprocess=none"), ("none", "?include=")):
        out.append(target(f"{name} p50 at 1 client, ms", f"< the template's {template['p50_ms']}", faster(include)))
        out.append(target(f"{name} req/s at {top} clients", f"> the template's {busy_template['rps']}", more(include)))
    figure = "?include= p50 at 1 client - (/health p50 + bare batch-1 session.run), ms"
    out.append(target(figure, "<= 1.0", over("none", 1.0)))
    out.append(target("the full answer's p50 at 1 client - the same, ms", "<= 1.5", over("all", 1.5)))
    out.append(target(f"?include= req/s at {top} clients / bare batch-{BATCH} images/s", ">= 0.5", share))
    out += [
        {
            "figure": f"?include= req/s at {r['clients']} clients, {r['workers']} worker(s) / bare batch-{BATCH} "
            "images/s",
            "measured": round(r["rps"] / images_per_s, 3),
            "target": "none: workers beside each other",
            "met": None,
        }
        for r in workers
        if r["include"] == "none" and r["clients"] == top
    ]
    if on_gpu:
        lone = row("default", "/predict", "none", 1)
        replayed = lone.get("replayed", 0)
        figure = f"?include= p50 at 1 client on the GPU, {replayed} single images replayed as a CUDA graph, ms"
        out.append(target(figure, "< 2", lambda turn: (at(lone, "p50", turn), at(lone, "p50", turn) < 2)))
    return out


def keep_so_far(out: Path, measured: dict) -> None:
    """The rows measured so far as JSON at out, marked unfinished: a run that its lease cuts short leaves them
    (the finished report replaces them)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"unfinished": True, **measured}, indent=2) + "\n")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", type=int, metavar="MAX_BATCH", help=argparse.SUPPRESS)
    p.add_argument("--cores", help=argparse.SUPPRESS)  # the server's, with --serve
    p.add_argument("--seconds", type=float, default=SECONDS)
    p.add_argument("--clients", default=",".join(map(str, CLIENTS)))
    p.add_argument("--rounds", type=int, default=ROUNDS, help="turns of the default, template and worker rows")
    p.add_argument("--workers", default="1,2", help="worker processes of the `python -m app` rows, comma list")
    p.add_argument("--replicas", default="1,2", help="Ray Serve replicas of its rows, comma list (empty: none)")
    p.add_argument(
        "--cuda-graph",
        action="store_true",
        help="also the default service with CAPSNET_CUDA_GRAPH=0 (rows `no cuda graph`), as on CUDA always",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "serve_bench.json", help="the JSON (and its .md beside it)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.serve is not None:
        serve(args.serve, {int(c) for c in args.cores.split(",")})
        return {}
    if shutil.which("hey") is None:
        sys.exit("serve_bench needs the load generator hey: apt-get install hey")
    clients = [int(c) for c in args.clients.split(",")]
    server_cpus, client_cpus = split_cpus()
    os.sched_setaffinity(0, client_cpus)  # the server child sets its own; hey inherits this process's
    load_before = os.getloadavg()[0]
    rows: list[dict] = []
    bares: list[dict] = []
    when = time.strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "body"
        body.write_bytes(multipart(digit_png()))
        for max_batch in (64, 1):
            server_rows, providers, precision, bare = bench_server(max_batch, clients, args.seconds, body, server_cpus)
            rows, bares = rows + server_rows, [*bares, bare]
        so_far = {"device": machine(), "providers": providers, "when": when, "rows": rows, "bare": bares}
        keep_so_far(args.out, so_far)
        top_and_one = sorted({1, max(clients)})
        cuda_graph = args.cuda_graph or providers[0] == "CUDAExecutionProvider"
        default_rows, stages = bench_default_and_template(
            top_and_one, args.seconds, body, server_cpus, cuda_graph, args.rounds
        )
        rows += default_rows
        keep_so_far(args.out, {**so_far, "rows": rows})
        workers = [int(w) for w in args.workers.split(",")]
        worker_rows = bench_workers(workers, top_and_one, args.seconds, body, server_cpus, args.rounds)
        replicas = [int(n) for n in args.replicas.split(",") if n]
        ray_rows = bench_ray(replicas, max(clients), args.seconds, body, args.rounds) if replicas else []
    bare = {key: round(float(np.mean([b[key] for b in bares])), 3) for key in bares[0]}  # both servers' moments
    bare["threads"] = len(server_cpus)  # the bench servers' intra-op threads
    on_gpu = providers[0] != "CPUExecutionProvider"
    report = {
        "device": machine(),
        "providers": providers,
        "precision": precision,
        "load_generator": "hey",
        "server_cpus": sorted(server_cpus),
        "client_cpus": sorted(client_cpus),
        "when": when,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],  # other work on the machine
        "seconds": args.seconds,
        "rounds": args.rounds,
        "bare_session_run": bare,
        "rows": rows,
        "stages": stages,
        "workers": worker_rows,
        "ray": ray_rows,
        "targets": targets(rows, bare, on_gpu, worker_rows),
    }
    write_report(args.out, report, markdown(report))
    return report


if __name__ == "__main__":
    main()
