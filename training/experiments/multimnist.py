"""MultiMNIST (section 6): two overlapping digits of different classes, classified and reconstructed.

$ python -m training.experiments.multimnist --epochs 1 --train-limit 20000   # reduced, CPU-sized
$ python -m training.experiments.multimnist --epochs 50 --test-pairs 1000     # toward the paper's setting

Each digit of a split is overlaid on a digit of another class from the same split, each shifted by
up to 4 px in each direction on a 36x36 canvas, pixel values clipped at 1. The pairs are generated on
the fly on the device, deterministic by seed: an epoch pairs every training digit once with a fresh
partner and fresh shifts (the paper generated 1,000 pairs per digit, 60M images). The CapsNet reads
36x36 (32x10x10 = 3,200 primary capsules); its two longest digit capsules are its classification,
correct when both labels are right (the paper's 5.2% error). The decoder reconstructs each digit
alone from its own capsule (training: the true labels; the loss sums both reconstructions).
Writes OUT/best.pt, docs/results/multimnist.json, docs/experiments/multimnist_fig5.png (Fig. 5) and
exports the best checkpoint to model/multimnist/ (contract.SHIPPED["multimnist"]) with its card.
"""
import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from model import contract
from model.capsnet import CapsNet, CapsNetConfig, margin_loss, mask_capsules, reconstruction_loss
from training import data
from training.experiments import common
from training.export import check_parity, export, model_card
from training.train import hardware

MAX_SHIFT = 4  # pixels in each direction (section 6)
PAPER_ERROR = 5.2  # % of test pairs with a wrong label, CapsNet r=3 with reconstruction (Table 1)


class Pairs(NamedTuple):
    images: torch.Tensor  # (B, 1, 36, 36) the two digits overlaid, clipped at 1
    parts: torch.Tensor  # (B, 2, 36, 36) each digit alone, placed as in the composite
    labels: torch.Tensor  # (B, 2) two different classes
    shifts: torch.Tensor  # (B, 2, 2) (dy, dx) of each digit, in [-MAX_SHIFT, MAX_SHIFT]


