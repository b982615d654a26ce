"""Where a /predict request's CPU time goes: its stages timed one by one, and session.run by operator.

$ python -m benchmarks.cpu_profile                      # the graph the service would serve here
$ CAPSNET_PRECISION=fp32 python -m benchmarks.cpu_profile --out benchmarks/results/cpu_profile_fp32.json
$ python -m benchmarks.cpu_profile --out cpu_profile_cuda.json   # on a GPU (the serving kit's call): the
                                                          # host's stages around a CUDA run

Stages, each the median of many runs on serve_bench's request (a 28x28 PNG test digit, multipart):
  multipart        reading the image from the multipart body (app/image_request.py; serve_bench's no-op)
  multipart, Starlette's parser  the same read by Starlette's form parser (python-multipart), as a usual
                   FastAPI route reads an upload (the template's)
  decode+prepare   decoding the PNG as the server does (decoded(): a plain grey one by OpenCV) and
                   imaging.preprocess (crop, fit, centre)
  decode+prepare after a run  the same, each time right after a run of the model at batch 1 (a lone
                   request's session), as one client's requests follow each other: the run leaves the
                   cores' caches holding its own data
  batcher hop      a job's round trip through app/batcher.py (queue, batching thread, the event loop's
                   future) with a model that answers at once
  batcher hop at home  the same with the event loop's and the batching thread on one core (app/cores.py's
                   Home, a worker serving alone), where it pins (several cores, no CPU quota below them)
  session.run      a worker's session at batch 1 (`python -m app`'s default: its share of the cores)
  session.run alone  the session of a request alone on the server (app/cores.py: every core), where
                   there are several cores
  session.run alone, the class capsules  the same for an answer of the class capsules alone (?include=):
                   its graph pruned to them (app/pruning.py)
  render           the default JSON answer (two PNGs, the routing maps, orjson)
  render, with the coefficients  the same with routing.coefficients (?include=...,coefficients): 11,520 floats
  render ?include= the answer of ?include= (the class, its lengths and the runner-up, orjson)
  app layers       GET /health through the app in process: its middleware (request id, body limit,
                   HTTP metrics), routing and a response; /predict's query and engine come on top
decode+prepare's steps, one by one on the same digit (app/imaging/digit.py's digits()): decoding the PNG,
locating the paper and the digit on a reduced copy, cropping the digit's ink, measuring its stroke at 80 px,
setting its stroke and fitting and centring it; with the versions of the libraries they run on (a GPU
machine brings its own numpy, SciPy, OpenCV and Pillow). The rest of a /predict round trip (uvicorn, HTTP,
the client) is what serve_bench's no-op route costs. Operators: ONNX Runtime's own profiler over the same
session.run, in ms per run by op type (on CUDA, the host's time in each node).
Writes benchmarks/results/cpu_profile.json and .md. Not a test.
"""

import argparse
import asyncio
import collections
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, cast

import numpy as np

from benchmarks.report import write_report
from model import contract
from tests.harness import digit_png, machine, multipart, upload_scope

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
REPEATS = 300


def median_ms(fn, repeats: int = REPEATS) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1000 * float(np.median(times)), 3)


def multipart_ms(body: bytes, starlette: bool = False) -> float:
    """The routes' reading of a request carrying `body` as the multipart file field (app/image_request.py);
    starlette: Starlette's form parser instead (python-multipart's), the usual FastAPI route's."""
    from starlette.datastructures import UploadFile
    from starlette.requests import Request

    from app.image_request import read_image_bytes

    payload, scope = multipart(body), upload_scope()

    async def parse():
        async def receive():
            return {"type": "http.request", "body": payload, "more_body": False}

        if not starlette:
            return await read_image_bytes(Request(scope, receive))
        async with Request(scope, receive).form() as form:
            return await cast(UploadFile, form["file"]).read()

    loop = asyncio.new_event_loop()
    try:
        return median_ms(lambda: loop.run_until_complete(parse()))
    finally:
        loop.close()


def after_ms(first, fn, repeats: int = REPEATS) -> float:
    """The median of fn(), each time timed right after first() ran."""
    times = []
    for _ in range(repeats + 1):
        first()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(1000 * float(np.median(times[1:])), 3)


