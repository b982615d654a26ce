"""An int8 CapsNet for CPUs: static QDQ quantisation of the two convolutions, measured before it ships.

$ python -m training.quantize                      # models/mnist/ -> capsnet.int8.onnx there, the card's `int8`
$ python -m training.quantize --model-dir models/fashion-mnist

After the routing became matmuls (model/routing.py:digit_routing), PrimaryCaps' 9x9 convolution
(256 -> 256 channels, 382 MFLOP per image) is most of the CPU's time. ONNX Runtime's static
quantisation rewrites conv1 and PrimaryCaps as QuantizeLinear/DequantizeLinear around the Conv
(QDQ), which its CPU provider fuses into integer convolutions: weights int8, symmetric, one scale per
output channel; activations uint8, one scale per tensor, their ranges calibrated (min/max) on
training images. The capsule layers stay fp32: s_j sums 1152 votes (Eq. 2) and the routing logits
accumulate agreements (Procedure 1), where 8 bits would round the evidence away.

The graph ships (the card's int8.shipped) only if its accuracy on the full test set is within
MAX_ACCURACY_DROP of the fp32 graph's and it is faster than the fp32 graph at batch 1 and at batch 64
on the machine that measured it; the card says which machine, and the service uses it on CPUs by
default only then (app/settings.py, CAPSNET_PRECISION).
"""

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from model import contract
from training import data
from training.cards import write_card
from training.evaluate import evaluate_onnx
from training.fit import cpu_features, cpu_model
from training.graphs import compare_graphs, sha256, store_fp16_if_lossless

CALIBRATION_IMAGES = 1000  # the first training images (never the test set)
CALIBRATION_BATCH = 100
MAX_ACCURACY_DROP = 0.0005  # 0.05 points of test accuracy
TIMED_BATCHES = {1: 200, 64: 10}  # batch size -> timed runs of each graph, interleaved


class _Calibration:
    """onnxruntime.quantization.CalibrationDataReader over uint8 images (N, H, W)."""

    def __init__(self, images: np.ndarray):
        self._batches = iter(range(0, len(images), CALIBRATION_BATCH))
        self.images = images

    def get_next(self) -> dict | None:
        start = next(self._batches, None)
        if start is None:
            return None
        return {contract.IMAGE: self.images[start : start + CALIBRATION_BATCH, None].astype(np.float32) / 255.0}


def quantize(fp32: Path, out: Path, calibration: np.ndarray) -> None:
    """Write the QDQ int8 graph of fp32 (capsnet.onnx) to out.

    The fp32 graph is first prepared as ONNX Runtime advises (quant_pre_process: shape inference and
    the basic optimisations, which fold the Casts of fp16-stored weights into fp32 initialisers, so
    the quantiser sees the convolutions' weights). Weights the quantiser leaves in fp32 are stored as
    fp16 again where that is lossless (training/export.py).
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory() as tmp:
        prepared = Path(tmp) / "prepared.onnx"
        # symbolic shape inference cannot read the exporter's Constant nodes; ONNX's own inference can
        quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
        quantize_static(
            str(prepared),
            str(out),
            _Calibration(calibration),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=["Conv"],
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
        )
    store_fp16_if_lossless(out)


def time_graphs(paths: dict[str, Path], batches: dict[int, int] = TIMED_BATCHES) -> dict[str, dict[int, float]]:
    """Median ms of session.run (all outputs) per graph and batch size, the graphs interleaved so that
    both see the same machine load; sessions as the service makes them (threads not spinning)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    sessions = {
        name: ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for name, p in paths.items()
    }
    size = sessions[next(iter(sessions))].get_inputs()[0].shape[-1]
    times: dict[str, dict[int, list[float]]] = {name: {n: [] for n in batches} for name in sessions}
    for n, repeats in batches.items():
        x = np.random.default_rng(0).random((n, 1, size, size), np.float32)
        for session in sessions.values():
            session.run(None, {contract.IMAGE: x})
        for _ in range(repeats):
            for name, session in sessions.items():
                start = time.perf_counter()
                session.run(None, {contract.IMAGE: x})
                times[name][n].append(1000 * (time.perf_counter() - start))
    return {name: {n: round(float(np.median(t)), 3) for n, t in per.items()} for name, per in times.items()}


