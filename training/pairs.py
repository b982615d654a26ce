"""MultiMNIST's pairs (section 6): each digit of a split overlaid on a digit of another class from the
same split, each shifted by up to MAX_SHIFT px in each direction on a 36x36 canvas, pixel values
clipped at 1; made on the device, deterministic by seed, with no host sync per batch; and the paper's
metric on them (both_right).

The paper says 4 px; the authors' published command for the MultiMNIST test split (their
input_data/mnist/mnist_shift.py, `--shift=6 --pad=4`) moves each digit, padded to 36x36, by up to 6 px
and cuts what leaves the frame. make_pairs takes either (max_shift).
"""

from typing import NamedTuple

import torch

from model import contract
from training import data

MAX_SHIFT = 4  # pixels in each direction (section 6)
RELEASED_SHIFT = 6  # the authors' released command for the test split (mnist_shift.py --shift=6 --pad=4)


class Pairs(NamedTuple):
    images: torch.Tensor  # (B, 1, 36, 36) the two digits overlaid, clipped at 1
    parts: torch.Tensor  # (B, 2, 36, 36) each digit alone, placed as in the composite
    labels: torch.Tensor  # (B, 2) two different classes
    shifts: torch.Tensor  # (B, 2, 2) (dy, dx) of each digit, in [-MAX_SHIFT, MAX_SHIFT]


class ClassIndex(NamedTuple):
    """A split's indices sorted by class, with each class's first position and count: what partners()
    samples from without leaving the device."""

    order: torch.Tensor  # (N,) indices sorted by label
    starts: torch.Tensor  # (10,) position of each class's first index in order
    counts: torch.Tensor  # (10,)

    @classmethod
    def of(cls, labels: torch.Tensor, num_classes: int = contract.NUM_CLASSES) -> "ClassIndex":
        counts = torch.bincount(labels, minlength=num_classes)
        return cls(torch.argsort(labels, stable=True), torch.cumsum(counts, 0) - counts, counts)


def partners(
    labels: torch.Tensor, first: torch.Tensor, generator: torch.Generator, index: ClassIndex | None = None
) -> torch.Tensor:
    """For each index in first, a uniformly random index of the same split whose digit has another class.

    A position p is drawn among the N - n_c digits of the other classes (c = the first digit's class)
    in class-sorted order, skipping class c's block: no rejection loop, so no host sync per batch.
    """
    index = index or ClassIndex.of(labels)
    c = labels[first]
    others = len(labels) - index.counts[c]  # (B,)
    p = (torch.rand(first.shape, device=labels.device, generator=generator) * others).long()
    p = torch.minimum(p, others - 1)  # rand < 1, but its product may round up to `others`
    p = torch.where(p >= index.starts[c], p + index.counts[c], p)
    return index.order[p]


def make_pairs(
    split: data.Split,
    first: torch.Tensor,
    generator: torch.Generator,
    max_shift: int = MAX_SHIFT,
    size: int = contract.MULTIMNIST_SIZE,
    index: ClassIndex | None = None,
) -> Pairs:
    """Overlay split.images[first] on random digits of other classes from the same split, each moved by up
    to max_shift px; beyond the canvas's margin (4 px on 36x36) the ink moved past its edge is cut."""
    second = partners(split.labels, first, generator, index)
    idx = torch.stack([first, second], 1)  # (B, 2)
    B = len(first)
    shifts = torch.randint(-max_shift, max_shift + 1, (B, 2, 2), device=idx.device, generator=generator)
    digits = data.to_float(split.images[idx.flatten()]).squeeze(1)  # (2B, 28, 28)
    parts = data.place(digits, shifts.view(2 * B, 2), size, max_shift, cut=True).view(B, 2, size, size)
    images = parts.sum(1, keepdim=True).clamp(max=1.0)
    return Pairs(images, parts, split.labels[idx], shifts)


def iter_pairs(split: data.Split, per_digit: int, seed: int, batch_size: int, max_shift: int = MAX_SHIFT):
    """A fixed evaluation set: every digit of split paired per_digit times, in batches, by seed."""
    generator = torch.Generator(device=split.labels.device).manual_seed(seed)
    first = torch.arange(len(split), device=split.labels.device).repeat(per_digit)
    index = ClassIndex.of(split.labels)
    for start in range(0, len(first), batch_size):
        yield make_pairs(split, first[start : start + batch_size], generator, max_shift, index=index)


def both_right(lengths: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The paper's metric: the two longest capsules are exactly the two digits' classes, (B,) bool."""
    top2 = lengths.topk(2, dim=1).indices.sort(1).values
    return (top2 == labels.sort(1).values).all(1)


def scale_pairs(parts: torch.Tensor, scale: float, generator: torch.Generator) -> torch.Tensor:
    """Each pair's two digits (B, 2, H, W) scaled together about the canvas centre by one factor uniform in
    [1 - scale, 1 + scale] (data.random_affine on both channels): drawn pairs come in every size.
    NOT in the paper, whose pairs are all of MNIST's size."""
    return data.random_affine(parts, 0.0, scale, 0.0, generator)