def decoded(body: bytes, max_pixels: int):
    """The picture of a small file as the server decodes it (app/answer.py's load_input): a small plain grey PNG's
    pixels by OpenCV, any other file by Pillow."""
    from app import imaging
    from app.answer import INLINE_SIDE

    pixels = imaging.plain_grey_png(body, INLINE_SIDE, max_pixels)
    return pixels if pixels is not None else imaging.decode(body, max_pixels)


def prepare_steps_ms(body: bytes, max_pixels: int) -> dict[str, float]:
    """decode+prepare of a digit PNG step by step, each step's median on the previous steps' outputs."""
    from app.imaging import digit, ink

    image = decoded(body, max_pixels)
    picture, light_ink = ink.source(image)
    paper, found, factor, inked = ink.locate(picture, light_ink)
    crop, side, _ = digit.digit_ink(picture, paper, found, factor, inked)
    measured = digit.measured_stroke(crop, side)
    return {
        "decode": median_ms(lambda: decoded(body, max_pixels)),
        "locate the paper and the digit": median_ms(lambda: ink.locate(picture, light_ink)),
        "crop the digit's ink": median_ms(lambda: digit.digit_ink(picture, paper, found, factor, inked)),
        "measure its stroke": median_ms(lambda: digit.measured_stroke(crop, side)),
        "set its stroke, fit and centre": median_ms(
            lambda: digit.fit_and_centre(digit.normalise_stroke(crop, side, 1.0, measured))
        ),
    }


def libraries() -> dict[str, str]:
    """The versions of the libraries a request's preparation and run use."""
    import cv2
    import onnxruntime
    import PIL
    import scipy

    return {
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "opencv": cv2.__version__,
        "pillow": PIL.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def app_layers_ms(settings) -> float:
    """GET /health through create_app(settings) in process, as uvicorn hands a request over."""
    from app.main import create_app

    app = create_app(settings)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/health",
        "raw_path": b"/health",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8000),
    }

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"GET /health answered {message['status']}")

    loop = asyncio.new_event_loop()
    try:
        return median_ms(lambda: loop.run_until_complete(app({**scope, "state": {}}, receive, send)))
    finally:
        loop.close()