def ships(accuracy: dict[str, float], timing: dict[str, dict[int, float]]) -> bool:
    """The rule: the int8 graph's test accuracy within MAX_ACCURACY_DROP of the fp32 graph's (to the 9th
    decimal, so that 0.9960 - 0.9955 is 0.05 points, not a float's hair more) and its session.run faster
    at every timed batch."""
    drop = round(accuracy["fp32"] - accuracy["int8"], 9)
    return drop <= MAX_ACCURACY_DROP and all(timing["int8"][n] < timing["fp32"][n] for n in TIMED_BATCHES)


def quantize_model(model_dir: Path, data_dir: Path | None = None, calibration_images: int = CALIBRATION_IMAGES) -> dict:
    """Quantise a model folder's capsnet.onnx, measure it beside the fp32 graph, record it in the card."""
    card = json.loads((model_dir / contract.MODEL_CARD).read_text())
    if card["model_config"]["image_size"] != contract.IMAGE_SIZE:
        raise SystemExit(
            f"{model_dir}: the test set here is {contract.IMAGE_SIZE}x{contract.IMAGE_SIZE} digits; "
            f"this model reads {card['model_config']['image_size']}x{card['model_config']['image_size']}"
        )
    dataset = card["train_config"]["dataset"]
    splits = data.load(data_dir or data.DEFAULT_DIRS[dataset], val_size=0)  # "train": all, in file order
    fp32, int8 = model_dir / contract.CAPSNET_ONNX, model_dir / contract.CAPSNET_INT8_ONNX
    quantize(fp32, int8, splits["train"].images.numpy()[:calibration_images])

    test = splits["test"]
    results = {
        name: evaluate_onnx(p, test.images.numpy(), test.labels.numpy()) for name, p in (("fp32", fp32), ("int8", int8))
    }
    max_diff, changed = compare_graphs(fp32, int8, test.images.numpy())
    timing = time_graphs({"fp32": fp32, "int8": int8})
    card["int8"] = {
        "file": contract.CAPSNET_INT8_ONNX,
        "version": sha256(int8)[:12],
        "quantized": "conv1 and PrimaryCaps: int8 weights per output channel, uint8 activations per tensor "
        "(QDQ, ONNX Runtime static quantisation); the capsule layers and the decoder in fp32",
        "calibration": f"min/max over the first {calibration_images:,} {dataset} training images (file order)",
        "test_accuracy": results["int8"]["accuracy"],
        "test_errors": results["int8"]["errors"],
        "misclassified": results["int8"]["misclassified"],
        "fp32_test_accuracy": results["fp32"]["accuracy"],
        "changed_predictions": changed,  # test images whose class differs from the fp32 graph's
        "max_abs_diff_vs_fp32": max_diff,  # over every output on the test set
        "session_run_ms": {f"batch_{n}": {name: timing[name][n] for name in timing} for n in TIMED_BATCHES},
        "measured_on": cpu_features(),  # accuracy and timings: int8 kernels differ between CPUs
        "timed_on": f"{cpu_model()}, ONNX Runtime CPUExecutionProvider, default threads",
        "shipped": ships({name: r["accuracy"] for name, r in results.items()}, timing),
        "rule": f"shipped if within {100 * MAX_ACCURACY_DROP:g} points of the fp32 graph's test accuracy and "
        f"faster at batch {' and '.join(map(str, TIMED_BATCHES))}",
        "created": datetime.date.today().isoformat(),
    }
    write_card(model_dir, card)
    if not card["int8"]["shipped"]:
        int8.unlink()
    return card["int8"]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m training.quantize", description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", type=Path, default=contract.SHIPPED["mnist"])
    p.add_argument("--data-dir", type=Path, default=None, help="IDX files of the model's dataset")
    p.add_argument("--calibration-images", type=int, default=CALIBRATION_IMAGES)
    args = p.parse_args(argv)
    result = quantize_model(args.model_dir, args.data_dir, args.calibration_images)
    print(json.dumps(result, indent=2))
    print(f"{'shipped' if result['shipped'] else 'not shipped (removed)'}: {args.model_dir / result['file']}")
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
