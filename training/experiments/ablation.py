"""Table 1's ablation on MNIST (routing 1 vs 3 iterations, reconstruction on vs off) and appendix A's
routing-logit convergence curve.

$ python -m training.experiments.ablation --train-limit 15000 --epochs 1    # reduced, CPU-sized
$ python -m training.experiments.ablation --epochs 50 --lr-decay 0.99       # toward the paper's setting

Trains the four CapsNets of Table 1 with training/train.py's train(), one trial per --seeds (same data
and schedule; only the routing iterations and the reconstruction differ), reports each variant's mean test error
and its spread over the trials as Table 1 does, then measures on test images, for the trained r=3
and r=1 networks, the mean |delta b_ij| that each routing iteration adds (routing.routing_logit_changes)
for 1..--max-iters iterations: the curve of Fig. A.1. Writes runs/ablation/<variant>/,
docs/results/ablation.json and docs/experiments/routing_convergence.png.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from model.capsnet import CapsNetConfig
from model.routing import routing_logit_changes
from training import data, train
from training.config import TrainConfig
from training.evaluate import load_checkpoint
from training.experiments import common

# Table 1, MNIST test error (%), mean of three trials; the baseline CNN has 0.39
VARIANTS = {  # name: (routing iterations, reconstruction, paper)
    "r1-no-recon": (1, False, 0.34),
    "r1-recon": (1, True, 0.29),
    "r3-no-recon": (3, False, 0.35),
    "r3-recon": (3, True, 0.25),
}


def run_dir(args: argparse.Namespace, name: str, seed: int) -> Path:
    return args.out / name / f"seed{seed}"


def variant_configs(name: str, args: argparse.Namespace, seed: int) -> tuple[TrainConfig, CapsNetConfig]:
    """The training run of one variant and seed: only the ablated switches differ between variants
    (and the seed, which sets the initialisation and the data order, between trials)."""
    iters, recon, _ = VARIANTS[name]
    out = run_dir(args, name, seed)
    config = common.train_config(args, seed=seed, out=str(out), resume=(out / "last.pt").exists())
    return config, CapsNetConfig(routing_iters=iters, reconstruction=recon)


def trial(name: str, args: argparse.Namespace, seed: int) -> dict:
    """Train (or resume) one trial; its kept epoch's test result, kept in OUT/test.json once measured."""
    config, model_config = variant_configs(name, args, seed)
    result_path = Path(config.out) / "test.json"
    if result_path.exists() and json.loads(result_path.read_text())["run_epochs"] == config.epochs:
        return json.loads(result_path.read_text())  # a trial that has its epochs is only read back
    _, run, test = train.train(config, model_config)
    assert test is not None  # one process, rank 0: train returns the test result
    result = {
        "run_epochs": config.epochs,
        "error": 100 * (1 - test["accuracy"]),
        **run.summary(),
    }
    result_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


@torch.no_grad()
def logit_changes(checkpoint: Path, images: torch.Tensor, max_iters: int) -> list[float]:
    """Fig. A.1 for one trained network: mean |delta b_ij| at iterations 1..max_iters on images."""
    model, _ = load_checkpoint(checkpoint, images.device.type)
    x = data.to_float(images)
    u = model.primary(torch.relu(model.conv1(x)))
    u_hat = torch.einsum("ijdk,bik->bijd", model.digits.W, u)
    return routing_logit_changes(u_hat, max_iters).tolist()


def save_plot(curves: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, ys in curves.items():
        ax.plot(range(1, len(ys) + 1), ys, "o-", label=label)
    ax.set(
        xlabel="routing iteration",
        ylabel="mean |Δb_ij|",
        yscale="log",
        title="Routing-logit change per iteration (Fig. A.1)",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    common.save_figure(fig, path)


def epochs_text(args: argparse.Namespace, ran: list[int]) -> str:
    """The trials' epochs in words: the planned count, and what ran where a time limit cut trials short."""
    if min(ran) == max(ran) == args.epochs:
        return f"{args.epochs} epoch(s)"
    return (
        f"up to {args.epochs} epochs ({min(ran)}-{max(ran)} ran: each trial stopped by its "
        f"{args.time_limit:g} s time limit)"
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = common.parser("ablation", __doc__, "ablation")
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[0, 1, 2],
        help="one trial per seed; the table shows their mean and standard deviation (paper: 3 trials)",
    )
    p.add_argument("--max-iters", type=int, default=10, help="iterations of the convergence curve")
    p.add_argument("--curve-images", type=int, default=1000, help="test images the curve averages over")
    common.figure_option(p, "routing_convergence.png")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    rows, ran = [], []
    for name in args.variants:
        trials = []
        for seed in args.seeds:
            print(f"--- {name}, seed {seed}", flush=True)
            trials.append(trial(name, args, seed))
        iters, recon, paper = VARIANTS[name]
        errors = [t["error"] for t in trials]
        ran += [t.get("epochs_run", t["run_epochs"]) for t in trials]
        spread = torch.tensor(errors).std().item() if len(errors) > 1 else None  # sample std, as for Table 1
        rows.append(
            common.row(
                f"CapsNet r={iters}, reconstruction {'on' if recon else 'off'}",
                "MNIST test error %",
                sum(errors) / len(errors),
                paper,
                epochs=trials[-1]["kept_epoch"],
                train_images=trials[-1]["train_images"],
                wall_seconds=sum(t["train_seconds"] for t in trials) / len(trials),
                variant=name,
                reduced=min(t.get("epochs_run", args.epochs) for t in trials) < 50 or bool(args.train_limit),
                std=None if spread is None else round(spread, 3),
                trials=[round(e, 2) for e in errors],
            )
        )

    test = data.load(args.data_dir or data.DEFAULT_DIRS["mnist"])["test"]
    images = test.images[: args.curve_images].to(args.device)
    curves = {
        f"trained with r={VARIANTS[n][0]}": logit_changes(
            run_dir(args, n, args.seeds[0]) / "best.pt", images, args.max_iters
        )
        for n in ("r3-recon", "r1-recon")
        if n in args.variants
    }
    save_plot(curves, args.figure)
    common.write_result(
        "ablation",
        rows,
        setting=f"{epochs_text(args, ran)} on {f'the first {args.train_limit:,}' if args.train_limit else 'all'} "
        f"training images, ±2 px shifts; {len(args.seeds)} trial(s) "
        f"(seeds {', '.join(map(str, args.seeds))}): "
        "mean test error of each trial's best epoch on validation ± sample std; wall time per trial",
        paper_setting="MNIST, ±2 px shifts, mean of 3 trials (Table 1)",
        hardware=trials[-1]["hardware"],
        command=common.command("training.experiments.ablation", argv),
        out_dir=args.results_dir,
        convergence={"images": len(images), "curves": curves},
        figure=common.relative(args.figure),
    )
    return {"rows": rows, "curves": curves}


if __name__ == "__main__":
    main()
    sys.exit(0)
