"""Parity between execution providers: the shipped graph on CUDA (or any provider) against the CPU.

$ python -m benchmarks.provider_parity                                   # CUDAExecutionProvider vs CPU
$ python -m benchmarks.provider_parity --provider CUDAExecutionProvider --model-dir models/mnist --out r.json

Runs every output of capsnet.onnx on the 1,000 committed MNIST test images (tests/fixtures) in
batches of 64 under both providers and reports the largest |difference| per output, whether the
predicted classes agree, and the providers each session really used, with the provider options
the service uses (app/engine.py's PROVIDER_OPTIONS) (ONNX Runtime falls back to
the CPU silently when a provider cannot start; that is reported, not hidden). A benchmark, not a
test: it needs the provider's hardware.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.engine import PROVIDER_OPTIONS
from model import contract

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mnist_test_1000.npz"
BATCH = 64


def outputs(session: ort.InferenceSession, images: np.ndarray) -> list[np.ndarray]:
    parts = [
        session.run(list(contract.CAPSNET_OUTPUTS), {contract.IMAGE: images[i : i + BATCH]})
        for i in range(0, len(images), BATCH)
    ]
    return [np.concatenate(p) for p in zip(*parts, strict=True)]


def parity(model_dir: Path, provider: str) -> dict:
    if provider == "CUDAExecutionProvider" and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    images = np.load(FIXTURE)["images"].astype(np.float32)[:, None] / 255.0
    path = str(model_dir / contract.CAPSNET_ONNX)
    cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    options = PROVIDER_OPTIONS.get(provider, {})  # the service's own (app/engine.py)
    other = ort.InferenceSession(path, providers=[(provider, options), "CPUExecutionProvider"])
    ref, got = outputs(cpu, images), outputs(other, images)
    diffs = {name: float(np.abs(a - b).max()) for name, a, b in zip(contract.CAPSNET_OUTPUTS, got, ref, strict=True)}
    return {
        "provider": provider,
        "options": options,
        "providers_in_use": other.get_providers(),
        "images": len(images),
        "max_abs_diff": diffs,
        "max_abs_diff_all": max(diffs.values()),
        "same_predictions": bool(np.array_equal(got[0].argmax(1), ref[0].argmax(1))),
        "onnxruntime": ort.__version__,
    }


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.provider_parity", description=__doc__.splitlines()[0])
    p.add_argument("--provider", default="CUDAExecutionProvider")
    p.add_argument("--model-dir", type=Path, default=contract.SHIPPED["mnist"])
    p.add_argument("--out", type=Path, default=None, help="also write the result here as JSON")
    args = p.parse_args(argv)
    result = parity(args.model_dir, args.provider)
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
