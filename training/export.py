"""Export a trained CapsNet to ONNX (models/<dataset>/capsnet.onnx, decoder.onnx) and write its model card.

$ python -m training.export                                   # runs/mnist/best.pt -> models/mnist/
$ python -m training.export --checkpoint runs/fashion-mnist/best.pt   # -> models/fashion-mnist/
$ python -m training.export --checkpoint runs/x/best.pt --out-dir /tmp/m --no-evaluate
$ python -m training.export --reexport models/multimnist          # the same weights through this code
$ python -m training.export --describe models/*                   # (re)write the cards' serving and dimensions
$ python -m training.dimensions                                   # then the documents that quote them

Both graphs have a dynamic batch axis and the names of model/contract.py. Like timm's onnx_export,
the export checks itself: ONNX Runtime must match PyTorch on real test images at batch sizes 1, 7 and
64 (max |diff| <= 1e-4, same argmax) or the export fails. The model card (capsnet.json) holds the
measured figures: test accuracy of the exported graph, parity, training provenance.
"""

import argparse
import datetime
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from model import contract
from model.capsnet import CapsNet
from training import data
from training.cards import card_outputs, centred_test_images, describe, describe_dimensions, model_card, write_card
from training.evaluate import evaluate_onnx, load_checkpoint
from training.graphs import (
    OPSET,
    PARITY_TOL,
    check_parity,
    compare_graphs,
    export,
    model_from_graphs,
    sha256,
    stored_weights,
)
from training.triton import write_repository


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
    write_card(out_dir, card)
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
        triton: also write a Triton model repository of the exported models there (training/triton.py).
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
        print("Triton model repository:", *write_repository(triton, {card["dataset"]: out_dir}))
    return card


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
    write_card(model_dir, card)
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
        help="also write a Triton model repository of the exported models (training/triton.py)",
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
        nargs="+",
        default=None,
        metavar="MODEL_DIR",
        help="write each card's serving section (input, preprocessing, classes, grid) from its fields and its "
        "dimensions section (what each capsule dimension does, measured on --data-dir's test set)",
    )
    args = p.parse_args(argv)
    if args.describe:
        return {str(folder): describe(folder, args.data_dir) for folder in args.describe}
    if args.reexport:
        return reexport(args.reexport, args.data_dir)
    return export_checkpoint(args.checkpoint, args.out_dir, args.data_dir, args.evaluate, args.triton)


if __name__ == "__main__":
    main()
    sys.exit(0)
