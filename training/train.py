"""Train a CapsNet on MNIST (or Fashion-MNIST) with the paper's recipe.

$ python -m training.train --epochs 1                       # quick run, CPU or GPU
$ python -m training.train --epochs 50 --lr-decay 0.99      # the paper's long schedule
$ torchrun --nproc_per_node 2 -m training.train --epochs 10 # DistributedDataParallel (nccl/gloo)
$ python -m training.train --routing em --out runs/em        # or qp-l2 / qp-l1 (docs/routing.md)

Adam with exponential LR decay (stepped each step, --lr-decay is the factor per epoch), margin loss
(Eq. 4) + 0.0005 x sum-squared reconstruction with the true-label mask, ±2 px shifts (section 5).
The best checkpoint is chosen on a 5,000-image validation split, never on the test set.
--routing picks dynamic routing (the paper), EM routing or QP-regularised routing (model/routing.py);
qp follows Algorithm 1 of its paper: per batch, --n-w weight steps with the coefficients b fixed, then
--n-r gradient-ascent steps on b (Eq. 13 or 15, step --qp-lr).
Writes OUT/best.pt, OUT/last.pt (state_dict + config, loadable with weights_only=True),
OUT/metrics.json (one record per epoch) and OUT/curves.png.
"""
import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from model.capsnet import CapsNet, CapsNetConfig
from model.routing import ROUTINGS, QPRouting
from training import data
from training.evaluate import evaluate


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.splitlines()[0])
    # --- data
    p.add_argument("--dataset", choices=data.DATASETS, default="mnist")
    p.add_argument("--data-dir", type=Path, default=None, help="IDX files (default data/<dataset>)")
    p.add_argument("--max-shift", type=int, default=2, help="random shift in pixels (paper: 2)")
    p.add_argument("--train-limit", type=int, default=0, help="use only the first N training images")
    p.add_argument("--val-size", type=int, default=data.VAL_SIZE, help="training images held out for validation")
    # --- model
    p.add_argument("--routing", choices=ROUTINGS, default="dynamic")
    p.add_argument("--routing-iters", type=int, default=3, help="dynamic: r of Procedure 1; em: M-steps")
    p.add_argument("--qp-lambda", type=float, default=1e-3, help="qp: lambda of the l2/l1 penalty (Eqs. 10, 14)")
    p.add_argument("--em-inv-temp", type=float, default=3.0, help="em: lambda of Eq. 27 at the last iteration")
    p.add_argument("--no-reconstruction", dest="reconstruction", action="store_false")
    # --- optimisation
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's TensorFlow default")
    p.add_argument("--lr-decay", type=float, default=0.99,
                   help="LR factor per epoch, applied smoothly per step; the official 0.96 every "
                        "2,000 steps at batch 128 is ~0.99 per epoch, short runs want ~0.9")
    p.add_argument("--n-w", type=int, default=1, help="weight steps per batch (Algorithm 1's n_w; paper: 1)")
    p.add_argument("--n-r", type=int, default=1, help="qp: routing steps per batch (Algorithm 1's n_r; paper: 1)")
    p.add_argument("--qp-lr", type=float, default=1e-5,
                   help="qp: gamma, the step of the routing ascent (Eqs. 13, 15 sum over the batch)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True,
                   help="bf16 autocast on CUDA (routing stays fp32)")
    # --- output
    p.add_argument("--out", type=Path, default=Path("runs/mnist"))
    p.add_argument("--resume", action="store_true", help="continue from OUT/last.pt")
    p.add_argument("--eval-batch-size", type=int, default=500)
    return p.parse_args(argv)


# -------------------------------------------------------------------------------------------------

def setup_distributed(device: str) -> tuple[int, int, str]:
    """(rank, world_size, device); a no-op unless launched by torchrun."""
    if "RANK" not in os.environ:
        return 0, 1, device
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    return rank, world, device


