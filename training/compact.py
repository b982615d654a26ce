"""Compact checkpoints: a run's kept weights in fp16 with its configs and history, no optimiser state.

$ python -m training.compact runs/mnist/best.pt runs/mnist/best16.pt

A CapsNet's fp32 weights are 33 MB and last.pt adds Adam's two moments; the compact file is about
16 MB, small enough to bring back from a remote GPU machine. It loads wherever a checkpoint does
(training.evaluate.load_checkpoint, training.export): load_state_dict casts the fp16 values into the
model's fp32 parameters, so an export from it is measured on exactly the weights it ships.
"""

import argparse
import sys
from pathlib import Path

import torch

DROPPED = ("optimizer", "scheduler", "rng")


def compact(src: Path, dst: Path) -> Path:
    """Write src's weights as fp16 (floating tensors only) and its metadata, without optimiser state."""
    ckpt = torch.load(src, map_location="cpu", weights_only=True)
    out = {k: v for k, v in ckpt.items() if k not in DROPPED}
    out["model"] = {k: v.half() if v.is_floating_point() else v for k, v in ckpt["model"].items()}
    dst.parent.mkdir(parents=True, exist_ok=True)
    torch.save(out, dst)
    return dst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.compact", description=__doc__.splitlines()[0])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    args = p.parse_args(argv)
    path = compact(args.src, args.dst)
    print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
