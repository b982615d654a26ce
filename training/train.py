"""Train a CapsNet on MNIST (or Fashion-MNIST) with the paper's recipe.

$ python -m training.train --epochs 1                        # quick run, CPU or GPU
$ python -m training.train --epochs 50 --lr-decay 0.99       # a long run at the official code's decay
$ python -m training.train --epochs 30 --val-size 0          # all 60,000 images, the last epoch kept
$ python -m training.train --compile --eval-every 5          # GPU fast path: CUDA graphs, fewer evaluations
$ torchrun --nproc_per_node 2 -m training.train --epochs 10  # DistributedDataParallel (nccl/gloo)
$ python -m training.train --routing em --out runs/em         # or qp-l2 / qp-l1 (docs/routing.md)

Adam with exponential LR decay (stepped each step, --lr-decay is the factor per epoch), margin loss
(Eq. 4; EM routing: the spread loss of matrix capsules, --loss) + 0.0005 x sum-squared reconstruction
with the true-label mask, ±2 px shifts (section 5).
The kept checkpoint is chosen on a 5,000-image validation split, never on the test set; with
--val-size 0 the run trains on all 60,000 images and keeps its last epoch (choose the epoch count on
a validated run first). bf16 autocast where it is native (--precision), routing in fp32 always.
--routing picks dynamic routing (the paper), EM routing or QP-regularised routing (model/routing.py);
qp follows Algorithm 1 of its paper: per batch, --n-w weight steps with the coefficients b fixed, then
--n-r gradient-ascent steps on b (Eq. 13 or 15, step --qp-lr).
The loop is training/fit.py; every setting is a field of TrainConfig (training/config.py) or of
CapsNetConfig, both saved in the checkpoints. Writes OUT/best.pt, OUT/last.pt, OUT/metrics.json and
OUT/curves.png.
"""

import argparse
import os
import sys
from dataclasses import replace

import torch
import torch.distributed as dist

from model.capsnet import LOSSES, SPREAD_MARGINS, CapsNet, CapsNetConfig
from model.routing import ROUTINGS
from training import cli, data
from training.config import PRECISIONS, TrainConfig, augment
from training.evaluate import evaluate
from training.fit import Batch, Run, StepOut, Task, fit, hardware

# Section 4.1 weighs the summed squared error by 0.0005 against Eq. 4 summed over classes; the official
# code averages its margin term over the 10 classes and halves it, which is the same as a
# reconstruction weight 20x ours (0.01) against our margin sum.
OFFICIAL_RECON_WEIGHT = 0.01


MODEL_OPTIONS = ("routing", "routing_iters", "qp_lambda", "em_inv_temp", "loss", "reconstruction", "recon_weight")


def parse_args(argv=None) -> tuple[TrainConfig, CapsNetConfig]:
    """Every field of TrainConfig and the model's training choices of CapsNetConfig, as options (training/cli.py)."""
    p = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.splitlines()[0])
    cli.add_options(p, TrainConfig, choices={"dataset": data.DATASETS, "precision": PRECISIONS})
    cli.add_options(p, CapsNetConfig, only=MODEL_OPTIONS, choices={"routing": ROUTINGS, "loss": LOSSES})
    args = p.parse_args(argv)
    return cli.build(TrainConfig, args), cli.build(CapsNetConfig, args)


# -------------------------------------------------------------------------------------------------


class ShiftedDigits(Task):
    """MNIST or Fashion-MNIST as in section 5: each training image shifted by up to max_shift pixels
    with zero padding, a fresh shift every time it is drawn; the model's loss (margin, or spread with its
    margin raised linearly from SPREAD_MARGINS[0] to [1] over the planned epochs) + reconstruction; accuracy."""

    def __init__(
        self,
        splits: dict[str, data.Split],
        max_shift: int,
        eval_batch_size: int = 500,
        augment: data.Augment | None = None,
    ):
        self.train, self.val = splits["train"], splits["val"]
        self.train_size, self.max_shift, self.eval_batch_size = len(self.train), max_shift, eval_batch_size
        self.augment = augment or data.Augment()
        self.spread_margin = torch.full((), SPREAD_MARGINS[0], device=self.train.images.device)

    def schedule(self, progress: float) -> None:
        lo, hi = SPREAD_MARGINS
        self.spread_margin.fill_(lo + (hi - lo) * min(1.0, progress))  # on the device: no host sync

    def draw(self, idx: torch.Tensor, generator: torch.Generator) -> Batch:
        x = self.augment(data.to_float(self.train.images[idx]), generator)
        x = data.random_shift(x, self.max_shift, generator)
        return Batch(x, self.train.labels[idx])

    def loss(self, model, batch: Batch) -> StepOut:
        out = model(batch.x, batch.y)  # the decoder draws the true class's capsule
        loss = getattr(model, "module", model).loss(out, batch.x, batch.y, self.spread_margin)  # may be DDP-wrapped
        return StepOut(loss, out.lengths.argmax(1) == batch.y, out.votes)

    def validate(self, model) -> dict | None:
        if len(self.val) == 0:
            return None
        result = evaluate(model, self.val, self.eval_batch_size)
        return {"acc": result["accuracy"], "loss": result["loss"]}


def load_splits(config: TrainConfig, dataset: str | None = None) -> dict[str, data.Split]:
    """train / val / test of dataset (default config.dataset) on config.device, train cut to train_limit."""
    dataset = dataset or config.dataset
    splits = data.load(config.data_dir or data.fetch(dataset), val_size=config.val_size)
    if config.train_limit:
        train = splits["train"]
        splits["train"] = data.Split(train.images[: config.train_limit], train.labels[: config.train_limit])
    return {k: v.to(config.device) for k, v in splits.items()}


def train(config: TrainConfig, model_config: CapsNetConfig, log=print) -> tuple[CapsNet, Run, dict | None]:
    """Train a CapsNet; returns it with the kept weights, its Run and (rank 0) the kept weights' test
    result, measured in fp32 (the exported graph's precision)."""
    splits = load_splits(config)
    model_config = replace(model_config, image_size=splits["train"].images.shape[-1])
    torch.manual_seed(config.seed)  # the same initial weights on every rank (DDP also broadcasts them)
    model = CapsNet(model_config)
    master = not dist.is_initialized() or dist.get_rank() == 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    if master:
        log(
            f"CapsNet ({model_config.routing} routing) {model.num_params():,} parameters on "
            f"{hardware(config.device, world)}; {len(splits['train']):,} train / {len(splits['val']):,} val / "
            f"{len(splits['test']):,} test"
        )
    task = ShiftedDigits(splits, config.max_shift, config.eval_batch_size, augment(config))
    run = fit(model, task, config, log)
    if not master:
        return model, run, None
    test = evaluate(model, splits["test"], config.eval_batch_size)
    log(
        f"kept epoch {run.kept_epoch} ({run.selection}): test accuracy {100 * test['accuracy']:.2f}% "
        f"({test['errors']} errors)"
    )
    return model, run, test


def setup_distributed(device: str) -> str:
    """The device of this rank; initialises the process group when launched by torchrun."""
    if "RANK" not in os.environ:
        return device
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    return device


def main(argv=None) -> dict:
    config, model_config = parse_args(argv)
    config = replace(config, device=setup_distributed(config.device))
    _, run, test = train(config, model_config)
    if dist.is_initialized():
        # rank 0 alone evaluates the test set: the others wait for it, so that every rank takes the group
        # down together (a rank that takes it down alone, its peer still connected, can abort as it exits)
        dist.barrier()
        dist.destroy_process_group()
    return {"run": run, "test": test}


if __name__ == "__main__":
    main()
    sys.exit(0)
