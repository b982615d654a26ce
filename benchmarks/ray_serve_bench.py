"""/predict on Ray Serve (deploy/ray/serve.yaml) with 1 and 2 replicas, beside plain `python -m app`.

$ pip install -e '.[ray]'
$ python -m benchmarks.ray_serve_bench                       # -> benchmarks/results/ray_serve_bench.{json,md}
$ python -m benchmarks.ray_serve_bench --seconds 2 --replicas 1 --clients 1

Every server serves mnist on the CPU with one ONNX Runtime thread per process (the config's num_cpus: 1
per replica; the plain process told so too), so that the rows differ by Ray's proxy hop and the number of
replicas, not by threads. A local Ray (no dashboard) serves the config as `serve run` does, its port moved
to a free one; `hey` posts the first MNIST test digit to /predict (the full answer) from 1 and 64 clients.
"""

import argparse
import datetime
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray

from benchmarks.load import hey
from benchmarks.report import write_report
from tests.harness import REPO, digit_png, free_port, machine, multipart, start_api
from tests.ray_harness import ray_serve

OUT = REPO / "benchmarks" / "results" / "ray_serve_bench.json"
ENV = {"CAPSNET_MODELS": "mnist", "CAPSNET_PROVIDERS": "CPUExecutionProvider", "CAPSNET_INTRA_OP_THREADS": "1"}


@contextmanager
def plain(env: dict[str, str]) -> Iterator[str]:
    """`python -m app` on a free port with env: its URL once /ready answers; stopped when the block ends."""
    port = free_port()
    server = start_api(port, env)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=60)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ray_serve_bench", description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8.0, help="per row")
    p.add_argument("--replicas", default="1,2", help="comma list: a Ray Serve run for each")
    p.add_argument("--clients", default="1,64", help="comma list of hey's concurrent clients")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    servers = {"python -m app": lambda: plain(ENV)} | {
        f"Ray Serve, {n} replica{'s' * (n > 1)}": lambda n=n: ray_serve(n, ENV)
        for n in (int(r) for r in args.replicas.split(","))
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        body = Path(tmp) / "digit.multipart"
        body.write_bytes(multipart(digit_png()))
        for server, start in servers.items():
            with start() as url:
                hey(f"{url}/predict", body, max(clients), min(1.0, args.seconds))  # warm-up
                for n in clients:
                    rows.append({"server": server, "clients": n, **hey(f"{url}/predict", body, n, args.seconds)})
    report = {
        "machine": machine(),
        "when": datetime.datetime.now().isoformat(timespec="seconds"),
        "ray": ray.__version__,
        "seconds": args.seconds,
        "env": ENV,
        "load_generator": "hey",
        "rows": rows,
    }
    lines = [
        f"# /predict on Ray Serve\n\n{report['machine']}; {report['when']}; Ray {ray.__version__}; hey, "
        f"{args.seconds} s per row; the first MNIST test digit, the full answer; mnist on the CPU, one ONNX "
        "Runtime thread per process (replica).\n",
        "| server | clients | p50 ms | p99 ms | req/s |",
        "|---|---:|---:|---:|---:|",
        *(f"| {r['server']} | {r['clients']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['rps']:.1f} |" for r in rows),
    ]
    write_report(args.out, report, "\n".join(lines) + "\n")
    return report


if __name__ == "__main__":
    main()
