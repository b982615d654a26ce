"""MultiMNIST: the pair generator does what section 6 says, the 36x36 model fits the contract, and
the experiment's one command trains, measures, draws Fig. 5 and exports a model with its card."""
import json

import numpy as np
import onnx
import pytest
import torch

from model import contract
from model.capsnet import CapsNet, CapsNetConfig
from training import data
from training.experiments import multimnist as mm


@pytest.fixture(scope="module")
def split(mnist_fixture) -> data.Split:
    images, labels = mnist_fixture
    return data.Split(torch.from_numpy(images.copy()), torch.from_numpy(labels))


def pairs(split, seed, n=200):
    return mm.make_pairs(split, torch.arange(n), torch.Generator().manual_seed(seed))


def centre_of_mass(x: torch.Tensor) -> torch.Tensor:
    """(B, H, W) -> (B, 2) = (row, col) of the ink's centre of mass."""
    r = torch.arange(x.shape[-1], dtype=x.dtype)
    return torch.stack([(x.sum(2) * r).sum(1), (x.sum(1) * r).sum(1)], 1) / x.sum((1, 2))[:, None]


def test_pairs_are_deterministic_by_seed(split):
    a, b, c = pairs(split, 0), pairs(split, 0), pairs(split, 1)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a.images, c.images) and not torch.equal(a.labels, c.labels)


def test_pairs_have_two_classes_from_the_split_shifted_within_bounds(split):
    p = pairs(split, 0)
    assert p.images.shape == (200, 1, 36, 36) and p.parts.shape == (200, 2, 36, 36)
    assert (p.labels[:, 0] != p.labels[:, 1]).all()
    assert torch.equal(p.labels[:, 0], split.labels[:200])  # the first digit is the one asked for
    assert p.shifts.abs().max() <= mm.MAX_SHIFT and p.shifts.abs().max() == mm.MAX_SHIFT  # the bound is reached
    assert len(torch.unique(p.shifts.view(-1, 2), dim=0)) > 40  # positions vary, (9x9 possible)
    # each part is its digit, whole (no ink cut), at its shift: the centre of mass moves by exactly the shift
    digits = data.to_float(split.images[:200]).squeeze(1)
    assert torch.allclose(p.parts[:, 0].sum((1, 2)), digits.sum((1, 2)))
    centred = data.place(digits, torch.zeros(200, 2, dtype=torch.long), 36, 0)
    assert torch.equal(p.parts[:, 0], data.place(digits, p.shifts[:, 0], 36, mm.MAX_SHIFT))
    assert torch.allclose(centre_of_mass(p.parts[:, 0]) - centre_of_mass(centred), p.shifts[:, 0].float(), atol=1e-3)


def test_composite_is_the_clipped_sum_and_digits_overlap(split):
    p = pairs(split, 0)
    assert torch.equal(p.images[:, 0], p.parts.sum(1).clamp(max=1.0))
    assert p.images.max() == 1.0 and p.parts.sum(1).max() > 1.0  # clipping happened somewhere
    overlap = ((p.parts[:, 0] > 0) & (p.parts[:, 1] > 0)).flatten(1).any(1)
    assert overlap.float().mean() > 0.9  # 36x36 with +-4 px: the digits overlap in nearly every pair


def test_place_refuses_shifts_that_would_cut_ink():
    with pytest.raises(ValueError, match="holds shifts up to 4"):
        data.place(torch.zeros(1, 28, 28), torch.tensor([[5, 0]]), 36, 5)


def test_both_right_is_the_papers_metric():
    lengths = torch.tensor([[0.9, 0.8, 0.1, 0, 0, 0, 0, 0, 0, 0],    # 0 and 1: right in either order
                            [0.9, 0.1, 0.8, 0, 0, 0, 0, 0, 0, 0],    # 0 and 2: one label wrong
                            [0.1, 0.9, 0.95, 0, 0, 0, 0, 0, 0, 0]])  # 2 then 1
    labels = torch.tensor([[1, 0], [0, 1], [1, 2]])
    assert mm.both_right(lengths, labels).tolist() == [True, False, True]


def test_36x36_capsnet_matches_the_multimnist_contract(split):
    model = CapsNet(CapsNetConfig(image_size=contract.MULTIMNIST_SIZE)).eval()
    assert model.config.num_primary == 32 * 10 * 10
    p = pairs(split, 0, n=3)
    with torch.no_grad():
        out = model(p.images)
    got = {contract.LENGTHS: out.lengths, contract.CAPSULES: out.capsules, contract.ROUTING: out.routing,
           contract.RECONSTRUCTION: out.reconstruction}
    for name, tensor in got.items():
        assert tuple(tensor.shape[1:]) == contract.capsnet_shapes(contract.MULTIMNIST_SIZE)[name][1:], name


