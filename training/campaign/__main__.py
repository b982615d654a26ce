"""python -m training.campaign: the commands of a GPU window (docs/training/campaign.md).

pack DIR               here: data, starting weights and font bank in loads of at most 56 MiB, and in the
                       first the packages the GPU machine lacks (site.py: PYTHONPATH=$PWD/DIR/load-1/site there)
launch                 there: start the supervisor and return (again: no second one)
status                 there: one line per run
collect OUT            there: status, results and best-so-far weights under OUT, any time
ship DIR [DIR ...]     here: export, compare on the ONNX graphs, ship what is better, ledger, docs
preflight              here: the whole cycle on the CPU with tiny budgets, every run of the plan
"""

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from model import contract
from training import data
from training.campaign import collect, ledger, pack, plan, ship, site, supervisor

WORK = Path("campaign/work")
PACK = Path("campaign/pack")


def data_dirs(mnist: Path | None, fashion: Path | None) -> dict[str, Path]:
    """The IDX folders (fetched into data/ when not given)."""
    return {"mnist": mnist or data.fetch("mnist"), "fashion-mnist": fashion or data.fetch("fashion-mnist")}


def preflight(
    dirs: dict[str, Path],
    scratch: Path,
    models_root: Path = contract.SHIPPED["mnist"].parent,
    names: list[str] | None = None,
    slots: int = 2,
    font_images: int = 60,
    robustness_n: int = 1,
    timeout: float = 900.0,
    log=print,
) -> dict:
    """pack -> launch -> status -> collect (twice) -> ship into a copy of the models, on the CPU, with the
    plan's runs at plan.SMOKE_TRAIN's sizes. Raises if any run fails; returns the ship's decisions."""
    loads = pack.pack(scratch / "pack", dirs, models_root, names, font_images=font_images, log=log)
    work = scratch / "work"
    pid = supervisor.launch(scratch / "pack", work, timeout / 60, slots, "cpu", smoke=True, names=names)
    log(f"supervisor {pid}; {len(loads)} load(s)")
    began = time.time()
    while supervisor.alive(pid) and time.time() - began < timeout:
        time.sleep(1.0)
        _reap(pid)
    lines = supervisor.status(work)
    log("\n".join(lines))
    state = supervisor.read_state(work)
    expected = [s.name for s in plan.by_name(names)]
    failed = [n for n in expected if state.get(n, {}).get("state") != "done"]
    if failed:
        raise RuntimeError(f"preflight: {', '.join(failed)} did not finish:\n" + "\n".join(lines))
    outs = [scratch / "out-1", scratch / "out-2"]
    for out in outs:
        collect.collect(work, out, log=log)
    models = scratch / "models"
    shutil.copytree(models_root, models, ignore=shutil.ignore_patterns("*.int8.onnx"))
    return ship.ship(
        outs, models, dirs, scratch / "ledger.json", pairs_per_digit=1, robustness_n=robustness_n, render=False, log=log
    )


def _reap(pid: int) -> None:
    """Collect the detached supervisor's exit status when this process started it (no zombie stays alive)."""
    with contextlib.suppress(ChildProcessError):  # not this process's child
        os.waitpid(pid, os.WNOHANG)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.campaign", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("pack", help="data, starting weights and font bank, in loads")
    c.add_argument("dir", type=Path, nargs="?", default=PACK)
    c.add_argument("--runs", default=None, help="comma list of the plan's runs (default: all)")
    c.add_argument("--mnist", type=Path, default=None, help="MNIST's IDX folder (default: fetched into data/mnist)")
    c.add_argument("--fashion", type=Path, default=None, help="Fashion-MNIST's (default: data/fashion-mnist)")
    c = sub.add_parser("launch", help="start the supervisor detached and return")
    c.add_argument("--pack", type=Path, default=PACK)
    c.add_argument("--work", type=Path, default=WORK)
    c.add_argument("--minutes", type=float, default=plan.WINDOW_MINUTES, help="the window, from now")
    c.add_argument("--slots", type=int, default=plan.SLOTS, help="runs at once")
    c.add_argument("--runs", default=None)
    c.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    c = sub.add_parser("status", help="one line per run")
    c.add_argument("--work", type=Path, default=WORK)
    c.add_argument("--wait", type=float, default=0.0, help="seconds to wait first (a polling call)")
    c = sub.add_parser("collect", help="status, results and weights under OUT")
    c.add_argument("out", type=Path)
    c.add_argument("--work", type=Path, default=WORK)
    c.add_argument("--again", action="store_true", help="send every checkpoint anew")
    c = sub.add_parser("ship", help="export, compare, ship what is better, update the ledger and docs")
    c.add_argument("dirs", type=Path, nargs="+", help="the collect calls' folders, oldest first")
    c.add_argument("--models", type=Path, default=contract.SHIPPED["mnist"].parent)
    c.add_argument("--mnist", type=Path, default=None)
    c.add_argument("--fashion", type=Path, default=None)
    c.add_argument("--pairs-per-digit", type=int, default=1, help="MultiMNIST test pairs per test digit")
    c = sub.add_parser("preflight", help="the whole cycle on the CPU with tiny budgets")
    c.add_argument("--runs", default=None)
    c.add_argument("--mnist", type=Path, default=None)
    c.add_argument("--fashion", type=Path, default=None)
    c.add_argument("--keep", type=Path, default=None, help="work here and keep it (default: a temporary folder)")
    args = p.parse_args(argv)
    names = args.runs.split(",") if getattr(args, "runs", None) else None

    if args.command == "pack":
        pack.pack(args.dir, data_dirs(args.mnist, args.fashion), names=names, build_site=site.build)
    elif args.command == "launch":
        pid = supervisor.launch(args.pack, args.work, args.minutes, args.slots, args.device, names=names)
        print(f"supervisor {pid}: {args.minutes:g} minutes, {args.slots} at once, on {args.device}; log {args.work}")
    elif args.command == "status":
        time.sleep(args.wait)
        print("\n".join(supervisor.status(args.work)) or "no run has begun")
    elif args.command == "collect":
        collect.collect(args.work, args.out, args.again)
    elif args.command == "ship":
        ship.ship(args.dirs, args.models, data_dirs(args.mnist, args.fashion), pairs_per_digit=args.pairs_per_digit)
        print(f"ledger: {ledger.LEDGER}")
    elif args.command == "preflight":
        dirs = data_dirs(args.mnist, args.fashion)
        if args.keep:
            preflight(dirs, args.keep, names=names)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                preflight(dirs, Path(tmp), names=names)
        print("preflight passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
