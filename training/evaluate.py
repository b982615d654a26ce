"""Evaluate a CapsNet checkpoint or an exported ONNX model on a test set.

$ python -m training.evaluate --checkpoint runs/mnist/best.pt
$ python -m training.evaluate --onnx models/mnist/capsnet.onnx --json runs/mnist/eval.json

Reports accuracy, error count, the 10x10 confusion matrix (rows: true, columns: predicted) and the
indices of the misclassified test images.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from model import contract
from model.capsnet import CapsNet, CapsNetConfig
from training import data


def summarise(predictions: np.ndarray, labels: np.ndarray, num_classes: int = 10) -> dict:
    """Accuracy, errors, confusion matrix and misclassified indices from predicted/true classes."""
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(confusion, (labels, predictions), 1)
    wrong = np.flatnonzero(predictions != labels)
    return {
        "accuracy": float(1 - len(wrong) / len(labels)),
        "errors": len(wrong),
        "count": len(labels),
        "confusion": confusion.tolist(),
        "misclassified": wrong.tolist(),
    }


@torch.no_grad()
def evaluate(model: CapsNet, split: data.Split, batch_size: int = 500) -> dict:
    """Run the model (inference mode: decoder on the longest capsule) over a split."""
    was_training = model.training
    model.eval()
    preds, loss_sum = [], 0.0
    for start in range(0, len(split), batch_size):
        x = data.to_float(split.images[start : start + batch_size])
        y = split.labels[start : start + batch_size]
        out = model(x, y)  # true-label mask, so the loss is the training objective
        loss_sum += model.loss(out, x, y).item() * len(y)
        preds.append(out.lengths.argmax(1).cpu())
    model.train(was_training)
    result = summarise(torch.cat(preds).numpy(), split.labels.cpu().numpy(), model.config.num_classes)
    result["loss"] = loss_sum / len(split)
    return result


def evaluate_onnx(
    path: str | Path, images: np.ndarray, labels: np.ndarray, batch_size: int = 500, providers: list[str] | None = None
) -> dict:
    """Run an exported capsnet.onnx under ONNX Runtime on images (N, H, W): uint8 as in the IDX files,
    or floats in [0, 1] (generated test sets such as the affine experiment's)."""
    sess = ort.InferenceSession(str(path), providers=providers or ["CPUExecutionProvider"])
    preds = []
    for start in range(0, len(images), batch_size):
        x = images[start : start + batch_size, None].astype(np.float32)
        x = x / 255.0 if images.dtype == np.uint8 else x
        (lengths,) = sess.run([contract.LENGTHS], {contract.IMAGE: x})
        preds.append(lengths.argmax(1))
    result = summarise(np.concatenate(preds), labels)
    result["providers"] = sess.get_providers()
    return result


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple[CapsNet, dict]:
    ckpt = torch.load(path, map_location=device, weights_only=True)
    model = CapsNet(CapsNetConfig(**ckpt["config"])).to(device)
    model.load_state_dict(ckpt["model"])
    return model.eval(), ckpt


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m training.evaluate", description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", type=Path)
    src.add_argument("--onnx", type=Path)
    p.add_argument("--dataset", choices=data.DATASETS, default="mnist")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--split", choices=("test", "val"), default="test")
    p.add_argument("--json", type=Path, default=None, help="also write the full result here")
    args = p.parse_args(argv)
    split = data.load(args.data_dir or data.DEFAULT_DIRS[args.dataset])[args.split]
    if args.checkpoint:
        model, _ = load_checkpoint(args.checkpoint)
        result = evaluate(model, split)
    else:
        result = evaluate_onnx(args.onnx, split.images.numpy(), split.labels.numpy())
    print(f"{args.split}: accuracy {100 * result['accuracy']:.2f}% ({result['errors']} errors of {result['count']})")
    print("confusion (rows true, cols predicted):")
    for row in result["confusion"]:
        print(" ".join(f"{v:5d}" for v in row))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
    sys.exit(0)