def test_pair_loss_reconstructs_each_digit_from_its_own_capsule(split, monkeypatch):
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(image_size=36))
    p = pairs(split, 0, n=4)
    seen = []
    monkeypatch.setattr(mm, "reconstruction_loss", lambda recon, target: seen.append(target) or recon.sum() * 0)
    loss, lengths = mm.pair_loss(model, p.images, p.parts, p.labels)
    assert len(seen) == 2 and torch.equal(seen[0], p.parts[:, 0]) and torch.equal(seen[1], p.parts[:, 1])
    loss.backward()
    assert model.digits.W.grad.abs().sum() > 0 and lengths.shape == (4, 10)
    no_recon = CapsNet(CapsNetConfig(image_size=36, reconstruction=False))
    seen.clear()
    mm.pair_loss(no_recon, p.images, p.parts, p.labels)
    assert seen == []


@pytest.mark.slow
def test_cli_trains_draws_and_ships_a_model_with_its_card(idx_dir, tmp_path):
    out = tmp_path / "run"
    result = mm.main(["--data-dir", str(idx_dir), "--val-size", "100", "--train-limit", "128", "--epochs", "1",
                      "--out", str(out), "--model-dir", str(tmp_path / "model"), "--results-dir", str(tmp_path),
                      "--figure", str(tmp_path / "fig5.png")])
    card = json.loads((tmp_path / "model" / contract.MODEL_CARD).read_text())
    assert card["name"] == "capsnet-multimnist" and card["dataset_sha256"] == data.CHECKSUMS["mnist"]
    assert card["inputs"][contract.IMAGE] == ["N", 1, 36, 36]
    assert card["outputs"][contract.ROUTING] == ["N", 3200, 10] and card["parity_max_abs_diff"] < 1e-4
    assert card["test_count"] == 200 and card["test_errors"] == len(card["misclassified"])
    graph = onnx.load(tmp_path / "model" / contract.CAPSNET_ONNX)
    assert [i.name for i in graph.graph.input] == list(contract.CAPSNET_INPUTS)
    record = json.loads((tmp_path / "multimnist.json").read_text())
    row = record["rows"][0]
    assert row["reduced"] and row["paper"] == mm.PAPER_ERROR
    assert row["ours"] == pytest.approx(result["test"]["error"], abs=0.01)
    assert (tmp_path / "fig5.png").stat().st_size > 10_000


def test_shipped_multimnist_model_reads_pairs(split):
    shipped = contract.SHIPPED["multimnist"]
    import onnxruntime as ort
    card = json.loads((shipped / contract.MODEL_CARD).read_text())
    sess = ort.InferenceSession(str(shipped / contract.CAPSNET_ONNX), providers=["CPUExecutionProvider"])
    assert [o.name for o in sess.get_outputs()] == list(contract.CAPSNET_OUTPUTS)
    p = pairs(split, 3, n=300)
    lengths, routing = sess.run([contract.LENGTHS, contract.ROUTING], {contract.IMAGE: p.images.numpy()})
    assert routing.shape == (300, 3200, 10)
    right = mm.both_right(torch.from_numpy(lengths), p.labels).float().mean().item()
    # the card's rate was measured on 10,000 pairs; 300 fixture pairs land near it
    assert abs(right - card["test_accuracy"]) < 0.1, (right, card["test_accuracy"])
    assert np.isfinite(lengths).all()


def test_partners_are_other_classes_drawn_without_a_host_sync(split):
    """Defect 5: the rejection loop read `same.any()` back to the host several times per batch."""
    from tests.training.test_training_train import HostSyncs
    first = torch.arange(1000).repeat(20)
    with HostSyncs() as mode:
        second = mm.partners(split.labels, first, torch.Generator().manual_seed(0))
        mm.make_pairs(split, first[:64], torch.Generator().manual_seed(0))
    assert mode.seen == []
    assert (split.labels[second] != split.labels[first]).all()
    # uniform over the digits of the other classes: each class's share matches its share of those digits
    counts = torch.bincount(split.labels, minlength=10).float()
    for c in range(10):
        drawn = torch.bincount(split.labels[second[split.labels[first] == c]], minlength=10).float()
        expected = counts.clone()
        expected[c] = 0
        assert drawn[c] == 0
        assert torch.allclose(drawn / drawn.sum(), expected / expected.sum(), atol=0.03)


def test_lr_decay_suits_multimnists_long_runs():
    """Defect 5: 0.9 per epoch left 0.5% of the LR after 50 epochs; the decay period is 10x MNIST's."""
    decay = mm.parse_args([]).lr_decay
    assert decay == mm.LR_DECAY and 0.9 < decay ** 50 < 1.0
