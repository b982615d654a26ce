"""Two digits drawn large: the MultiMNIST model's reading of its held-out pairs as a person draws them,
against the same pairs at the model's own 36x36, through HTTP.

$ python -m benchmarks.drawn_pairs                         # starts `python -m app`, 400 pairs
$ python -m benchmarks.drawn_pairs --url http://host:8000 --limit 200

The pairs are the card's held-out set (benchmarks.served_models.test_set: every MNIST test digit over a
partner of another class, shifts up to 4 px, seed 2). Each is sent twice to POST /predict?model=multimnist
with preprocess=auto: as it is (36x36, white on black) and drawn large (black ink on white paper, 216x216,
each pixel 6x6 with bicubic edges, as a canvas or a photo gives it); right when the answer's two objects
are the pair's two digits. Also the median time of a drawn pair's answer (one client). Writes
benchmarks/results/drawn_pairs.json and .md. Not a test.
"""

import argparse
import io
import json
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image, ImageOps

from benchmarks.served_models import RESULTS, accuracy, test_set
from tests.harness import start_api

DRAWN = 216  # px: a pair drawn large, 6x the model's 36


def drawn_large(png: bytes, side: int = DRAWN) -> bytes:
    """A 36x36 pair (white on black PNG) as black ink on white paper, `side` px square."""
    image = ImageOps.invert(Image.open(io.BytesIO(png)).convert("L")).resize((side, side), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def median_ms(client: httpx.Client, files: list[bytes]) -> float:
    times = []
    for data in files:
        start = time.perf_counter()
        client.post(
            "/predict", params={"model": "multimnist", "include": ""}, files={"file": ("x.png", data, "image/png")}
        ).raise_for_status()
        times.append(1000 * (time.perf_counter() - start))
    return round(float(np.median(times)), 1)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.drawn_pairs", description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="a running API (default: start `python -m app` on --port)")
    p.add_argument("--port", type=int, default=8766)
    p.add_argument("--data-dir", type=Path, default=Path("data"), help="holds mnist/")
    p.add_argument("--limit", type=int, default=400, help="held-out pairs")
    p.add_argument("--out", type=Path, default=RESULTS / "drawn_pairs")
    args = p.parse_args(argv)
    from training.fit import cpu_model

    files, labels = test_set("multimnist", args.data_dir, args.limit)
    drawn = [drawn_large(f) for f in files]
    server = None if args.url else start_api(args.port)
    url = args.url or f"http://127.0.0.1:{args.port}"
    try:
        with httpx.Client(base_url=url, timeout=60) as client:
            result: dict = {
                "device": cpu_model(),
                "when": time.strftime("%Y-%m-%d %H:%M"),
                "pairs": len(files),
                "as_is_36": accuracy(client, "multimnist", files, labels, "auto"),
                f"drawn_{DRAWN}": accuracy(client, "multimnist", drawn, labels, "auto"),
                f"drawn_{DRAWN}_median_ms": median_ms(client, drawn[:50]),
                "as_is_36_median_ms": median_ms(client, files[:50]),
            }
    finally:
        if server:
            server.terminate()
            server.wait(30)
    result["drawn_over_as_is"] = round(result[f"drawn_{DRAWN}"]["accuracy"] / result["as_is_36"]["accuracy"], 3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    md = (
        f"MultiMNIST pairs drawn large ({result['device']}, {result['when']}, {len(files)} held-out pairs)\n\n"
        f"| input | both digits named | median ms |\n|---|---|---|\n"
        f"| 36x36 as is | {100 * result['as_is_36']['accuracy']:.1f}% | {result['as_is_36_median_ms']} |\n"
        f"| drawn {DRAWN}x{DRAWN}, black on white | {100 * result[f'drawn_{DRAWN}']['accuracy']:.1f}% | "
        f"{result[f'drawn_{DRAWN}_median_ms']} |\n\ndrawn / as is: {result['drawn_over_as_is']}\n"
    )
    args.out.with_suffix(".md").write_text(md)
    print(md)
    return result


if __name__ == "__main__":
    main()
