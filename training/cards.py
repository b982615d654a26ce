"""The model card a model folder carries (its schema: model/card.py): every figure in it measured on
the folder's own graphs or during training, the serving section from what the dataset's model reads,
and the dimensions section (training/dimensions.py) from its test examples.
"""

import datetime
import json
from pathlib import Path
from typing import TypedDict

import numpy as np
import torch

from model import contract
from model.card import Dimensions, Preprocessing, build_serving
from training import data, dimensions
from training.config import TrainConfig, selection
from training.graphs import OPSET, PARITY_BATCHES, sha256, stored_weights
from training.pairs import MAX_SHIFT, iter_pairs

REPO = contract.MODELS_DIR.parent  # a card names a file in it by its place there (portable)

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


def portable(value):
    """A card's values with its file paths as any reader of it can take them: a path inside the repository
    by its place there (campaign/pack/load-1/data/mnist), any other absolute path by its name alone (a font
    file, a folder of the machine that trained the model), so that a card, and GET /model that serves it,
    names no folder of a machine."""
    if isinstance(value, dict):
        return {key: portable(v) for key, v in value.items()}
    if isinstance(value, list):
        return [portable(v) for v in value]
    if isinstance(value, str) and Path(value).is_absolute():
        path = Path(value)
        return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name
    return value


def write_card(model_dir: Path, card: dict) -> None:
    """Write a model folder's card (capsnet.json), its paths made portable."""
    (model_dir / contract.MODEL_CARD).write_text(json.dumps(portable(card), indent=2) + "\n")


def describe(model_dir: Path, data_dir: Path | None = None, per_class: int = dimensions.EXAMPLES) -> dict:
    """Write the serving section into a model folder's card from its own fields (cards written before
    cards carried it) and the dimensions section from its graphs (describe_dimensions); nothing else in
    the card changes."""
    model_dir = Path(model_dir)
    card = json.loads((model_dir / contract.MODEL_CARD).read_text())
    card[contract.SERVING] = build_serving(card["model_config"], **SERVED[card["dataset"]]).model_dump()
    card[contract.DIMENSIONS] = describe_dimensions(model_dir, card, data_dir, per_class)
    write_card(model_dir, card)
    print(f"{model_dir / contract.MODEL_CARD}: serving = {json.dumps(card[contract.SERVING])}")
    print(dimensions.table(Dimensions.model_validate(card[contract.DIMENSIONS])))
    return card


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
    model was trained on (its train_config's) where that folder is on this machine, else data/<dataset>.

    A one-object model reads its dataset's test set centred on its input size (centred_test_images: the
    affine model MNIST's digits on 40x40, so that the digit's own variation is measured, not its place on
    the canvas). The MultiMNIST model reads every MNIST test digit overlaid on a digit of another class as
    in section 6 (seed PAIR_SEED), each pair giving one example to each of its two classes: its decoder
    learnt to draw each digit of a pair alone from its capsule, so those capsules are the ones its
    dimensions describe; a lone digit on 36x36 is an input it never saw.
    """
    dataset, size = card["train_config"]["dataset"], card["model_config"]["image_size"]
    trained_on = card["train_config"].get("data_dir")  # a folder of the machine that trained it (portable's)
    folder = REPO / trained_on if trained_on else None
    data_dir = data_dir or (folder if folder and folder.is_dir() else data.DEFAULT_DIRS[dataset])
    test = data.load(data_dir)["test"]
    if card["dataset"] != "multimnist":
        where = "" if size == test.images.shape[-1] else f", each centred on {size}x{size}"
        return centred_test_images(card, data_dir), test.labels.numpy()[:, None], f"the {dataset} test set{where}"
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
