"""CapsNet layers: parameter counts, shapes, capsule ordering, masking, the margin loss (Eq. 4) and the spread
loss (matrix capsules' Eq. 3)."""

import pytest
import torch

from model import contract
from model.capsnet import (
    CapsNet,
    CapsNetConfig,
    DigitCaps,
    PrimaryCaps,
    StridedConv2d,
    margin_loss,
    mask_capsules,
    reconstruction_loss,
    spread_loss,
)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return CapsNet(CapsNetConfig()).eval()


def test_parameter_counts_match_the_paper(model):
    assert model.num_params() == 8_215_568
    assert model.num_params(decoder=False) == 6_804_224
    assert CapsNet(CapsNetConfig(reconstruction=False)).num_params() == 6_804_224


def test_forward_shapes_and_ranges(model):
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        out = model(x)
    assert out.lengths.shape == (3, contract.NUM_CLASSES)
    assert out.capsules.shape == (3, contract.NUM_CLASSES, contract.CAPSULE_DIM)
    assert out.routing.shape == (3, contract.NUM_PRIMARY, contract.NUM_CLASSES)
    assert out.reconstruction.shape == (3, 28, 28)
    assert out.votes.shape == (3, contract.NUM_PRIMARY, contract.NUM_CLASSES, contract.CAPSULE_DIM)
    for t in (out.lengths, out.capsules, out.routing, out.reconstruction):
        assert torch.isfinite(t).all()
    assert ((out.lengths >= 0) & (out.lengths < 1)).all()
    assert ((out.reconstruction >= 0) & (out.reconstruction <= 1)).all()


def test_larger_inputs_adapt_the_primary_grid():
    config = CapsNetConfig(image_size=36)
    assert config.primary_grid == 10 and config.num_primary == 3200
    out = CapsNet(config)(torch.rand(2, 1, 36, 36))
    assert out.routing.shape == (2, 3200, 10) and out.reconstruction.shape == (2, 36, 36)


def test_primary_capsule_index_is_type_row_col():
    """Channel type*8+dim at (row, col) must land in capsule type*36 + row*6 + col, dimension dim."""
    layer = PrimaryCaps(in_chans=1)
    grid = torch.zeros(1, 256, 6, 6)
    for t, r, c, d in [(0, 0, 0, 0), (3, 2, 5, 7), (31, 5, 5, 4), (17, 1, 4, 2)]:
        grid[0, t * 8 + d, r, c] = 5.0
    layer.conv = torch.nn.Identity()
    u = layer(grid)  # (1, 1152, 8)
    for t, r, c, d in [(0, 0, 0, 0), (3, 2, 5, 7), (31, 5, 5, 4), (17, 1, 4, 2)]:
        i = t * 36 + r * 6 + c
        assert u[0, i].argmax().item() == d and u[0, i].norm() > 0.9
    assert (u.norm(dim=-1) > 0).sum() == 4


def test_transformation_matrices_start_small():
    W = DigitCaps().W
    assert W.shape == (1152, 10, 16, 8)
    assert abs(W.std().item() - 0.01) < 1e-3


def test_decoder_masks_with_targets_in_training_and_longest_otherwise(model):
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        out = model(x)
        chosen = out.lengths.argmax(1)
        assert torch.allclose(out.reconstruction, model.decoder(mask_capsules(out.capsules, chosen)))
        other = (chosen + 1) % 10
        out_t = model(x, other)
        assert torch.allclose(out_t.reconstruction, model.decoder(mask_capsules(out.capsules, other)))
        assert not torch.allclose(out_t.reconstruction, out.reconstruction)


def test_mask_keeps_only_the_chosen_capsule():
    caps = torch.randn(2, 10, 16)
    masked = mask_capsules(caps, torch.tensor([3, 7]))
    assert torch.equal(masked[0, 3], caps[0, 3]) and torch.equal(masked[1, 7], caps[1, 7])
    assert masked.abs().sum() == caps[0, 3].abs().sum() + caps[1, 7].abs().sum()


