"""Every served model's held-out accuracy and latency through HTTP, as a client gets them.

$ python -m benchmarks.served_models                        # starts `python -m app` (every shipped model)
$ python -m benchmarks.served_models --url http://host:8000 # a running server
$ python -m benchmarks.served_models --limit 1000 --auto-limit 200

For each model (GET /models) its card's held-out test set is sent image by image as PNG files to
POST /predict?model=NAME, from 8 client threads:
  mnist, fashion-mnist   the 10,000 test images of the dataset (data/<dataset>, training.data fetch);
  multimnist             every MNIST test digit overlaid on one partner of another class, shifts up to
                         4 px, seed 2 (the card's set: training.pairs.iter_pairs);
                         right when the answer's two objects are the two digits;
  affine                 the affNIST-like set of the card (each test digit centred on 40x40, then one
                         random affine map, seed 2017: training.experiments.affine.test_sets).
Twice: preprocess=none (the image as the model takes it: the card's figure, now through JSON, PNG and
the batcher; multimnist and affine images are rounded to 8 bits on the way) and preprocess=auto (the
model's own preprocessing re-finds and re-fits the object) on the first --auto-limit images.
Latency: one client, sequential requests for the default answer (capsules, reconstruction(s),
routing maps), p50 and p90. Writes benchmarks/results/served_models.json and .md. Not a test.
"""

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from app.schemas import INCLUDE_DEFAULT
from tests.harness import encode, machine, start_api

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CLIENTS = 8
LATENCY_REQUESTS = 200


def test_set(name: str, data_dir: Path, limit: int) -> tuple[list[bytes], np.ndarray]:
    """The first `limit` images of a model's held-out set as PNG files, and their labels ((N,) or (N, 2))."""
    import torch

    from training import data

    dataset = "fashion-mnist" if name == "fashion-mnist" else "mnist"
    test = data.load(data_dir / dataset)["test"]
    if name in ("mnist", "fashion-mnist"):
        images, labels = test.images.numpy()[:limit], test.labels.numpy()[:limit]
    elif name == "multimnist":
        from training.pairs import iter_pairs

        batches = list(iter_pairs(test, per_digit=1, seed=2, batch_size=1000))
        images = torch.cat([b.images[:, 0] for b in batches]).numpy()[:limit]
        labels = torch.cat([b.labels for b in batches]).numpy()[:limit]
    else:
        from training.experiments.affine import test_sets

        images = test_sets(test, seed=2017)["affNIST-like"][:limit, 0].numpy()
        labels = test.labels.numpy()[:limit]
    return [encode(x) for x in images], labels


def right(answer: dict, label: np.ndarray) -> bool:
    if label.ndim:  # two digits: the answer's objects are exactly them
        return sorted(o["digit"] for o in answer["objects"]) == sorted(label.tolist())
    return answer["prediction"] == int(label)


def accuracy(client: httpx.Client, model: str, files: list[bytes], labels: np.ndarray, preprocess: str) -> dict:
    def ask(i: int) -> bool:
        r = client.post(
            "/predict",
            params={"model": model, "preprocess": preprocess, "include": ""},
            files={"file": ("x.png", files[i], "image/png")},
        )
        r.raise_for_status()
        return right(r.json(), labels[i])

    start = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        hits = list(pool.map(ask, range(len(files))))
    seconds = time.perf_counter() - start
    return {
        "preprocess": preprocess,
        "images": len(files),
        "accuracy": round(float(np.mean(hits)), 4),
        "errors": int(len(hits) - sum(hits)),
        "requests_per_s": round(len(files) / seconds, 1),
    }


def latency(client: httpx.Client, model: str, files: list[bytes]) -> dict:
    times = []
    for i in range(LATENCY_REQUESTS + 5):
        start = time.perf_counter()
        client.post(
            "/predict", params={"model": model}, files={"file": ("x.png", files[i % len(files)], "image/png")}
        ).raise_for_status()
        times.append(1000 * (time.perf_counter() - start))
    times = times[5:]  # the first few warm the connection
    return {
        "requests": LATENCY_REQUESTS,
        "p50_ms": round(float(np.percentile(times, 50)), 1),
        "p90_ms": round(float(np.percentile(times, 90)), 1),
        "include": ",".join(INCLUDE_DEFAULT),
    }


def table(result: dict) -> str:
    lines = [
        f"Served models through HTTP ({result['device']}, {result['when']}, {CLIENTS} client threads for "
        "accuracy, 1 for latency)",
        "",
        "| model | metric | card | HTTP, preprocess=none | HTTP, preprocess=auto | p50 / p90 ms | precision |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in result["models"].items():
        none, auto = m["runs"]
        lines.append(
            f"| {name} | {m['metric']} | {100 * m['card_accuracy']:.2f}% | {100 * none['accuracy']:.2f}% "
            f"({none['images']:,}) | {100 * auto['accuracy']:.2f}% ({auto['images']:,}) | "
            f"{m['latency']['p50_ms']} / {m['latency']['p90_ms']} | {m['precision']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.served_models", description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="a running API (default: start `python -m app` on --port)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="holds mnist/ and fashion-mnist/")
    p.add_argument("--limit", type=int, default=10_000, help="images per model with preprocess=none")
    p.add_argument("--auto-limit", type=int, default=2_000, help="images per model with preprocess=auto")
    p.add_argument("--out", type=Path, default=RESULTS / "served_models")
    args = p.parse_args(argv)

    server = None if args.url else start_api(args.port)
    url = args.url or f"http://127.0.0.1:{args.port}"
    result: dict = {
        "device": machine(),
        "cores": os.cpu_count(),
        "url": url,
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "models": {},
    }
    try:
        with httpx.Client(base_url=url, timeout=60, limits=httpx.Limits(max_connections=CLIENTS)) as client:
            for model in client.get("/models").json()["models"]:
                name = model["name"]
                files, labels = test_set(name, args.data_dir, args.limit)
                runs = [
                    accuracy(client, name, files, labels, "none"),
                    accuracy(client, name, files[: args.auto_limit], labels[: args.auto_limit], "auto"),
                ]
                entry = {
                    "metric": model["metric"],
                    "card_accuracy": model["accuracy"],
                    "test_set": model["test_set"],
                    "precision": model["precision"],
                    "provider": model["provider"],
                    "version": model["version"],
                    "runs": runs,
                    "latency": latency(client, name, files),
                }
                result["models"][name] = entry
                print(name, json.dumps(entry), flush=True)
    finally:
        if server:
            server.terminate()
            server.wait(30)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(table(result))
    print(table(result))
    return result


if __name__ == "__main__":
    main()
