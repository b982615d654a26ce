"""What the experiments share: the optimiser schedule, the paper's numbers and their result files.

A result file (docs/results/<experiment>.json) holds one row per trained model: our number beside
the paper's, with the setting, hardware, epochs, training images and wall time of the run, and
whether the run was reduced (fewer images or epochs than the paper's). results.py renders them.
"""
import argparse
import datetime
import json
import math
import shlex
import sys
from pathlib import Path

import torch

from training import data

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "docs" / "results"


def parser(prog: str, doc: str, out: str) -> argparse.ArgumentParser:
    """The options every experiment has: data, training budget, schedule, device and outputs."""
    p = argparse.ArgumentParser(prog=f"python -m training.experiments.{prog}", description=doc.splitlines()[0])
    p.add_argument("--data-dir", type=Path, default=None, help="IDX files (default: data/<dataset>, fetched if empty)")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training images (0: all)")
    p.add_argument("--val-size", type=int, default=data.VAL_SIZE, help="training images held out for validation")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-decay", type=float, default=0.9, help="LR factor per epoch, applied per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=Path("runs") / out, help="checkpoints")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where <experiment>.json goes")
    return p


def figure_option(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--figure", type=Path, default=REPO / "docs" / "experiments" / name)


def load_splits(args: argparse.Namespace, dataset: str = "mnist") -> dict[str, data.Split]:
    """train/val/test on args.device, the training split cut to --train-limit."""
    splits = data.load(args.data_dir or data.fetch(dataset), val_size=args.val_size)
    if args.train_limit:
        train = splits["train"]
        splits["train"] = data.Split(train.images[:args.train_limit], train.labels[:args.train_limit])
    return {k: v.to(args.device) for k, v in splits.items()}


def train_argv(args: argparse.Namespace, seed: int | None = None) -> list[str]:
    """The shared options as training/train.py's command line (the experiments that reuse it)."""
    argv = ["--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr),
            "--lr-decay", str(args.lr_decay), "--train-limit", str(args.train_limit), "--val-size", str(args.val_size),
            "--seed", str(args.seed if seed is None else seed), "--device", args.device]
    return argv + (["--data-dir", str(args.data_dir)] if args.data_dir else [])


def adam(model: torch.nn.Module, steps_per_epoch: int, lr: float = 1e-3, lr_decay: float = 0.9):
    """Adam with the exponential decay of training/train.py: lr_decay per epoch, stepped per step."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    gamma = lr_decay ** (1 / max(1, steps_per_epoch))
    return optimizer, torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=gamma)


def steps(n_images: int, batch_size: int) -> int:
    return math.ceil(n_images / batch_size)


def command(prog: str, argv: list[str] | None) -> str:
    """The command line that produced a result, for the table's provenance."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python -m " + prog, *map(shlex.quote, args)])


def relative(path: Path) -> str:
    """path as the results show it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def row(model: str, metric: str, ours: float, paper: float | None, *, epochs: float, train_images: int,
        wall_seconds: float, reduced: bool, **extra) -> dict:
    """One line of the results table. `ours` and `paper` are percentages in the same metric."""
    return {"model": model, "metric": metric, "ours": round(ours, 2),
            "paper": paper, "epochs": epochs, "train_images": train_images,
            "wall_seconds": round(wall_seconds, 1), "reduced": reduced, **extra}


def write_result(name: str, rows: list[dict], *, setting: str, paper_setting: str, hardware: str,
                 command: str, out_dir: Path = RESULTS_DIR, **extra) -> Path:
    """Write docs/results/<name>.json (what results.py turns into the table)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    record = {"experiment": name, "setting": setting, "paper_setting": paper_setting, "hardware": hardware,
              "command": command, "created": datetime.date.today().isoformat(), "rows": rows, **extra}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
