"""What the experiments share: their options (as a TrainConfig for training/fit.py) and their result files.

A result file (docs/results/<experiment>.json) holds one row per trained model: our number beside
the paper's, with the setting, hardware, epochs, training images and wall time of the run, and
whether the run was reduced (fewer images or epochs than the paper's). results.py renders them.
"""

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

from training import cli
from training.config import PRECISIONS, TrainConfig

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "docs" / "results"


SHARED = (
    "data_dir",
    "train_limit",
    "val_size",
    "epochs",
    "batch_size",
    "lr",
    "lr_decay",
    "seed",
    "device",
    "precision",
    "compile",
    "eval_every",
    "time_limit",
)  # the TrainConfig fields every experiment takes


def parser(prog: str, doc: str, out: str, lr_decay: float = 0.9) -> argparse.ArgumentParser:
    """The options every experiment has: TrainConfig's SHARED fields (training/cli.py; short schedules
    decay faster), checkpoints in runs/<out> and the results' folder; train_config() builds the TrainConfig."""
    p = argparse.ArgumentParser(prog=f"python -m training.experiments.{prog}", description=doc.splitlines()[0])
    cli.add_options(p, TrainConfig, only=SHARED, defaults={"lr_decay": lr_decay}, choices={"precision": PRECISIONS})
    p.add_argument("--out", type=Path, default=Path("runs") / out, help="checkpoints")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where <experiment>.json goes")
    return p


def checkpoint_option(p: argparse.ArgumentParser, does: str) -> None:
    """--checkpoint: skip training and use a run made elsewhere (e.g. brought back from a GPU machine
    as a compact copy, training/compact.py); `does` says what the experiment then does with it."""
    p.add_argument("--checkpoint", type=Path, default=None, help=f"skip training: {does} this best.pt")


def train_config(args: argparse.Namespace, **overrides) -> TrainConfig:
    """The TrainConfig of the shared options; overrides set the rest (out, seed, dataset...)."""
    return cli.build(TrainConfig, args, **{"out": str(args.out), **overrides})


def figure_option(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--figure", type=Path, default=REPO / "docs" / "experiments" / name)


def save_figure(fig, path: Path) -> None:
    """Write a matplotlib figure as the experiments' PNGs are written (100 dpi, tight), then free it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def command(prog: str, argv: list[str] | None) -> str:
    """The command line that produced a result, for the table's provenance."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python -m " + prog, *map(shlex.quote, args)])


def relative(path: Path) -> str:
    """path as the results show it: relative to the repository when inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def row(
    model: str,
    metric: str,
    ours: float,
    paper: float | None,
    *,
    epochs: float,
    train_images: int,
    wall_seconds: float,
    reduced: bool,
    **extra,
) -> dict:
    """One line of the results table. `ours` and `paper` are percentages in the same metric."""
    return {
        "model": model,
        "metric": metric,
        "ours": round(ours, 2),
        "paper": paper,
        "epochs": epochs,
        "train_images": train_images,
        "wall_seconds": round(wall_seconds, 1),
        "reduced": reduced,
        **extra,
    }


def write_result(
    name: str,
    rows: list[dict],
    *,
    setting: str,
    paper_setting: str,
    hardware: str,
    command: str,
    out_dir: Path = RESULTS_DIR,
    **extra,
) -> Path:
    """Write docs/results/<name>.json (what results.py turns into the table)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    record = {
        "experiment": name,
        "setting": setting,
        "paper_setting": paper_setting,
        "hardware": hardware,
        "command": command,
        "created": datetime.date.today().isoformat(),
        "rows": rows,
        **extra,
    }
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
