"""Export a trained CapsNet to ONNX (models/<dataset>/capsnet.onnx, decoder.onnx) and write its model card.

$ python -m training.export                                   # runs/mnist/best.pt -> models/mnist/
$ python -m training.export --checkpoint runs/fashion-mnist/best.pt   # -> models/fashion-mnist/
$ python -m training.export --checkpoint runs/x/best.pt --out-dir /tmp/m --no-evaluate
$ python -m training.export --reexport models/multimnist          # the same weights through this code
$ python -m training.export --describe models/multimnist          # (re)write the card's serving and dimensions

Both graphs have a dynamic batch axis and the names of model/contract.py. Like timm's onnx_export,
the export checks itself: ONNX Runtime must match PyTorch on real test images at batch sizes 1, 7 and
64 (max |diff| <= 1e-4, same argmax) or the export fails. The model card (capsnet.json) holds the
measured figures: test accuracy of the exported graph, parity, training provenance.
"""

import argparse
import datetime
import hashlib
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

import numpy as np
import torch
import torch.nn as nn

from model import contract
from model.capsnet import CapsNet, CapsNetConfig, capsule_length, mask_capsules
from model.card import Dimensions, Preprocessing, build_serving
from training import data, dimensions
from training.config import TrainConfig, selection
from training.evaluate import evaluate_onnx, load_checkpoint

OPSET = 18
PARITY_BATCHES = (1, 7, 64)
PARITY_TOL = 1e-4
DIGITS = [str(d) for d in range(10)]
FASHION = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]  # github.com/zalandoresearch/fashion-mnist#labels


# What each dataset's model is trained to read: its card's serving section (model/card.py) but for what
# the network's config says. The ink box is the object's longer side (px) in the model's input: MNIST's
# 20 px box; MultiMNIST's 23, the median longer side of the union of the two digits' ink over
# training-like pairs (two 20 px MNIST digits, each shifted by up to 4 px); Fashion-MNIST's products fill
# the 28 px frame (their longest edge resized to 28).
class Served(TypedDict):
    """build_serving's arguments but the model's config."""

    task: str
    preprocessing: Preprocessing
    classes: list[str]
    objects: int


SERVED: dict[str, Served] = {
    "mnist": Served(
        task="one handwritten digit",
        preprocessing=Preprocessing(kind="digit", ink_box=contract.INK_BOX),
        classes=DIGITS,
        objects=1,
    ),
    "fashion-mnist": Served(
        task="one garment or accessory on a plain background (Fashion-MNIST's classes)",
        preprocessing=Preprocessing(kind="garment", ink_box=28),
        classes=FASHION,
        objects=1,
    ),
    "multimnist": Served(
        task="two overlapping handwritten digits (section 6)",
        preprocessing=Preprocessing(kind="digit-pair", ink_box=23),
        classes=DIGITS,
        objects=2,
    ),
    "affine": Served(
        task="one handwritten digit anywhere on a 40x40 canvas, trained for robustness to affine "
        "transformations (section 5.2)",
        preprocessing=Preprocessing(kind="digit", ink_box=contract.INK_BOX),
        classes=DIGITS,
        objects=1,
    ),
}


class ExportedCapsNet(nn.Module):
    """image -> (lengths, capsules, routing, reconstruction, vote_lengths), contract.CAPSNET_OUTPUTS, and
    for dynamic routing (routing_iterations, logit_changes), contract.CAPSNET_ITERATION_OUTPUTS.

    vote_lengths = ||u_hat_j|i|| lets the service draw where each digit's support comes from
    (sum over the 32 primary types of c_ij ||u_hat_j|i|| on the 6x6 grid) without a second pass.
    Every routing fills the same outputs (model/routing.py): for em, lengths are the activations a_j,
    capsules the flattened 4x4 poses, routing the responsibilities R_ij and vote_lengths the
    Frobenius norms of the votes V_ij; for qp, routing is the learned b_ij (any sign, rows free).
    Dynamic routing's graphs also show Procedure 1 iteration by iteration, from the same forward
    (model/routing.py: RoutingIterations): the c_ij of every iteration (Eq. 3) and, per image, the mean
    |delta b_ij| = |u_hat_j|i . v_j| each adds to the logits (Fig. A.1).
    """

    def __init__(self, model: CapsNet):
        super().__init__()
        if model.decoder is None:
            raise ValueError(
                "the serving contract needs a reconstruction: export a model trained "
                "with its decoder (without --no-reconstruction)"
            )
        self.model = model
        c = model.config
        self.outputs = tuple(contract.capsnet_outputs(c.image_size, c.routing, c.routing_iters))

    def forward(self, image: torch.Tensor):
        out = self.model(image)
        outputs = out.lengths, out.capsules, out.routing, out.reconstruction, capsule_length(out.votes)
        return outputs if out.iterations is None else (*outputs, *out.iterations)


