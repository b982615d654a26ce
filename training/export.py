"""Export a trained CapsNet to ONNX (model/capsnet.onnx, model/decoder.onnx) and write its model card.

$ python -m training.export                                   # runs/mnist/best.pt -> model/
$ python -m training.export --checkpoint runs/fashion-mnist/best.pt   # -> model/fashion-mnist/
$ python -m training.export --checkpoint runs/x/best.pt --out-dir /tmp/m --no-evaluate

Both graphs have a dynamic batch axis and the names of model/contract.py. Like timm's onnx_export,
the export checks itself: ONNX Runtime must match PyTorch on real test images at batch sizes 1, 7 and
64 (max |diff| <= 1e-4, same argmax) or the export fails. The model card (capsnet.json) holds the
measured figures: test accuracy of the exported graph, parity, training provenance.
"""
import argparse
import datetime
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from model import contract
from model.capsnet import CapsNet, capsule_length, mask_capsules
from training import data
from training.evaluate import evaluate_onnx, load_checkpoint

OPSET = 18
PARITY_BATCHES = (1, 7, 64)
PARITY_TOL = 1e-4


class ExportedCapsNet(nn.Module):
    """image -> (lengths, capsules, routing, reconstruction, vote_lengths), contract.CAPSNET_OUTPUTS.

    vote_lengths = ||u_hat_j|i|| lets the service draw where each digit's support comes from
    (sum over the 32 primary types of c_ij ||u_hat_j|i|| on the 6x6 grid) without a second pass.
    Every routing fills the same outputs (model/routing.py): for em, lengths are the activations a_j,
    capsules the flattened 4x4 poses, routing the responsibilities R_ij and vote_lengths the
    Frobenius norms of the votes V_ij; for qp, routing is the learned b_ij (any sign, rows free).
    """

    def __init__(self, model: CapsNet):
        super().__init__()
        if model.decoder is None:
            raise ValueError("the serving contract needs a reconstruction: export a model trained "
                             "with its decoder (without --no-reconstruction)")
        self.model = model

    def forward(self, image: torch.Tensor):
        out = self.model(image)
        return out.lengths, out.capsules, out.routing, out.reconstruction, capsule_length(out.votes)


class ExportedDecoder(nn.Module):
    """capsules (already masked) -> reconstruction."""

    def __init__(self, model: CapsNet):
        super().__init__()
        self.decoder = model.decoder

    def forward(self, capsules: torch.Tensor):
        return self.decoder(capsules)


def _export(module: nn.Module, example: torch.Tensor, path: Path, inputs, outputs) -> None:
    batch = torch.export.Dim("N", min=1, max=4096)
    # NOTE optimize=False: onnxscript's optimizer folds `x + 1e-8` away, dropping the epsilon inside
    # the square roots of squash and of the length (lengths then differ from PyTorch by up to
    # sqrt(eps) = 1e-4 and a zero capsule gives NaN). ONNX Runtime optimises the graph at load anyway.
    program = torch.onnx.export(
        module, (example,), dynamo=True, opset_version=OPSET, input_names=list(inputs),
        output_names=list(outputs), dynamic_shapes=({0: batch},), optimize=False, verbose=False,
    )
    program.save(str(path))


def export(model: CapsNet, out_dir: Path) -> tuple[Path, Path]:
    """Write capsnet.onnx and decoder.onnx (example batch of 2 so no axis is specialised to 1)."""
    model = model.eval().cpu()
    out_dir.mkdir(parents=True, exist_ok=True)
    size, c = model.config.image_size, model.config
    capsnet_path, decoder_path = out_dir / contract.CAPSNET_ONNX, out_dir / contract.DECODER_ONNX
    with torch.no_grad():
        _export(ExportedCapsNet(model).eval(), torch.rand(2, 1, size, size), capsnet_path,
                contract.CAPSNET_INPUTS, contract.CAPSNET_OUTPUTS)
        _export(ExportedDecoder(model).eval(), torch.rand(2, c.num_classes, c.caps_dim), decoder_path,
                contract.DECODER_INPUTS, contract.DECODER_OUTPUTS)
    return capsnet_path, decoder_path