def hardware(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def save_curves(history: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    epochs = [h["epoch"] for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(epochs, [h["train_loss"] for h in history], "o-", label="train")
    ax1.plot(epochs, [h["val_loss"] for h in history], "o-", label="val")
    ax1.set(xlabel="epoch", ylabel="loss", title="margin + 0.0005 x reconstruction")
    for key in ("train_acc", "val_acc", "test_acc"):
        ax2.plot(epochs, [100 * (1 - h[key]) for h in history], "o-", label=key.replace("_acc", ""))
    ax2.set(xlabel="epoch", ylabel="error (%)", yscale="log", title="classification error")
    for ax in (ax1, ax2):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    rank, world, device = setup_distributed(args.device)
    master = rank == 0
    torch.manual_seed(args.seed + rank)
    is_cuda = device.startswith("cuda")
    if is_cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=is_cuda and args.amp)

    # --- data, all of it on the device
    data_dir = args.data_dir or data.fetch(args.dataset)  # the default directory is fetched if empty
    splits = data.load(data_dir, val_size=args.val_size)
    if args.train_limit:
        splits["train"] = data.Split(splits["train"].images[:args.train_limit],
                                     splits["train"].labels[:args.train_limit])
    splits = {k: v.to(device) for k, v in splits.items()}
    train = splits["train"]
    steps_per_epoch = math.ceil(len(train) / (args.batch_size * world))

    # --- model, optimiser, schedule
    config = CapsNetConfig(image_size=train.images.shape[-1], routing=args.routing,
                           routing_iters=args.routing_iters, qp_lambda=args.qp_lambda,
                           em_inv_temp=args.em_inv_temp, reconstruction=args.reconstruction)
    model = CapsNet(config).to(device)
    qp = model.digits.routing if isinstance(model.digits.routing, QPRouting) else None
    reduce = dist.all_reduce if world > 1 else None  # qp: every rank ascends on the global batch
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=args.lr_decay ** (1 / steps_per_epoch))
    history, start_epoch, wall = [], 1, 0.0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.resume:
        ckpt = torch.load(args.out / "last.pt", map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        history, start_epoch, wall = ckpt["history"], ckpt["epoch"] + 1, ckpt["train_seconds"]
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    if master:
        print(f"CapsNet ({config.routing} routing) {model.num_params():,} parameters on {hardware(device)} x{world}; "
              f"{len(train):,} train / {len(splits['val']):,} val / {len(splits['test']):,} test")

    gen = torch.Generator(device=device).manual_seed(args.seed)
    for epoch in range(start_epoch, args.epochs + 1):
        net.train()
        t0 = time.time()
        perm = torch.randperm(len(train), device=device, generator=gen)  # same on every rank
        perm = perm[rank::world]
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device)
        seen = 0
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch}/{args.epochs}", disable=not master,
                   dynamic_ncols=True)
        for step in bar:
            idx = perm[step * args.batch_size:(step + 1) * args.batch_size]
            if len(idx) == 0:
                break
            x = data.random_shift(data.to_float(train.images[idx]), args.max_shift, gen)
            y = train.labels[idx]
            for _ in range(args.n_w):  # Algorithm 1, lines 3-6: weights, routing coefficients fixed
                with autocast:
                    out = net(x, y)
                    loss = model.loss(out, x, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            scheduler.step()
            if qp is not None:  # Algorithm 1, lines 7-9: ascend on b, the weights fixed
                # NOTE the votes are those of the last weight step's forward, before its update:
                # one forward fewer per batch than recomputing them, one optimiser step stale.
                for _ in range(args.n_r):
                    qp.ascend(out.votes.detach(), y, args.qp_lr, reduce)
            loss_sum += loss.detach() * len(idx)
            correct += (out.lengths.argmax(1) == y).sum()
            seen += len(idx)
            if step % 20 == 0 and master:
                bar.set_postfix(loss=f"{loss_sum.item() / seen:.4f}", acc=f"{correct.item() / seen:.4f}",
                                lr=f"{scheduler.get_last_lr()[0]:.2e}")
        if is_cuda:
            torch.cuda.synchronize()
        epoch_seconds = time.time() - t0
        wall += epoch_seconds
        if not master:
            continue

        # --- evaluate and checkpoint (rank 0)
        val = evaluate(model, splits["val"], args.eval_batch_size)
        test = evaluate(model, splits["test"], args.eval_batch_size)
        record = {
            "epoch": epoch, "step": epoch * steps_per_epoch, "lr": scheduler.get_last_lr()[0],
            "train_loss": loss_sum.item() / seen, "train_acc": correct.item() / seen,
            "val_loss": val["loss"], "val_acc": val["accuracy"],
            "test_loss": test["loss"], "test_acc": test["accuracy"], "test_errors": test["errors"],
            "epoch_seconds": epoch_seconds, "train_images": seen * world,
            "train_images_per_s": seen * world / epoch_seconds,
            "step_seconds": epoch_seconds / steps_per_epoch,
        }
        history.append(record)
        print(json.dumps(record))
        ckpt = {
            "model": model.state_dict(), "config": asdict(config), "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(), "epoch": epoch, "history": history,
            "train_seconds": wall, "args": {k: str(v) for k, v in vars(args).items()},
            "hardware": f"{hardware(device)} x{world}", "dataset": args.dataset,
        }
        torch.save(ckpt, args.out / "last.pt")
        best_val = max(h["val_acc"] for h in history)
        if record["val_acc"] >= best_val:
            torch.save(ckpt, args.out / "best.pt")
        (args.out / "metrics.json").write_text(json.dumps(history, indent=2))
        save_curves(history, args.out / "curves.png")

    if world > 1:
        dist.destroy_process_group()
    return history[-1] if history else {}


if __name__ == "__main__":
    main()
    sys.exit(0)