class ExportedDecoder(nn.Module):
    """capsules (already masked) -> reconstruction."""

    def __init__(self, model: CapsNet):
        super().__init__()
        if model.decoder is None:
            raise ValueError(
                "no decoder to export: export a model trained with its decoder (without --no-reconstruction)"
            )
        self.decoder = model.decoder

    def forward(self, capsules: torch.Tensor):
        return self.decoder(capsules)


def _export(module: nn.Module, example: torch.Tensor, path: Path, inputs, outputs) -> None:
    batch = torch.export.Dim("N", min=1, max=4096)
    # NOTE optimize=False: onnxscript's optimizer folds `x + 1e-8` away, dropping the epsilon inside
    # the square roots of squash and of the length (lengths then differ from PyTorch by up to
    # sqrt(eps) = 1e-4 and a zero capsule gives NaN). ONNX Runtime optimises the graph at load anyway.
    program = torch.onnx.export(
        module,
        (example,),
        dynamo=True,
        opset_version=OPSET,
        input_names=list(inputs),
        output_names=list(outputs),
        dynamic_shapes=({0: batch},),
        optimize=False,
        verbose=False,
    )
    assert program is not None  # dynamo=True returns the ONNXProgram (only the TorchScript exporter returns None)
    program.save(str(path))


def store_fp16_if_lossless(path: Path, min_size: int = 1024) -> bool:
    """Store the graph's large fp32 weights as fp16, each followed by a Cast back to fp32, when every
    one of them is exactly an fp16 value (weights from a compact fp16 checkpoint, tools/compact.py):
    half the file, and ONNX Runtime computes with the very same fp32 values (it folds the Casts at
    load). Returns whether it did; a graph with any weight that fp16 would round is left as it is."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path))
    large = [
        t for t in graph.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) >= min_size
    ]
    values = {t.name: numpy_helper.to_array(t) for t in large}
    if not large or any(not np.array_equal(v.astype(np.float16).astype(np.float32), v) for v in values.values()):
        return False
    casts = []
    for t in large:
        name = t.name
        t.CopyFrom(numpy_helper.from_array(values[name].astype(np.float16), f"{name}.fp16"))
        casts.append(
            onnx.helper.make_node("Cast", [f"{name}.fp16"], [name], to=onnx.TensorProto.FLOAT, name=f"{name}.cast")
        )
    nodes = casts + list(graph.graph.node)
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)
    onnx.save(graph, str(path))
    return True


def export(model: CapsNet, out_dir: Path) -> tuple[Path, Path]:
    """Write capsnet.onnx and decoder.onnx (example batch of 2 so no axis is specialised to 1), their
    weights stored as fp16 where that is lossless (store_fp16_if_lossless)."""
    model = model.eval().cpu()
    model = model.to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]  # stub omits memory_format
    out_dir.mkdir(parents=True, exist_ok=True)
    size, c = model.config.image_size, model.config
    capsnet_path, decoder_path = out_dir / contract.CAPSNET_ONNX, out_dir / contract.DECODER_ONNX
    exported = ExportedCapsNet(model).eval()
    with torch.no_grad():
        _export(exported, torch.rand(2, 1, size, size), capsnet_path, contract.CAPSNET_INPUTS, exported.outputs)
        _export(
            ExportedDecoder(model).eval(),
            torch.rand(2, c.num_classes, c.caps_dim),
            decoder_path,
            contract.DECODER_INPUTS,
            contract.DECODER_OUTPUTS,
        )
    for path in (capsnet_path, decoder_path):
        store_fp16_if_lossless(path)
    return capsnet_path, decoder_path


@torch.no_grad()
def check_parity(
    model: CapsNet,
    capsnet_path: Path,
    decoder_path: Path,
    images: np.ndarray,
    batches=PARITY_BATCHES,
    tol: float = PARITY_TOL,
) -> float:
    """Max |ORT - PyTorch| over every output (the iteration outputs too, for dynamic routing) at each batch
    size; raises if above tol or argmax differs."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(capsnet_path), providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(decoder_path), providers=["CPUExecutionProvider"])
    exported = ExportedCapsNet(model.eval().cpu())
    worst = 0.0
    for n in batches:
        x = images[:n, None].astype(np.float32) / 255.0
        ours = sess.run(list(exported.outputs), {contract.IMAGE: x})
        ref = exported(torch.from_numpy(x))
        masked = mask_capsules(ref[1], ref[0].argmax(1))
        (recon,) = dec.run(None, {contract.CAPSULES: masked.numpy()})
        pairs = [*list(zip(exported.outputs, ours, ref, strict=True)), ("decoder", recon, ref[3])]
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