def partners(labels: torch.Tensor, first: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """For each index in first, a random index of the same split whose digit has another class."""
    second = torch.randint(len(labels), first.shape, device=labels.device, generator=generator)
    same = labels[second] == labels[first]
    while same.any():  # ~10% redrawn each round; the loop is over rounds, not examples
        second[same] = torch.randint(len(labels), (int(same.sum()),), device=labels.device, generator=generator)
        same = labels[second] == labels[first]
    return second


def make_pairs(split: data.Split, first: torch.Tensor, generator: torch.Generator,
               max_shift: int = MAX_SHIFT, size: int = contract.MULTIMNIST_SIZE) -> Pairs:
    """Overlay split.images[first] on random digits of other classes from the same split."""
    second = partners(split.labels, first, generator)
    idx = torch.stack([first, second], 1)  # (B, 2)
    B = len(first)
    shifts = torch.randint(-max_shift, max_shift + 1, (B, 2, 2), device=idx.device, generator=generator)
    digits = data.to_float(split.images[idx.flatten()]).squeeze(1)  # (2B, 28, 28)
    parts = data.place(digits, shifts.view(2 * B, 2), size, max_shift).view(B, 2, size, size)
    images = parts.sum(1, keepdim=True).clamp(max=1.0)
    return Pairs(images, parts, split.labels[idx], shifts)


def iter_pairs(split: data.Split, per_digit: int, seed: int, batch_size: int):
    """A fixed evaluation set: every digit of split paired per_digit times, in batches, by seed."""
    generator = torch.Generator(device=split.labels.device).manual_seed(seed)
    first = torch.arange(len(split), device=split.labels.device).repeat(per_digit)
    for start in range(0, len(first), batch_size):
        yield make_pairs(split, first[start:start + batch_size], generator)


def two_hot(labels: torch.Tensor, num_classes: int = contract.NUM_CLASSES) -> torch.Tensor:
    return F.one_hot(labels, num_classes).sum(1)


def both_right(lengths: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The paper's metric: the two longest capsules are exactly the two digits' classes, (B,) bool."""
    top2 = lengths.topk(2, dim=1).indices.sort(1).values
    return (top2 == labels.sort(1).values).all(1)


def pair_loss(model: CapsNet, batch: Pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """Margin loss (Eq. 4) with both classes present + recon_weight x the sum-squared error of each
    digit reconstructed alone from its own capsule. Returns (loss, lengths)."""
    capsules, lengths, _, _ = model.forward_features(batch.images)
    loss = margin_loss(lengths, two_hot(batch.labels))
    if model.decoder is not None:
        for k in range(2):
            recon = model.decoder(mask_capsules(capsules, batch.labels[:, k]))
            loss = loss + model.config.recon_weight * reconstruction_loss(recon, batch.parts[:, k])
    return loss, lengths


@torch.no_grad()
def evaluate(model: CapsNet, split: data.Split, per_digit: int = 1, seed: int = 1,
             batch_size: int = 250) -> dict:
    """Error rate (%) on the fixed pairs of split, and the indices of the wrong pairs."""
    was_training = model.training
    model.eval()
    right, loss_sum = [], 0.0
    for batch in iter_pairs(split, per_digit, seed, batch_size):
        loss, lengths = pair_loss(model, batch)
        loss_sum += loss.item() * len(lengths)
        right.append(both_right(lengths, batch.labels).cpu())
    model.train(was_training)
    right = torch.cat(right)
    return {"error": 100 * (1 - right.float().mean().item()), "count": len(right), "loss": loss_sum / len(right),
            "wrong": torch.nonzero(~right).flatten().tolist()}


def evaluate_onnx(path: Path, split: data.Split, per_digit: int = 1, seed: int = 1, batch_size: int = 250) -> dict:
    """The same metric on the exported graph under ONNX Runtime (the model card's figure)."""
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    right = []
    for batch in iter_pairs(split, per_digit, seed, batch_size):
        (lengths,) = sess.run([contract.LENGTHS], {contract.IMAGE: batch.images.cpu().numpy()})
        right.append(both_right(torch.from_numpy(lengths), batch.labels.cpu()))
    right = torch.cat(right)
    wrong = torch.nonzero(~right).flatten().tolist()
    return {"accuracy": right.float().mean().item(), "errors": len(wrong), "count": len(right),
            "misclassified": wrong, "providers": sess.get_providers()}


@torch.no_grad()
def save_figure(model: CapsNet, split: data.Split, path: Path, n: int = 8, seed: int = 1) -> None:
    """Fig. 5: each test pair above its two reconstructions, the first predicted class in red and the
    second in green, titled with the labels L and the two longest capsules R."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    model.eval()
    batch = next(iter_pairs(split, 1, seed, n))
    capsules, lengths, _, _ = model.forward_features(batch.images)
    top2 = lengths.topk(2, dim=1).indices  # (n, 2)
    recons = [model.decoder(mask_capsules(capsules, top2[:, k])) for k in range(2)]
    fig, axes = plt.subplots(2, n, figsize=(1.6 * n, 3.6))
    for i in range(n):
        rgb = torch.stack([recons[0][i], recons[1][i], torch.zeros_like(recons[0][i])], -1).clamp(0, 1)
        axes[0, i].imshow(batch.images[i, 0].cpu(), cmap="gray", vmin=0, vmax=1)
        axes[1, i].imshow(rgb.cpu())
        labels, pred = batch.labels[i].tolist(), top2[i].tolist()
        ok = sorted(labels) == sorted(pred)
        axes[0, i].set_title(f"L:({labels[0]},{labels[1]})", fontsize=9)
        axes[1, i].set_title(f"R:({pred[0]},{pred[1]})", fontsize=9, color="black" if ok else "red")
    for ax in axes.flat:
        ax.axis("off")
    fig.suptitle("MultiMNIST test pairs (top) and the reconstructions from the two longest capsules "
                 "(red: longest, green: second)", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def export_shipped(model: CapsNet, ckpt: dict, test: data.Split, out_dir: Path, per_digit: int, seed: int) -> dict:
    """Export to out_dir with the contract's names, check parity on test pairs, write the card."""
    capsnet_path, decoder_path = export(model, out_dir)
    images = next(iter_pairs(test, 1, seed, 64)).images[:, 0]
    images = (images * 255).round().to(torch.uint8).cpu().numpy()  # check_parity reads uint8 like IDX
    parity = check_parity(model, capsnet_path, decoder_path, images)
    result = evaluate_onnx(capsnet_path, test, per_digit, seed)
    card = model_card(ckpt, capsnet_path, parity, result)
    card.update(metric="both labels right: the two longest capsules are the two digits' classes",
                test_set=f"every MNIST test digit overlaid on {per_digit} random digit(s) of another class, "
                         f"shifts up to {MAX_SHIFT} px, seed {seed}")
    (out_dir / contract.MODEL_CARD).write_text(json.dumps(card, indent=2) + "\n")
    return card


def parse_args(argv=None) -> argparse.Namespace:
    p = common.parser("multimnist", __doc__, "multimnist")
    p.add_argument("--test-pairs", type=int, default=1, help="pairs per test digit (paper: 1,000)")
    p.add_argument("--routing-iters", type=int, default=3)
    p.add_argument("--model-dir", type=Path, default=contract.SHIPPED["multimnist"].directory,
                   help="where the best checkpoint is exported")
    common.figure_option(p, "multimnist_fig5.png")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = args.device
    splits = common.load_splits(args)
    train = splits["train"]
    config = CapsNetConfig(image_size=contract.MULTIMNIST_SIZE, routing_iters=args.routing_iters)
    model = CapsNet(config).to(device)
    n_steps = common.steps(len(train), args.batch_size)
    optimizer, scheduler = common.adam(model, n_steps, args.lr, args.lr_decay)
    print(f"MultiMNIST CapsNet {model.num_params():,} parameters, {config.num_primary} primary capsules, "
          f"on {hardware(device)}; {len(train):,} training digits")

    args.out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    history, wall = [], 0.0
    for epoch in range(1, args.epochs + 1):
        model.train()
        t0 = time.time()
        perm = torch.randperm(len(train), device=device, generator=gen)
        for step in range(n_steps):
            batch = make_pairs(train, perm[step * args.batch_size:(step + 1) * args.batch_size], gen)
            loss, _ = pair_loss(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            if step % 50 == 0:
                print(f"epoch {epoch} step {step}/{n_steps} loss {loss.item():.4f} ({time.time() - t0:.0f} s)",
                      flush=True)
        wall += time.time() - t0
        val = evaluate(model, splits["val"], 1, args.seed + 1)
        record = {"epoch": epoch, "train_seconds": wall, "val_error": val["error"], "val_loss": val["loss"]}
        history.append(record)
        print(json.dumps(record), flush=True)
        ckpt = {"model": model.state_dict(), "config": asdict(config), "epoch": epoch,
                "history": [{**h, "val_acc": 1 - h["val_error"] / 100} for h in history],
                "train_seconds": wall, "args": {k: str(v) for k, v in vars(args).items()},
                "hardware": hardware(device), "dataset": "multimnist", "source": "mnist"}
        if val["error"] <= min(h["val_error"] for h in history):
            torch.save(ckpt, args.out / "best.pt")

    ckpt = torch.load(args.out / "best.pt", map_location=device, weights_only=True)
    model.load_state_dict(ckpt["model"])
    test = evaluate(model, splits["test"], args.test_pairs, args.seed + 2)
    print(f"test error (both labels right) {test['error']:.2f}% on {test['count']:,} pairs "
          f"(paper: {PAPER_ERROR}%)")
    save_figure(model, splits["test"], args.figure, seed=args.seed + 2)
    card = export_shipped(model.cpu(), ckpt, splits["test"].to("cpu"), args.model_dir, args.test_pairs, args.seed + 2)
    reduced = args.epochs * len(train) < 60_000_000 or args.test_pairs < 1000
    rows = [common.row(f"CapsNet r={args.routing_iters} + reconstruction", "test error % (both labels)",
                       test["error"], PAPER_ERROR, epochs=ckpt["epoch"], train_images=ckpt["epoch"] * len(train),
                       wall_seconds=ckpt["train_seconds"], reduced=reduced,
                       onnx_error=round(100 * (1 - card["test_accuracy"]), 2))]
    common.write_result(
        "multimnist", rows,
        setting=f"{ckpt['epoch']} epoch(s) of {len(train):,} training digits each paired once with fresh "
                f"partner and shifts; test: {test['count']:,} pairs ({args.test_pairs} per MNIST test digit)",
        paper_setting="60M training pairs (1,000 per digit), 10M test pairs (1,000 per test digit)",
        hardware=ckpt["hardware"], command=common.command("training.experiments.multimnist", argv),
        out_dir=args.results_dir, figure=common.relative(args.figure),
    )
    return {"test": test, "card": card}


if __name__ == "__main__":
    main()
    sys.exit(0)
