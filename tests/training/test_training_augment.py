"""training.data.Augment: the optional augmentations for real-world inputs, on batches."""

import numpy as np
import pytest
import torch

from training import data
from training.config import TrainConfig, augment


@pytest.fixture(scope="module")
def batch(mnist_fixture) -> torch.Tensor:
    return data.to_float(torch.from_numpy(mnist_fixture[0][:32].copy()))  # (32, 1, 28, 28)


def test_off_by_default(batch):
    assert augment(TrainConfig()) == data.Augment()
    assert data.Augment()(batch) is batch


@pytest.mark.parametrize(
    "kwargs", [dict(rotate=15), dict(scale=0.15), dict(shear=15), dict(stroke=1.0), dict(elastic_alpha=2.0)]
)
def test_each_changes_images_within_bounds(batch, kwargs):
    out = data.Augment(**kwargs)(batch, torch.Generator().manual_seed(0))
    assert out.shape == batch.shape and out.dtype == batch.dtype
    assert out.min() >= 0.0 and out.max() <= 1.0 + 1e-6
    changed = (out - batch).abs().flatten(1).amax(1) > 0.05
    assert changed.float().mean() > 0.9  # nearly every image moved
    assert (out - batch).abs().mean() < 0.2  # still the same digits, not noise


def test_stroke_jitter_thickens_or_thins(batch):
    out = data.random_stroke(batch, 1.0, torch.Generator().manual_seed(0))
    ink_before, ink_after = batch.sum((1, 2, 3)), out.sum((1, 2, 3))
    assert (ink_after > ink_before).any() and (ink_after < ink_before).any()


def test_same_generator_same_augmentation(batch):
    a = data.Augment(rotate=10, scale=0.1, shear=5, stroke=0.5, elastic_alpha=1.0)
    first, second = (a(batch, torch.Generator().manual_seed(3)) for _ in range(2))
    np.testing.assert_array_equal(first.numpy(), second.numpy())


def test_bounds_are_checked():
    with pytest.raises(ValueError, match="augmentation"):
        TrainConfig(rotate=-1)