def stored_weights(path: Path) -> str:
    """How a graph stores its weights: "fp32", or "fp16" (cast to fp32 in the graph, store_fp16_if_lossless)."""
    import onnx

    types = {t.data_type for t in onnx.load(str(path), load_external_data=False).graph.initializer}
    return "fp16" if onnx.TensorProto.FLOAT16 in types else "fp32"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def card_outputs(model_config: dict) -> dict[str, list]:
    """The card's `outputs`: the CapsNet graph's outputs and shapes for its model_config (contract.capsnet_outputs)."""
    outputs = contract.capsnet_outputs(
        model_config["image_size"], model_config["routing"], model_config["routing_iters"]
    )
    return {name: list(shape) for name, shape in outputs.items()}


def model_card(ckpt: dict, capsnet_path: Path, parity: float, result: dict | None, dataset: str | None = None) -> dict:
    """A model's card (model/card.py): every figure in it measured here or during training.

    Args:
        ckpt: a checkpoint written by training/fit.py (configs, history, provenance).
        result: the exported graph's test result (training.evaluate.summarise), or None.
        dataset: what the model reads when it is not the IDX set it was made from (MultiMNIST).
    """
    config = TrainConfig(**ckpt["train_config"])
    history = ckpt.get("history", [])
    kept: dict = next((h for h in history if h["epoch"] == ckpt["epoch"]), {})
    dataset = dataset or config.dataset
    shapes = contract.capsnet_shapes(ckpt["config"]["image_size"])
    card = {
        "name": f"capsnet-{dataset}",
        "version": sha256(capsnet_path)[:12],
        "dataset": dataset,
        "dataset_sha256": data.CHECKSUMS[config.dataset],  # MultiMNIST is made of MNIST
        "test_accuracy": result["accuracy"] if result else None,
        "test_errors": result["errors"] if result else None,
        "test_count": result["count"] if result else None,
        "misclassified": result["misclassified"] if result else None,
        "evaluated_with": "ONNX Runtime " + ",".join(result["providers"]) if result else None,
        "epochs": ckpt["epoch"],  # epochs trained into these weights
        "run_epochs": ckpt.get("epochs_run", config.epochs),  # of the run (planned: train_config's epochs)
        "selection": selection(config, ckpt.get("epochs_run")),
        "val_accuracy": kept.get("val_acc"),
        "val_history": [round(h["val_acc"], 4) for h in history if "val_acc" in h],
        "train_seconds": round(ckpt["train_seconds"], 1),
        "hardware": ckpt["hardware"],
        "precision": ckpt["precision"],
        "train_config": ckpt["train_config"],
        "model_config": ckpt["config"],
        "routing": ckpt["config"]["routing"],
        "routing_iters": ckpt["config"]["routing_iters"],
        "parameters": sum(v.numel() for v in ckpt["model"].values()),
        "stored_weights": stored_weights(capsnet_path) if capsnet_path.suffix == ".onnx" else None,
        "opset": OPSET,
        "parity_max_abs_diff": parity,
        "parity_batches": list(PARITY_BATCHES),
        "inputs": {k: list(shapes[k]) for k in contract.CAPSNET_INPUTS},
        "outputs": card_outputs(ckpt["config"]),
        "created": datetime.date.today().isoformat(),
    }
    card[contract.SERVING] = build_serving(ckpt["config"], **SERVED[dataset]).model_dump()
    return card


