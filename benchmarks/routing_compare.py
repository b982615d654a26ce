"""Compare the routings (dynamic, em, qp-l2, qp-l1): test error, training images/s, time per step.

$ python -m benchmarks.routing_compare                                  # every dataset x routing
$ python -m benchmarks.routing_compare --datasets mnist --routings em   # one cell; merges into the JSON
$ python -m benchmarks.routing_compare --report                         # only rewrite the markdown

Each cell trains with training/train.py's train() (routing R) in-process on the same data and hardware
(REDUCED by default: the first TRAIN_LIMIT training images, EPOCHS epochs, the full 10,000-image
test set) and records the last epoch's test error, training images/s and seconds per step. A timing
cell (--timing) measures the median training step of each routing at batch 128 on fixed synthetic
images, steadier than a whole epoch on a shared machine. Results: benchmarks/results/routing_compare.json
and .md, beside the numbers the seed paper reports (qp-regularized-routing.txt, Table II, full
training); a reduced run is labelled as such wherever it is shown. A benchmark, not a test.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from model.capsnet import CapsNet, CapsNetConfig
from model.routing import ROUTINGS, QPRouting
from training import fit, train
from training.config import TrainConfig

DATASETS = ("mnist", "fashion-mnist")
TRAIN_LIMIT = 10_000  # reduced: the first 10k of the 55k training images (5k are held out for val)
EPOCHS = 1
BATCH = 128
VAL_SIZE = 1000  # held out from training; only picks best.pt, so small here
TIMING_STEPS, TIMING_WARMUP = 10, 2
RESULTS = Path(__file__).parent / "results"
OUT_JSON = RESULTS / "routing_compare.json"
RUNS = Path("runs/routing_compare")

# Table II of the seed (test error %, full training; "DR" = dynamic routing). It reports no EM figure.
SEED_ERROR = {
    "mnist": {"dynamic": 0.34, "qp-l2": 0.35, "qp-l1": 0.32},
    "fashion-mnist": {"dynamic": 7.21, "qp-l2": 7.01, "qp-l1": 6.76},
}
SEED_SPEED = 'qp: "each step can save at least 20% runtime compared to dynamic routing" (Fig. 4)'


def hardware(device: str) -> str:
    return f"{fit.hardware(device)}, torch {torch.__version__}"


def train_cell(dataset: str, routing: str, args: argparse.Namespace) -> dict:
    """One training run (reduced by default); the figures of its kept (best on validation) epoch."""
    config = TrainConfig(
        dataset=dataset,
        train_limit=args.train_limit,
        epochs=args.epochs,
        batch_size=BATCH,
        val_size=args.val_size,
        lr_decay=args.lr_decay,
        device=args.device,
        compile=args.compile,
        eval_every=args.eval_every,
        time_limit=args.time_limit,
        out=str(RUNS / f"{dataset}-{routing}"),
    )
    t0 = time.time()
    _, run, test = train.train(config, CapsNetConfig(routing=routing))
    assert test is not None  # one process: rank 0, which measures the test set
    record = next(h for h in run.history if h["epoch"] == run.kept_epoch)
    return {
        "dataset": dataset,
        "routing": routing,
        "reduced": args.train_limit > 0 or run.epochs_run < 50,
        "train_images": args.train_limit,
        "epochs": run.epochs_run,
        "kept_epoch": run.kept_epoch,
        "batch": BATCH,
        "precision": run.precision,
        "compiled": config.compile,
        "time_limit": config.time_limit,
        "test_error_pct": 100 * (1 - test["accuracy"]),
        "test_errors": test["errors"],
        "val_error_pct": 100 * (1 - record["val_acc"]),
        "train_images_per_s": record["train_images_per_s"],
        "step_seconds": BATCH / record["train_images_per_s"],
        "wall_seconds": time.time() - t0,
        "parameters": CapsNet(CapsNetConfig(routing=routing)).num_params(),
        "hardware": hardware(args.device),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def timing_cell(routing: str, device: str) -> dict:
    """Median seconds of a full training step (forward, loss, backward, Adam, + qp's routing step)."""
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(routing=routing)).to(device)
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.rand(BATCH, 1, 28, 28, device=device), torch.randint(0, 10, (BATCH,), device=device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for i in range(TIMING_WARMUP + TIMING_STEPS):
        sync()
        t0 = time.perf_counter()
        out = model(x, y)
        loss = model.loss(out, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if isinstance(qp := model.digits.routing, QPRouting):
            qp.ascend(out.votes.detach(), y, 1e-5)
        sync()
        if i >= TIMING_WARMUP:
            times.append(time.perf_counter() - t0)
    step = sorted(times)[len(times) // 2]
    return {
        "routing": routing,
        "batch": BATCH,
        "median_step_seconds": step,
        "images_per_s": BATCH / step,
        "steps": TIMING_STEPS,
        "hardware": hardware(device),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def render(results: dict) -> str:
    """The markdown table: our measured numbers beside the seed's."""
    cells = results.get("cells", {})
    budgets = sorted({c.get("time_limit", 0) for c in cells.values()})
    sizes = sorted({c["train_images"] for c in cells.values()})
    data = ", ".join(f"the first {n:,} training images" if n else "all 55,000 training images" for n in sizes)
    budget = (
        f"the same time budget for every cell ({', '.join(f'{b:g} s' for b in budgets)} of training and "
        "validation): a faster routing runs more epochs in it (the `epochs` column)"
        if any(budgets)
        else "the same number of epochs for every cell"
    )
    lines = [
        "# Routing comparison",
        "",
        "Measured by `python -m benchmarks.routing_compare` (benchmarks/routing_compare.py): "
        f"{data or 'none yet'}, batch {BATCH}, Adam 1e-3, {budget}; the best epoch on 5,000 held-out "
        "images, measured on the full 10,000-image test set. **Reduced runs**: the seed's numbers "
        "come from full trainings; compare directions, not errors.",
        "",
    ]
    if cells:
        lines += [
            "| dataset | routing | test error % (ours, reduced) | seed test error % (full) | epochs | "
            "train images/s | s/step | step time vs dynamic | parameters | wall s |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for dataset in DATASETS:
            base = cells.get(f"{dataset}/dynamic")
            for routing in ROUTINGS:
                c = cells.get(f"{dataset}/{routing}")
                if c is None:
                    continue
                seed = SEED_ERROR[dataset].get(routing)
                rel = f"{100 * (c['step_seconds'] / base['step_seconds'] - 1):+.0f}%" if base else "n/a"
                lines.append(
                    f"| {dataset} | {routing} | {c['test_error_pct']:.2f} (reduced) | "
                    f"{'—' if seed is None else f'{seed:.2f}'} | {c['epochs']} | "
                    f"{c['train_images_per_s']:.1f} | {c['step_seconds']:.3f} | {rel} | "
                    f"{c['parameters']:,} | {c['wall_seconds']:.0f} |"
                )
        hw = {c["hardware"] for c in cells.values()}
        lines += [
            "",
            f"Hardware: {'; '.join(sorted(hw))}. Images/s and s/step are of the training "
            "epoch (evaluation excluded) on a machine shared with other jobs.",
        ]
    timing = results.get("timing", {})
    if timing:
        base = timing.get("dynamic")
        lines += [
            "",
            "## Time per training step (synthetic batch of 128, median of "
            f"{TIMING_STEPS} after {TIMING_WARMUP} warm-up)",
            "",
            "| routing | median s/step | images/s | vs dynamic |",
            "|---|---|---|---|",
        ]
        for routing in ROUTINGS:
            t = timing.get(routing)
            if t is None:
                continue
            rel = f"{100 * (t['median_step_seconds'] / base['median_step_seconds'] - 1):+.0f}%" if base else "n/a"
            lines.append(f"| {routing} | {t['median_step_seconds']:.3f} | {t['images_per_s']:.1f} | {rel} |")
        lines += ["", f"Seed: {SEED_SPEED} (their hardware, TensorFlow)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.routing_compare", description=__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", choices=DATASETS, default=list(DATASETS))
    p.add_argument("--routings", nargs="+", choices=ROUTINGS, default=list(ROUTINGS))
    p.add_argument("--train-limit", type=int, default=TRAIN_LIMIT, help="0: the whole training split")
    p.add_argument("--epochs", type=int, default=EPOCHS)
    p.add_argument("--val-size", type=int, default=VAL_SIZE, help="held-out training images (picks best.pt)")
    p.add_argument("--lr-decay", type=float, default=0.9, help="LR factor per epoch (0.9 suits short runs)")
    p.add_argument("--eval-every", type=int, default=1)
    p.add_argument("--time-limit", type=float, default=0.0, help="seconds per cell (0: none)")
    p.add_argument("--compile", action="store_true", help="torch.compile the step (CUDA graphs on CUDA)")
    p.add_argument("--results", type=Path, default=OUT_JSON, help="the JSON cells merge into (and its .md)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--timing", action="store_true", help="only the per-step timing of --routings")
    p.add_argument("--report", action="store_true", help="only rewrite the markdown from the JSON")
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text()) if args.results.exists() else {}
    if args.timing:
        for routing in args.routings:
            results.setdefault("timing", {})[routing] = timing_cell(routing, args.device)
            print(json.dumps(results["timing"][routing]))
    elif not args.report:
        for dataset in args.datasets:
            for routing in args.routings:
                cell = train_cell(dataset, routing, args)
                results.setdefault("cells", {})[f"{dataset}/{routing}"] = cell
                print(json.dumps(cell))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    args.results.with_suffix(".md").write_text(render(results))
    return results


if __name__ == "__main__":
    main()