def test_margin_loss_worked_example():
    """Eq. 4 with m+ = 0.9, m- = 0.1, lambda = 0.5, summed over classes."""
    lengths = torch.tensor([[0.5, 0.3, 0.05, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.95]])
    # class 0 present: (0.9 - 0.5)^2 = 0.16; absent 1: 0.5 (0.3 - 0.1)^2 = 0.02; absent 9: 0.5 (0.85)^2
    expected = 0.16 + 0.02 + 0.5 * 0.85**2
    assert margin_loss(lengths, torch.tensor([0])).item() == pytest.approx(expected, rel=1e-6)
    perfect = torch.tensor([[0.95] + [0.05] * 9])
    assert margin_loss(perfect, torch.tensor([0])).item() == 0.0
    multi_hot = torch.zeros(1, 10)
    multi_hot[0, [0, 9]] = 1
    assert margin_loss(lengths, multi_hot).item() == pytest.approx(0.16 + 0.02, rel=1e-6)


def test_spread_loss_worked_example():
    """Matrix capsules' Eq. 3: each wrong class i costs max(0, m - (a_t - a_i))^2; the target costs nothing."""
    a = torch.tensor([[0.9, 0.6, 0.1, 0.0]])
    # m = 0.5: class 1 is 0.3 below the target, (0.5 - 0.3)^2 = 0.04; classes 2 and 3 are >= 0.5 below
    assert spread_loss(a, torch.tensor([0]), 0.5).item() == pytest.approx(0.04, rel=1e-5)
    # m = 0.9: (0.9 - 0.3)^2 + (0.9 - 0.8)^2 + (0.9 - 0.9)^2 = 0.37; a tensor margin gives the same
    assert spread_loss(a, torch.tensor([0]), torch.tensor(0.9)).item() == pytest.approx(0.37, rel=1e-5)
    # a wrong class above the target costs more than the margin's square: (0.5 + 0.3)^2 = 0.64 for class 0
    assert spread_loss(a, torch.tensor([1]), 0.5).item() == pytest.approx(0.64 + 0.0, rel=1e-5)
    with pytest.raises(ValueError, match="one class per image"):
        spread_loss(a, torch.zeros(1, 4), 0.5)


def test_total_loss_takes_the_configured_loss():
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(routing="em", reconstruction=False))
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([1, 2])
    with torch.no_grad():
        out = model(x, y)
        assert model.loss(out, x, y, 0.3).item() == pytest.approx(spread_loss(out.lengths, y, 0.3).item(), rel=1e-6)
        assert model.loss(out, x, y).item() == pytest.approx(spread_loss(out.lengths, y, 0.9).item(), rel=1e-6)


def test_reconstruction_loss_is_a_sum_not_a_mean():
    recon = torch.zeros(2, 28, 28)
    images = torch.ones(2, 1, 28, 28)
    assert reconstruction_loss(recon, images).item() == 784.0


def test_total_loss_weights_reconstruction_by_0_0005(model):
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([1, 2])
    with torch.no_grad():
        out = model(x, y)
        total = model.loss(out, x, y)
        expected = margin_loss(out.lengths, y) + 0.0005 * reconstruction_loss(out.reconstruction, x)
    assert total.item() == pytest.approx(expected.item(), rel=1e-6)


def test_prediction_does_not_depend_on_the_batch(model):
    x = torch.rand(6, 1, 28, 28)
    with torch.no_grad():
        batch, alone = model(x), model(x[4:5])
    assert torch.allclose(batch.lengths[4:5], alone.lengths, atol=1e-5)


def test_strided_conv_has_nn_conv2ds_values_and_gradients():
    """PrimaryCaps' conv takes its weight gradient on a CPU as a dilated convolution: the same
    values and gradients as nn.Conv2d in fp32, within bf16's rounding under autocast."""
    torch.manual_seed(0)
    conv = StridedConv2d(16, 24, 9, 2)
    ref = torch.nn.Conv2d(16, 24, 9, 2)
    ref.load_state_dict(conv.state_dict())
    x = torch.randn(4, 16, 20, 20, requires_grad=True)
    g = torch.randn(4, 24, 6, 6)
    grads = []
    for module in (conv, ref):
        for amp in (False, True):
            module.zero_grad()
            x.grad = None
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                y = module(x)
            (y.float() * g).sum().backward()
            grads.append((y.detach().float(), x.grad.clone(), module.weight.grad.clone(), module.bias.grad.clone()))
    for ours, theirs, tol in ((grads[0], grads[2], 1e-4), (grads[1], grads[3], 2e-2)):  # fp32, bf16
        for a, b in zip(ours, theirs, strict=True):
            assert a.dtype == b.dtype == torch.float32
            assert (a - b).abs().max() <= tol * b.abs().max()
    assert isinstance(PrimaryCaps().conv, StridedConv2d)
    with pytest.raises(ValueError, match="no padding"):
        StridedConv2d(4, 4, 3, 2, padding=1)
