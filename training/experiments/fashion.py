"""Fashion-MNIST with dynamic routing (the QP-routing paper's Table II: 7.21% test error), shipped.

$ python -m training.experiments.fashion --epochs 4                 # reduced, CPU-sized
$ python -m training.experiments.fashion --epochs 50 --lr-decay 0.99

Trains with training/train.py's train() on data/fashion-mnist (fetched if missing; same architecture,
±2 px shifts, best epoch on 5,000 held-out training images), resuming OUT/last.pt when it is there (a
run that already has its epochs is only exported), exports the best checkpoint to models/fashion-mnist/
(contract.SHIPPED["fashion-mnist"]) with its card (accuracy measured on the ONNX graph), and writes
docs/results/fashion.json.
"""

import argparse
import sys
from pathlib import Path

import torch

from model import contract
from model.capsnet import CapsNetConfig
from training import data, export, train
from training.config import TrainConfig
from training.experiments import common
from training.fit import Run

PAPER_ERROR = 7.21  # % test error of dynamic routing ("DR"), Table II of the QP-routing paper
PAPER_EPOCHS = 50  # what we call a full run; the paper gives iterations with decay, not epochs


def parse_args(argv=None) -> argparse.Namespace:
    p = common.parser("fashion", __doc__, "fashion-mnist")
    p.add_argument("--model-dir", type=Path, default=contract.SHIPPED["fashion-mnist"])
    common.checkpoint_option(p, "export, measure and report")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    config = common.train_config(args, dataset="fashion-mnist", resume=(args.out / "last.pt").exists())
    if args.checkpoint:
        ckpt = torch.load(args.checkpoint, weights_only=True)
        run, checkpoint = Run.of_checkpoint(ckpt), args.checkpoint
        config = TrainConfig(**{**ckpt["train_config"], "data_dir": args.data_dir})
    else:
        _, run, _ = train.train(config, CapsNetConfig())
        checkpoint = args.out / "best.pt"
    data_dir = config.data_dir or data.fetch("fashion-mnist")
    card = export.export_checkpoint(checkpoint, args.model_dir, data_dir)
    rows = [
        common.row(
            "CapsNet r=3 + reconstruction",
            "Fashion-MNIST test error %",
            100 * (1 - card["test_accuracy"]),
            PAPER_ERROR,
            epochs=run.kept_epoch,
            train_images=run.kept_images,
            wall_seconds=run.train_seconds,
            reduced=run.epochs_run < PAPER_EPOCHS or bool(args.train_limit),
            model_version=card["version"],
        )
    ]
    flips = f", {config.hflip:.0%} of images mirrored left to right" if config.hflip else ""
    started = ", from trained weights (its train_config's init)" if config.init else ""
    common.write_result(
        "fashion",
        rows,
        setting=f"epoch {run.kept_epoch} of {run.epochs_run} ({run.selection}), {run.images_per_epoch:,} training "
        f"images per epoch, ±2 px shifts{flips}, LR {config.lr:g} x{config.lr_decay} per epoch, {run.precision}"
        f"{started}; error of the exported ONNX graph",
        paper_setting="batch 128, LR 0.001 decayed x0.96 every 1,000 iterations (run length not given)",
        hardware=run.hardware,
        command=common.command("training.experiments.fashion", argv),
        out_dir=args.results_dir,
        model_card=common.relative(args.model_dir / contract.MODEL_CARD),
        train_config=vars(config),
    )
    return card


if __name__ == "__main__":
    main()
    sys.exit(0)