def describe(model_dir: Path, data_dir: Path | None = None, per_class: int = dimensions.EXAMPLES) -> dict:
    """Write the serving section into a model folder's card from its own fields (cards written before
    cards carried it) and the dimensions section from its graphs (describe_dimensions); nothing else in
    the card changes."""
    model_dir = Path(model_dir)
    card = json.loads((model_dir / contract.MODEL_CARD).read_text())
    card[contract.SERVING] = build_serving(card["model_config"], **SERVED[card["dataset"]]).model_dump()
    card[contract.DIMENSIONS] = describe_dimensions(model_dir, card, data_dir, per_class)
    (model_dir / contract.MODEL_CARD).write_text(json.dumps(card, indent=2) + "\n")
    print(f"{model_dir / contract.MODEL_CARD}: serving = {json.dumps(card[contract.SERVING])}")
    print(dimensions.table(Dimensions.model_validate(card[contract.DIMENSIONS])))
    return card


def export_with_card(
    model: CapsNet,
    ckpt: dict,
    out_dir: Path,
    parity_images: np.ndarray,
    measure: Callable[[Path], tuple[dict | None, dict]],
    dataset: str | None = None,
    data_dir: str | Path | None = None,
    **sections,
) -> dict:
    """Export a model to out_dir, check parity, measure the exported graph, write its card: the one way
    every model folder is made (training.export, the experiments, the fine-tune).

    Args:
        ckpt: the checkpoint the model's weights come from (training/fit.py's: configs, history, provenance).
        parity_images: (N, S, S) uint8 inputs for check_parity (N >= 64).
        measure: exported capsnet.onnx -> (its test result, the card's test figures, or None; fields the
            measurement adds to the card, e.g. a second test set's accuracy).
        dataset: what the model reads, when not the IDX set it was made from (SERVED's key).
        data_dir: the IDX files the card's dimensions are measured on (default: dimension_examples').
        sections: fields the caller adds to the card (its metric, its test set in words, its recipe).
    """
    capsnet_path, decoder_path = export(model, out_dir)
    parity = check_parity(model, capsnet_path, decoder_path, parity_images)
    print(f"exported {capsnet_path} and {decoder_path}; parity max |ORT - PyTorch| = {parity:.2e}")
    result, measured = measure(capsnet_path)
    if result:
        print(f"test accuracy (ONNX Runtime): {100 * result['accuracy']:.2f}% ({result['errors']} errors)")
    card = {**model_card(ckpt, capsnet_path, parity, result, dataset), **measured, **sections}
    card[contract.DIMENSIONS] = describe_dimensions(out_dir, card, data_dir)
    (out_dir / contract.MODEL_CARD).write_text(json.dumps(card, indent=2) + "\n")
    return card


def export_checkpoint(
    checkpoint: Path,
    out_dir: Path | None = None,
    data_dir: str | Path | None = None,
    evaluate: bool = True,
    triton: Path | None = None,
    **sections,
) -> dict:
    """Export a training checkpoint of an IDX dataset's model with its card (export_with_card), measured
    on the full test set.

    Args:
        out_dir: default: the dataset's place in contract.SHIPPED (models/<dataset>/).
        data_dir: the IDX files of the checkpoint's dataset (default data/<dataset>).
        evaluate: measure the full test set on the exported graph (the card's accuracy; else null).
        triton: also write a Triton model repository of the exported models there (tools/triton.py).
        sections: fields the caller adds to the card.
    """
    model, ckpt = load_checkpoint(checkpoint)
    dataset = ckpt["train_config"]["dataset"]
    out_dir = out_dir or contract.SHIPPED[dataset]
    test = data.load(data_dir or data.DEFAULT_DIRS[dataset])["test"]
    images, labels = test.images.numpy(), test.labels.numpy()
    card = export_with_card(
        model,
        ckpt,
        out_dir,
        images,
        lambda graph: (evaluate_onnx(graph, images, labels) if evaluate else None, {}),
        data_dir=data_dir,
        **sections,
    )
    if triton:
        from tools.triton import write_repository

        print("Triton model repository:", *write_repository(triton, {card["dataset"]: out_dir}))
    return card