@torch.no_grad()
def check_parity(model: CapsNet, capsnet_path: Path, decoder_path: Path, images: np.ndarray,
                 batches=PARITY_BATCHES, tol: float = PARITY_TOL) -> float:
    """Max |ORT - PyTorch| over every output at each batch size; raises if above tol or argmax differs."""
    import onnxruntime as ort
    sess = ort.InferenceSession(str(capsnet_path), providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(decoder_path), providers=["CPUExecutionProvider"])
    model = model.eval().cpu()
    worst = 0.0
    for n in batches:
        x = images[:n, None].astype(np.float32) / 255.0
        ours = sess.run(list(contract.CAPSNET_OUTPUTS), {contract.IMAGE: x})
        ref = ExportedCapsNet(model)(torch.from_numpy(x))
        masked = mask_capsules(ref[1], ref[0].argmax(1))
        (recon,) = dec.run(None, {contract.CAPSULES: masked.numpy()})
        pairs = list(zip(contract.CAPSNET_OUTPUTS, ours, ref)) + [("decoder", recon, ref[3])]
        for name, got, want in pairs:
            want = want.numpy()
            if got.shape != want.shape:
                raise AssertionError(f"{name}: ONNX shape {got.shape} != PyTorch {want.shape} at batch {n}")
            worst = max(worst, float(np.abs(got - want).max()))
        if not np.array_equal(ours[0].argmax(1), ref[0].numpy().argmax(1)):
            raise AssertionError(f"ONNX and PyTorch predict different classes at batch {n}")
    if worst > tol:
        raise AssertionError(f"ONNX differs from PyTorch by {worst:.2e} > {tol:.0e}")
    return worst


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_card(ckpt: dict, capsnet_path: Path, parity: float, result: dict | None) -> dict:
    """The shipped model's card (DESIGN.md): every figure in it measured here or during training."""
    history = ckpt.get("history", [])
    best = max(history, key=lambda h: h["val_acc"]) if history else {}
    dataset = ckpt.get("dataset", "mnist")
    shapes = contract.capsnet_shapes(ckpt["config"]["image_size"])
    val_size = int(ckpt.get("args", {}).get("val_size", data.VAL_SIZE))  # runs before --val-size used the default
    card = {
        "name": f"capsnet-{dataset}",
        "version": sha256(capsnet_path)[:12],
        "dataset": dataset,
        "dataset_sha256": data.CHECKSUMS[ckpt.get("source", dataset)],  # MultiMNIST is made of MNIST
        "test_accuracy": result["accuracy"] if result else None,
        "test_errors": result["errors"] if result else None,
        "test_count": result["count"] if result else None,
        "misclassified": result["misclassified"] if result else None,
        "evaluated_with": "ONNX Runtime " + ",".join(result["providers"]) if result else None,
        "epochs": ckpt.get("epoch"),  # epochs trained into these weights
        "run_epochs": int(ckpt.get("args", {}).get("epochs", ckpt.get("epoch") or 0)),  # of the run
        "selection": f"the epoch with the best validation accuracy ({val_size:,} held-out training images)",
        "val_accuracy": best.get("val_acc"),
        "val_history": [round(h["val_acc"], 4) for h in history],
        "train_seconds": round(ckpt.get("train_seconds", 0.0), 1),
        "hardware": ckpt.get("hardware"),
        "train_args": ckpt.get("args", {}),
        "routing": ckpt["config"].get("routing", "dynamic"),
        "routing_iters": ckpt["config"]["routing_iters"],
        "parameters": sum(v.numel() for v in ckpt["model"].values()),
        "opset": OPSET,
        "parity_max_abs_diff": parity,
        "parity_batches": list(PARITY_BATCHES),
        "inputs": {k: list(shapes[k]) for k in contract.CAPSNET_INPUTS},
        "outputs": {k: list(shapes[k]) for k in contract.CAPSNET_OUTPUTS},
        "created": datetime.date.today().isoformat(),
    }
    return card


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m training.export", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=Path("runs/mnist/best.pt"))
    p.add_argument("--out-dir", type=Path, default=None,
                   help="default: the dataset's place in contract.SHIPPED (model/, model/fashion-mnist/)")
    p.add_argument("--data-dir", type=Path, default=None, help="IDX files for parity and the card's accuracy")
    p.add_argument("--no-evaluate", dest="evaluate", action="store_false",
                   help="skip the full test-set evaluation (the card's accuracy is then null)")
    p.add_argument("--triton", type=Path, default=None, metavar="DIR",
                   help="also write a Triton model repository of the exported models (training/triton.py)")
    args = p.parse_args(argv)

    model, ckpt = load_checkpoint(args.checkpoint)
    dataset = ckpt.get("dataset", "mnist")
    data_dir = args.data_dir or data.DEFAULT_DIRS[dataset]
    out_dir = args.out_dir or contract.SHIPPED[dataset].directory
    test = data.load(data_dir)["test"]
    images, labels = test.images.numpy(), test.labels.numpy()

    capsnet_path, decoder_path = export(model, out_dir)
    parity = check_parity(model, capsnet_path, decoder_path, images)
    print(f"exported {capsnet_path} and {decoder_path}; parity max |ORT - PyTorch| = {parity:.2e}")
    result = evaluate_onnx(capsnet_path, images, labels) if args.evaluate else None
    if result:
        print(f"test accuracy (ONNX Runtime): {100 * result['accuracy']:.2f}% ({result['errors']} errors)")
    card = model_card(ckpt, capsnet_path, parity, result)
    (out_dir / contract.MODEL_CARD).write_text(json.dumps(card, indent=2) + "\n")
    if args.triton:
        from training.triton import write_repository
        print("Triton model repository:", *write_repository(args.triton, out_dir))
    return card


if __name__ == "__main__":
    main()
    sys.exit(0)