def operators(model_path: Path, threads: int, providers: list[Any], runs: int = 100) -> dict[str, float]:
    """ms per run by op type, from ONNX Runtime's profiler, at batch 1, on the engine's providers (on CUDA
    the host's time in each node: its kernels' launches, not their time on the GPU)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        options.enable_profiling, options.profile_file_prefix = True, str(Path(tmp) / "ort")
        session = ort.InferenceSession(str(model_path), options, providers=providers)
        x = np.random.default_rng(0).random((1, 1, contract.IMAGE_SIZE, contract.IMAGE_SIZE), np.float32)
        for _ in range(runs):
            session.run(None, {contract.IMAGE: x})
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: collections.Counter = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
        elif event.get("name") == "model_run":
            by_op["(whole run)"] += event["dur"]
    return {op: round(us / runs / 1000, 3) for op, us in by_op.most_common()}


def profile() -> dict:
    from app import cores, imaging
    from app.answer import render_prediction
    from app.batcher import DynamicBatcher
    from app.engine import Engine, with_options
    from app.main import one_thread_for_pictures
    from app.schemas import COEFFICIENTS, INCLUDE_DEFAULT
    from app.settings import Settings

    one_thread_for_pictures()  # as the server's lifespan sets them

    settings = Settings(log_level="warning", models=["mnist"])  # the model profiled, alone (the GPU kit's)
    with tempfile.TemporaryDirectory() as tmp:  # a board, so that the engine has its wide session (it stays mapped)
        board = (
            cores.Board(cores.make_board(Path(tmp) / "cores.board", settings.workers)) if settings.workers > 1 else None
        )
    engine = Engine("mnist", contract.SHIPPED["mnist"], settings, board=board)
    engine.warm_up()
    body = digit_png()

    def prepare():
        return imaging.preprocess(decoded(body, settings.max_pixels), "digit")

    prepared = prepare()
    x = prepared.image[None, None].astype(np.float32)
    outputs = {
        n: o[0]
        for n, o in zip(engine.output_names, engine.capsnet.run(engine.output_names, {contract.IMAGE: x}), strict=True)
    }
    include = set(INCLUDE_DEFAULT)
    stages = {
        "multipart": multipart_ms(body),
        "multipart, Starlette's parser": multipart_ms(body, starlette=True),
        "decode+prepare": median_ms(prepare),
        "session.run": median_ms(lambda: engine.capsnet.run(engine.output_names, {contract.IMAGE: x})),
        "render": median_ms(lambda: render_prediction(outputs, prepared, include, engine)),
        "render, with the coefficients": median_ms(
            lambda: render_prediction(outputs, prepared, {*include, COEFFICIENTS}, engine)
        ),
        "render ?include=": median_ms(lambda: render_prediction(outputs, prepared, set(), engine)),
        "app layers": app_layers_ms(settings),
    }
    if (wide := engine.capsnet_wide) is not None:
        stages["session.run alone"] = median_ms(lambda: wide.run(engine.output_names, {contract.IMAGE: x}))
    if (lean := engine.capsnet_lean) is not None:
        stages["session.run alone, the class capsules"] = median_ms(
            lambda: lean.run(engine.lean_names, {contract.IMAGE: x})
        )
    lone = engine.capsnet_wide or engine.capsnet
    stages["decode+prepare after a run"] = after_ms(lambda: lone.run(engine.output_names, {contract.IMAGE: x}), prepare)

    async def hop_ms(batcher: DynamicBatcher) -> float:
        times = []
        for _ in range(REPEATS + 1):
            start = time.perf_counter()
            await batcher.submit(x)
            times.append(time.perf_counter() - start)
        return round(1000 * float(np.median(times[1:])), 3)

    hop = DynamicBatcher(
        lambda batch: [batch], "hop", 64, settings.max_wait_ms / 1000, REPEATS, None, settings.request_deadline_s
    )
    hop.start()
    stages["batcher hop"] = asyncio.run(hop_ms(hop))  # not alone: no request
    if (home := cores.Home(0)).pins:
        home.keep([threading.get_native_id(), cast(int, hop.native_id)])  # asyncio.run's loop runs on this thread
        home.settle(True)
        stages["batcher hop at home"] = asyncio.run(hop_ms(hop))
        home.settle(False)
    hop.close()
    engine.close()
    threads = settings.session_threads or os.cpu_count() or 1
    providers = with_options(engine.providers)
    return {
        "device": machine(),
        "providers": engine.providers,
        "precision": engine.precision,
        "graph": engine.capsnet_file,
        "threads": threads,
        "threads_alone": settings.lone_request_threads,
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "load_average": round(os.getloadavg()[0], 2),
        "libraries": libraries(),
        "stages_ms": stages,
        "prepare_steps_ms": prepare_steps_ms(body, settings.max_pixels),
        "operators_ms": operators(engine.directory / engine.capsnet_file, threads, providers),
    }


def markdown(report: dict) -> str:
    lines = [
        f"# Where /predict's CPU time goes ({report['device']}, {report['graph']})",
        "",
        f"{report['when']}; 1-min load average {report['load_average']}; {', '.join(report['providers'])}. "
        f"A worker's session: {report['threads']} "
        f"thread(s); alone on the server: {report['threads_alone'] or 'the same'}; the operators: "
        f"{report['threads']} thread(s).",
        "",
        "| stage | median ms |",
        "|---|---:|",
    ]
    lines += [f"| {name} | {ms} |" for name, ms in report["stages_ms"].items()]
    lines += ["", "| decode+prepare, step by step | median ms |", "|---|---:|"]
    lines += [f"| {name} | {ms} |" for name, ms in report["prepare_steps_ms"].items()]
    lines += ["", "Libraries: " + ", ".join(f"{name} {version}" for name, version in report["libraries"].items()) + "."]
    lines += ["", "| operator (batch 1) | ms per run |", "|---|---:|"]
    lines += [f"| {op} | {ms} |" for op, ms in report["operators_ms"].items() if ms >= 0.01]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_profile", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=RESULTS / "cpu_profile.json", help="the JSON (and its .md beside it)")
    args = p.parse_args(argv)
    report = profile()
    write_report(args.out, report, markdown(report))
    return report


if __name__ == "__main__":
    main()