def model_from_graphs(model_dir: Path) -> CapsNet:
    """The PyTorch model whose weights a model folder's capsnet.onnx holds, built from its card's
    model_config; weights stored as fp16 (store_fp16_if_lossless) come back as the fp32 they stand for.
    Every parameter must be found (a strict load), so a graph from other code fails here."""
    import onnx
    from onnx import numpy_helper

    card = json.loads((model_dir / contract.MODEL_CARD).read_text())
    model = CapsNet(CapsNetConfig(**card["model_config"]))
    prefix = "model."  # ExportedCapsNet's attribute
    state = {}
    for tensor in onnx.load(str(model_dir / contract.CAPSNET_ONNX)).graph.initializer:
        name = tensor.name.removesuffix(".fp16")
        if name.startswith(prefix) and name[len(prefix) :] in model.state_dict():
            state[name[len(prefix) :]] = torch.from_numpy(numpy_helper.to_array(tensor).astype(np.float32))
    model.load_state_dict(state)
    return model.eval()


def centred_test_images(card: dict, data_dir: str | Path | None = None) -> np.ndarray:
    """The test images of the dataset the model was trained on, centred on its input size (N, S, S) uint8."""
    dataset = card["train_config"]["dataset"]
    images = data.load(data_dir or data.DEFAULT_DIRS[dataset])["test"].images.numpy()
    pad = (card["model_config"]["image_size"] - images.shape[-1]) // 2
    return np.pad(images, ((0, 0), (pad, pad), (pad, pad)))


# The MultiMNIST pairs its dimensions are measured on (dimension_examples): every MNIST test digit on one partner.
PAIR_SEED = 0


def dimension_examples(card: dict, data_dir: str | Path | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """The test examples a model's dimensions are measured on (training/dimensions.py): images (N, S, S)
    uint8, their labels (N, objects) and what they are, in words. data_dir: default the IDX files the
    model was trained on (its train_config's), else data/<dataset>.

    A one-object model reads its dataset's test set centred on its input size (centred_test_images: the
    affine model MNIST's digits on 40x40, so that the digit's own variation is measured, not its place on
    the canvas). The MultiMNIST model reads every MNIST test digit overlaid on a digit of another class as
    in section 6 (seed PAIR_SEED), each pair giving one example to each of its two classes: its decoder
    learnt to draw each digit of a pair alone from its capsule, so those capsules are the ones its
    dimensions describe; a lone digit on 36x36 is an input it never saw.
    """
    dataset, size = card["train_config"]["dataset"], card["model_config"]["image_size"]
    data_dir = data_dir or card["train_config"].get("data_dir") or data.DEFAULT_DIRS[dataset]
    test = data.load(data_dir)["test"]
    if card["dataset"] != "multimnist":
        where = "" if size == test.images.shape[-1] else f", each centred on {size}x{size}"
        return centred_test_images(card, data_dir), test.labels.numpy()[:, None], f"the {dataset} test set{where}"
    from training.experiments.multimnist import MAX_SHIFT, iter_pairs  # it imports this module

    pairs = list(iter_pairs(test, 1, PAIR_SEED, batch_size=1000))
    images = (torch.cat([p.images[:, 0] for p in pairs]) * 255).round().to(torch.uint8).numpy()
    what = (
        f"MultiMNIST test pairs: every MNIST test digit overlaid on one of another class, shifts up to "
        f"{MAX_SHIFT} px, seed {PAIR_SEED}; a pair read right gives an example to each of its two classes"
    )
    return images, torch.cat([p.labels for p in pairs]).numpy(), what


def describe_dimensions(
    model_dir: Path, card: dict, data_dir: str | Path | None = None, per_class: int = dimensions.EXAMPLES
) -> dict:
    """The card's dimensions section of a model folder's graphs (training/dimensions.py), measured on
    dimension_examples."""
    images, labels, what = dimension_examples(card, data_dir)
    return dimensions.describe(
        model_dir / contract.CAPSNET_ONNX,
        model_dir / contract.DECODER_ONNX,
        images,
        labels,
        card[contract.SERVING]["classes"],
        card[contract.SERVING]["preprocessing"]["kind"],
        f"the first {per_class} of each class that the model reads right in {what}",
        per_class,
    )


def compare_graphs(old: Path, new: Path, images: np.ndarray, batch_size: int = 64) -> tuple[float, int]:
    """Max |new - old| over every output the two graphs share on images (N, S, S) uint8, and on how many
    the argmax of lengths differs."""
    import onnxruntime as ort

    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (old, new)]
    new_names = {o.name for o in sessions[1].get_outputs()}
    shared = [o.name for o in sessions[0].get_outputs() if o.name in new_names]
    lengths = shared.index(contract.LENGTHS)
    worst, differ = 0.0, 0
    for start in range(0, len(images), batch_size):
        x = images[start : start + batch_size, None].astype(np.float32) / 255.0
        a, b = (s.run(shared, {contract.IMAGE: x}) for s in sessions)
        worst = max(worst, *(float(np.abs(p - q).max()) for p, q in zip(a, b, strict=True)))
        differ += int((a[lengths].argmax(1) != b[lengths].argmax(1)).sum())
    return worst, differ


