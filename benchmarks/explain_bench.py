"""What a sweep costs: POST /explain (20 steps, one batch) beside /predict of the same digit, one client.

$ python -m benchmarks.explain_bench                 # -> benchmarks/results/explain_bench.{json,md}
$ python -m benchmarks.explain_bench --seconds 2

`python -m app` serves mnist and affine (the Transform panel's pair); `hey` sends the first MNIST test
digit from one client, for each model: /predict?include= (the answer alone), /explain with 20 steps and
no pictures (the sweep's batch and its JSON), and /explain with the demo's include (each step's input
and the drawing of its capsule: one more decoder batch and 40 PNGs). p50 and p99 from hey's CSV.
"""

import argparse
import datetime
import tempfile
from pathlib import Path

from benchmarks.load import hey
from benchmarks.report import write_report
from tests.harness import digit_png, free_port, machine, multipart, start_api

OUT = Path(__file__).parent / "results" / "explain_bench.json"
MODELS = ("mnist", "affine")
STEPS = 20
ROUTES = {
    "/predict, include=": "/predict?include=",
    f"/explain, {STEPS} steps, include=": f"/explain?steps={STEPS}&include=",
    f"/explain, {STEPS} steps, inputs and reconstructions": f"/explain?steps={STEPS}",
}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.explain_bench", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8.0, help="per row")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_api(port, {"CAPSNET_MODELS": ",".join(MODELS)})
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            body = Path(tmp) / "digit.multipart"
            body.write_bytes(multipart(digit_png()))
            for model in MODELS:
                for name, path in ROUTES.items():
                    url = f"{base}{path}{'&' if '?' in path else '?'}model={model}"
                    hey(url, body, 1, min(0.5, args.seconds))  # warm-up
                    rows.append({"model": model, "route": name, **hey(url, body, 1, args.seconds)})
    finally:
        server.terminate()
        server.wait(timeout=60)
    report = {
        "machine": machine(),
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "seconds": args.seconds,
        "load_generator": "hey, 1 client",
        "rows": rows,
    }
    lines = [
        f"# /explain beside /predict\n\n{report['machine']}; {report['when']}; one client (hey), "
        f"{args.seconds} s per row; the first MNIST test digit.\n",
        "| model | route | p50 ms | p99 ms | req/s |",
        "|---|---|---:|---:|---:|",
        *(f"| {r['model']} | {r['route']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['rps']:.1f} |" for r in rows),
    ]
    write_report(args.out, report, "\n".join(lines) + "\n")
    return report


if __name__ == "__main__":
    main()
