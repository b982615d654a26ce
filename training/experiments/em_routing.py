"""EM routing beside dynamic routing in the CapsNet body: MNIST learning curves at equal training images,
and EM's own spread loss against the margin loss (Hinton, Sabour & Frosst 2018, section 4.1).

$ python -m training.experiments.em_routing --train-limit 3200 --val-size 2000 --epochs 3 --batch-size 64
$ python -m training.experiments.em_routing --variants em --epochs 2 --batch-size 64 --lr-decay 0.99 \\
      --name em_routing_long                                            # all images: toward 98.5%

Trains each variant with training/train.py's train() on the same images, seed and schedule: only the
routing and the loss differ. Every epoch is validated on the held-out split, so the curve is validation
error against training images seen; the row is the kept epoch's test error. A variant whose run folder
holds a last.pt resumes from it: a finished run is read back, not trained again, and a copy of a 2-epoch
run's folder given --epochs 3 trains a third epoch. Writes runs/em_routing/<variant>/,
docs/results/<name>.json and docs/experiments/<name>.png.
"""

import argparse
import json
import sys
from pathlib import Path

from model.capsnet import CapsNetConfig
from training import train
from training.experiments import common

# name: (row label, CapsNetConfig fields, the paper's MNIST test error %)
VARIANTS: dict[str, tuple[str, dict, float | None]] = {
    "dynamic": ("CapsNet, dynamic routing, margin loss", {}, 0.25),  # Sabour et al., Table 1
    "em": ("CapsNet, EM routing, spread loss", {"routing": "em"}, 0.44),  # Hinton et al. 2018, MNIST
    "em-margin": ("CapsNet, EM routing, margin loss", {"routing": "em", "loss": "margin"}, None),
}


def trial(name: str, args: argparse.Namespace) -> dict:
    """Train (or read back) one variant; its curve, kept epoch and test error."""
    out = args.out / name
    config = common.train_config(args, out=str(out), resume=(out / "last.pt").exists())
    _, run, test = train.train(config, CapsNetConfig(**VARIANTS[name][1]))
    assert test is not None  # one process, rank 0: train returns the test result
    return {
        "curve": [
            [h["epoch"] * run.images_per_epoch, round(100 * (1 - h["val_acc"]), 2)]
            for h in run.history
            if "val_acc" in h
        ],
        "error": 100 * (1 - test["accuracy"]),
        **run.summary(),
    }


def save_plot(trials: dict[str, dict], path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for name, t in trials.items():
        images, errors = zip(*t["curve"], strict=True) if t["curve"] else ((), ())
        ax.plot(images, errors, "o-", label=VARIANTS[name][0].removeprefix("CapsNet, "))
    ax.set(
        xlabel="training images seen",
        ylabel="validation error %",
        yscale="log",
        title="MNIST, equal budgets" if len(trials) > 1 else "MNIST",
    )
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    common.save_figure(fig, path)


def parse_args(argv=None) -> argparse.Namespace:
    p = common.parser("em_routing", __doc__, "em_routing")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--name", default="em_routing", help="the result's name: docs/results/<name>.json")
    p.add_argument("--figure", type=Path, default=None, help="default: docs/experiments/<name>.png")
    args = p.parse_args(argv)
    args.figure = args.figure or common.REPO / "docs" / "experiments" / f"{args.name}.png"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    trials = {}
    for name in args.variants:
        print(f"--- {name}", flush=True)
        trials[name] = trial(name, args)
    rows = [
        common.row(
            VARIANTS[name][0],
            "MNIST test error %",
            t["error"],
            VARIANTS[name][2],
            epochs=t["kept_epoch"],
            train_images=t["train_images"],
            wall_seconds=t["train_seconds"],
            reduced=True,  # the papers train for hundreds of epochs
            variant=name,
            curve=t["curve"],
        )
        for name, t in trials.items()
    ]
    save_plot(trials, args.figure)
    images = f"the first {args.train_limit:,}" if args.train_limit else "all"
    ran = sorted({t["epochs_run"] for t in trials.values()})
    common.write_result(
        args.name,
        rows,
        setting=f"{'/'.join(map(str, ran))} of {args.epochs} epoch(s) on {images} training images, ±2 px shifts, "
        f"batch {args.batch_size}, Adam lr {args.lr:g} x {args.lr_decay:g} per epoch, seed {args.seed}, "
        f"{trials[args.variants[0]]['precision']}; curve: error on {args.val_size:,} held-out training images "
        "after each epoch; row: test error of the epoch kept on them",
        paper_setting="MNIST; Sabour et al. Table 1 (dynamic), Hinton et al. 2018 (EM): hundreds of epochs",
        hardware=trials[args.variants[0]]["hardware"],
        command=common.command("training.experiments.em_routing", argv),
        out_dir=args.results_dir,
        figure=common.relative(args.figure),
    )
    return {"rows": rows, "trials": trials}


if __name__ == "__main__":
    print(json.dumps(main()["rows"], indent=2))
    sys.exit(0)