def reexport(model_dir: Path, data_dir: Path | None = None) -> dict:
    """Export a model folder's model again with this code, from its own graphs' weights (model_from_graphs).

    The new graphs replace the old ones only if they compute the same function: max |new - old| <=
    PARITY_TOL over every output both graphs have (compare_graphs; a graph from older code may lack the
    iteration outputs) on the full test set of the model's dataset (centred on its input size) and not
    one prediction changed; the card's measured figures then carry over, and it gets the new version,
    the export's parity, the new graph's outputs and a `reexport` record of the comparison.
    """
    model_dir = Path(model_dir)
    card = json.loads((model_dir / contract.MODEL_CARD).read_text())
    model, images = model_from_graphs(model_dir), centred_test_images(card, data_dir)
    with tempfile.TemporaryDirectory() as tmp:
        capsnet_path, decoder_path = export(model, Path(tmp))
        parity = check_parity(model, capsnet_path, decoder_path, images)
        worst, differ = compare_graphs(model_dir / contract.CAPSNET_ONNX, capsnet_path, images)
        if worst > PARITY_TOL or differ:
            raise AssertionError(
                f"the re-exported graph is not the same function: max |diff| {worst:.2e}, "
                f"{differ} of {len(images)} predictions changed; {model_dir} left as it was"
            )
        for path in (capsnet_path, decoder_path):
            shutil.copy(path, model_dir / path.name)
    card["reexport"] = {
        "previous_version": card["version"],
        "date": datetime.date.today().isoformat(),
        "images": f"the {len(images):,} {card['train_config']['dataset']} test images",
        "max_abs_diff_vs_previous": worst,
        "changed_predictions": differ,
    }
    card.update(
        version=sha256(model_dir / contract.CAPSNET_ONNX)[:12],
        parity_max_abs_diff=parity,
        opset=OPSET,
        stored_weights=stored_weights(model_dir / contract.CAPSNET_ONNX),
        outputs=card_outputs(card["model_config"]),
    )
    (model_dir / contract.MODEL_CARD).write_text(json.dumps(card, indent=2) + "\n")
    print(
        f"re-exported {model_dir}: {card['reexport']['previous_version']} -> {card['version']}, max |diff| "
        f"{worst:.2e} on {len(images):,} test images, no prediction changed; parity vs PyTorch {parity:.2e}"
    )
    return card


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m training.export", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, default=Path("runs/mnist/best.pt"))
    p.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="default: the dataset's place in contract.SHIPPED (models/<dataset>/)",
    )
    p.add_argument(
        "--data-dir", type=Path, default=None, help="IDX files for parity, the card's accuracy and its dimensions"
    )
    p.add_argument(
        "--no-evaluate",
        dest="evaluate",
        action="store_false",
        help="skip the full test-set evaluation (the card's accuracy is then null)",
    )
    p.add_argument(
        "--triton",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write a Triton model repository of the exported models (tools/triton.py)",
    )
    p.add_argument(
        "--reexport",
        type=Path,
        default=None,
        metavar="MODEL_DIR",
        help="export a model folder again from its own graphs' weights (after export code changes)",
    )
    p.add_argument(
        "--describe",
        type=Path,
        default=None,
        metavar="MODEL_DIR",
        help="write the card's serving section (input, preprocessing, classes, grid) from its fields and its "
        "dimensions section (what each capsule dimension does, measured on --data-dir's test set)",
    )
    args = p.parse_args(argv)
    if args.describe:
        return describe(args.describe, args.data_dir)
    if args.reexport:
        return reexport(args.reexport, args.data_dir)
    return export_checkpoint(args.checkpoint, args.out_dir, args.data_dir, args.evaluate, args.triton)


if __name__ == "__main__":
    main()
    sys.exit(0)
