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

from training.config import PRECISIONS, TrainConfig

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "docs" / "results"


def parser(prog: str, doc: str, out: str, lr_decay: float = 0.9) -> argparse.ArgumentParser:
    """The options every experiment has: data, training budget, schedule, hardware and outputs;
    train_config() turns them into the TrainConfig of training/fit.py."""
    t = TrainConfig()
    p = argparse.ArgumentParser(prog=f"python -m training.experiments.{prog}", description=doc.splitlines()[0])
    p.add_argument("--data-dir", default=None, help="IDX files (default: data/<dataset>, fetched if empty)")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training images (0: all)")
    p.add_argument("--val-size", type=int, default=t.val_size, help="training images held out for validation")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=t.batch_size)
    p.add_argument("--lr", type=float, default=t.lr)
    p.add_argument("--lr-decay", type=float, default=lr_decay, help="LR factor per epoch, applied per step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=t.device)
    p.add_argument("--precision", choices=PRECISIONS, default=t.precision, help="auto: bf16 where native")
    p.add_argument("--compile", action="store_true", help="torch.compile the step (CUDA graphs on CUDA)")
    p.add_argument("--eval-every", type=int, default=t.eval_every, help="epochs between validations")
    p.add_argument("--time-limit", type=float, default=t.time_limit,
                   help="seconds per training run; the epoch that passes it is the last (0: none)")
    p.add_argument("--out", type=Path, default=Path("runs") / out, help="checkpoints")
    p.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where <experiment>.json goes")
    return p


def checkpoint_option(p: argparse.ArgumentParser, does: str) -> None:
    """--checkpoint: skip training and use a run made elsewhere (e.g. brought back from a GPU machine
    as a compact copy, tools/compact.py); `does` says what the experiment then does with it."""
    p.add_argument("--checkpoint", type=Path, default=None, help=f"skip training: {does} this best.pt")


def train_config(args: argparse.Namespace, **overrides) -> TrainConfig:
    """The TrainConfig of the shared options; overrides set the rest (out, seed, dataset...)."""
    shared = ("data_dir", "train_limit", "val_size", "epochs", "batch_size", "lr", "lr_decay", "seed", "device",
              "precision", "compile", "eval_every", "time_limit")
    fields = {k: getattr(args, k) for k in shared}
    fields["out"] = str(args.out)
    return TrainConfig(**{**fields, **overrides})


def figure_option(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--figure", type=Path, default=REPO / "docs" / "experiments" / name)


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
