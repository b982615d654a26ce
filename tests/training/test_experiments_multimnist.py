"""MultiMNIST: the pair generator does what section 6 says, the 36x36 model fits the contract, and
the experiment's one command trains, measures, draws Fig. 5 and exports a model with its card; the
shipped model reads the card's own test pairs as its card says."""

import gzip
import hashlib
import json
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from model import contract
from model.capsnet import CapsNet, CapsNetConfig
from tests.harness import FIXTURES
from training import data, pairs
from training.experiments import common
from training.experiments import multimnist as mm

SHIPPED = contract.SHIPPED["multimnist"]
EVAL_BATCH = 250  # multimnist.evaluate_onnx's batch size: the pairs are drawn batch by batch, so it fixes them
# The shipped graph is fp32 (weights stored in fp16, computed in fp32); another CPU's kernels change its
# outputs in the last bits only, which moves a pair across the metric's line only where its second and
# third capsules lie that close (the closest of the rebuilt pairs are 0.007 apart): one such pair allowed.
FP32_FLIPS = 1


@pytest.fixture(scope="module")
def split(mnist_fixture) -> data.Split:
    images, labels = mnist_fixture
    return data.Split(torch.from_numpy(images.copy()), torch.from_numpy(labels))


def drawn(split, seed, n=200):
    return pairs.make_pairs(split, torch.arange(n), torch.Generator().manual_seed(seed))


def wrong_pairs(graph, images: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Positions of the pairs the graph gets wrong by the paper's metric, written here apart from
    pairs.both_right: its two longest capsules are not the two digits' classes."""
    (lengths,) = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(
        [contract.LENGTHS], {contract.IMAGE: images}
    )
    top2 = np.sort(np.argsort(-lengths, axis=1)[:, :2], axis=1)
    return np.flatnonzero((top2 != np.sort(labels, axis=1)).any(axis=1))


def centre_of_mass(x: torch.Tensor) -> torch.Tensor:
    """(B, H, W) -> (B, 2) = (row, col) of the ink's centre of mass."""
    r = torch.arange(x.shape[-1], dtype=x.dtype)
    return torch.stack([(x.sum(2) * r).sum(1), (x.sum(1) * r).sum(1)], 1) / x.sum((1, 2))[:, None]


def test_pairs_are_deterministic_by_seed(split):
    a, b, c = drawn(split, 0), drawn(split, 0), drawn(split, 1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a.images, c.images) and not torch.equal(a.labels, c.labels)


def test_pairs_have_two_classes_from_the_split_shifted_within_bounds(split):
    p = drawn(split, 0)
    assert p.images.shape == (200, 1, 36, 36) and p.parts.shape == (200, 2, 36, 36)
    assert (p.labels[:, 0] != p.labels[:, 1]).all()
    assert torch.equal(p.labels[:, 0], split.labels[:200])  # the first digit is the one asked for
    assert p.shifts.abs().max() <= pairs.MAX_SHIFT and p.shifts.abs().max() == pairs.MAX_SHIFT  # the bound is reached
    assert len(torch.unique(p.shifts.view(-1, 2), dim=0)) > 40  # positions vary, (9x9 possible)
    # each part is its digit, whole (no ink cut), at its shift: the centre of mass moves by exactly the shift
    digits = data.to_float(split.images[:200]).squeeze(1)
    assert torch.allclose(p.parts[:, 0].sum((1, 2)), digits.sum((1, 2)))
    centred = data.place(digits, torch.zeros(200, 2, dtype=torch.long), 36, 0)
    assert torch.equal(p.parts[:, 0], data.place(digits, p.shifts[:, 0], 36, pairs.MAX_SHIFT))
    assert torch.allclose(centre_of_mass(p.parts[:, 0]) - centre_of_mass(centred), p.shifts[:, 0].float(), atol=1e-3)


def test_composite_is_the_clipped_sum_and_digits_overlap(split):
    p = drawn(split, 0)
    assert torch.equal(p.images[:, 0], p.parts.sum(1).clamp(max=1.0))
    assert p.images.max() == 1.0 and p.parts.sum(1).max() > 1.0  # clipping happened somewhere
    overlap = ((p.parts[:, 0] > 0) & (p.parts[:, 1] > 0)).flatten(1).any(1)
    assert overlap.float().mean() > 0.9  # 36x36 with +-4 px: the digits overlap in nearly every pair


def released_split_part(digit: np.ndarray, dy: int, dx: int, shift: int = 6, pad: int = 4) -> np.ndarray:
    """A digit as the authors' mnist_shift.py places it for the MultiMNIST test split (--shift=6 --pad=4):
    padded to 36x36, padded again by shift + 1, rolled by (dy, dx), the outer padding cut off."""
    outer = np.pad(np.pad(digit, pad), shift + 1)
    rolled = np.roll(np.roll(outer, dy, axis=0), dx, axis=1)
    return rolled[shift + 1 : -(shift + 1), shift + 1 : -(shift + 1)]


def test_pairs_can_be_moved_as_the_authors_released_test_split(split):
    """max_shift=6: each digit moved up to 6 px on the 36x36 canvas, as their generator moves it, ink that
    leaves the frame cut; with 6 px the pairs overlap less than with the paper's 4."""
    p = pairs.make_pairs(split, torch.arange(200), torch.Generator().manual_seed(0), pairs.RELEASED_SHIFT)
    assert p.shifts.abs().max() == pairs.RELEASED_SHIFT
    images = split.images[:200].numpy().reshape(200, 28, 28)
    for k in range(200):
        dy, dx = p.shifts[k, 0].tolist()
        np.testing.assert_array_equal(p.parts[k, 0].numpy(), released_split_part(images[k], dy, dx) / np.float32(255))
    cut = p.parts[:, 0].sum((1, 2)) < data.to_float(split.images[:200]).sum((1, 2, 3)) - 1e-3
    assert cut.any()  # some ink left the frame
    four = drawn(split, 0)
    overlap = [((q.parts[:, 0] > 0) & (q.parts[:, 1] > 0)).sum((1, 2)).float().mean() for q in (four, p)]
    assert overlap[1] < overlap[0]


def test_place_refuses_shifts_that_would_cut_ink():
    with pytest.raises(ValueError, match="holds shifts up to 4"):
        data.place(torch.zeros(1, 28, 28), torch.tensor([[5, 0]]), 36, 5)


def test_both_right_is_the_papers_metric():
    lengths = torch.tensor(
        [
            [0.9, 0.8, 0.1, 0, 0, 0, 0, 0, 0, 0],  # 0 and 1: right in either order
            [0.9, 0.1, 0.8, 0, 0, 0, 0, 0, 0, 0],  # 0 and 2: one label wrong
            [0.1, 0.9, 0.95, 0, 0, 0, 0, 0, 0, 0],
        ]
    )  # 2 then 1
    labels = torch.tensor([[1, 0], [0, 1], [1, 2]])
    assert pairs.both_right(lengths, labels).tolist() == [True, False, True]


def test_36x36_capsnet_matches_the_multimnist_contract(split):
    model = CapsNet(CapsNetConfig(image_size=contract.MULTIMNIST_SIZE)).eval()
    assert model.config.num_primary == 32 * 10 * 10
    p = drawn(split, 0, n=3)
    with torch.no_grad():
        out = model(p.images)
    got = {
        contract.LENGTHS: out.lengths,
        contract.CAPSULES: out.capsules,
        contract.ROUTING: out.routing,
        contract.RECONSTRUCTION: out.reconstruction,
    }
    for name, tensor in got.items():
        assert tuple(tensor.shape[1:]) == contract.capsnet_shapes(contract.MULTIMNIST_SIZE)[name][1:], name


def test_pair_loss_reconstructs_each_digit_from_its_own_capsule(split, monkeypatch):
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(image_size=36))
    p = drawn(split, 0, n=4)
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
def test_cli_trains_draws_and_ships_a_model_with_its_card(idx_dir, tmp_path, mnist_fixture):
    out = tmp_path / "run"
    mm.main(
        [
            "--data-dir",
            str(idx_dir),
            "--val-size",
            "100",
            "--train-limit",
            "128",
            "--epochs",
            "1",
            "--out",
            str(out),
            "--model-dir",
            str(tmp_path / "model"),
            "--results-dir",
            str(tmp_path),
            "--figure",
            str(tmp_path / "fig5.png"),
        ]
    )
    card = json.loads((tmp_path / "model" / contract.MODEL_CARD).read_text())
    graph = tmp_path / "model" / contract.CAPSNET_ONNX
    assert card["name"] == "capsnet-multimnist" and card["dataset_sha256"] == data.CHECKSUMS["mnist"]
    assert card["version"] == hashlib.sha256(graph.read_bytes()).hexdigest()[:12]
    assert [i.name for i in onnx.load(graph).graph.input] == list(contract.CAPSNET_INPUTS)
    assert card["inputs"][contract.IMAGE] == ["N", 1, 36, 36] and card["outputs"][contract.ROUTING] == ["N", 3200, 10]
    # the test pairs of idx_dir's 200 test digits (the fixture's last 200), drawn as the card's test_set says
    # (seed 0 + 2); the exported graph's own errors on them, on this CPU, are the card's list
    images, labels = (torch.from_numpy(a[800:1000].copy()) for a in mnist_fixture)
    assert "seed 2" in card["test_set"]
    drawn = list(pairs.iter_pairs(data.Split(images, labels), 1, 2, EVAL_BATCH))
    x, y = (torch.cat([getattr(p, field) for p in drawn]).numpy() for field in ("images", "labels"))
    wrong = wrong_pairs(graph, x, y)
    assert card["misclassified"] == wrong.tolist() and card["test_errors"] == len(wrong) and card["test_count"] == 200
    row = json.loads((tmp_path / "multimnist.json").read_text())["rows"][0]
    assert row["reduced"] and row["paper"] == mm.PAPER_ERROR
    assert row["onnx_error"] == pytest.approx(100 * len(wrong) / 200, abs=0.005)
    # `ours` is PyTorch's error on the same pairs: the graph matches PyTorch to 1e-4 (export's parity check),
    # which can move a pair whose second and third capsules lie that close; one such pair (0.5 points)
    assert abs(row["ours"] - row["onnx_error"]) <= 0.5 + 0.005
    assert (tmp_path / "fig5.png").stat().st_size > 10_000


@pytest.fixture(scope="module")
def card() -> dict:
    return json.loads((SHIPPED / contract.MODEL_CARD).read_text())


@pytest.fixture(scope="module")
def card_pairs(card, mnist_fixture) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The card's own test pairs that the fixtures can rebuild: (pair indices, images, labels).

    The card's pair i is MNIST test digit i over a partner of another class drawn from all 10,000 test
    digits, by the seed its test_set names. The fixtures hold the first 1,000 images and the labels of
    all 10,000 (t10k-labels-idx1-ubyte.gz, checked against training/data.py's sha256), which fix every
    draw; a pair i < 1,000 is rebuilt when its partner is among the first 1,000 too. The other 9,000
    images are an all-white square, which no MNIST digit is, so the pairs they fall in are recognised
    and left out."""
    name = data.FILES["test_labels"]
    path = FIXTURES / f"{name}.gz"
    assert hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest() == data.CHECKSUMS["mnist"][name]
    labels = data.read_idx(path).astype(np.int64)
    images, first_labels = mnist_fixture
    assert (labels[: len(first_labels)] == first_labels).all()
    canvas = np.full((len(labels), 28, 28), 255, np.uint8)
    canvas[: len(images)] = images
    seed = int(re.search(r"seed (\d+)", card["test_set"]).group(1))
    split = data.Split(torch.from_numpy(canvas), torch.from_numpy(labels))
    index, x, y = [], [], []
    for start, p in zip(range(0, len(images), EVAL_BATCH), pairs.iter_pairs(split, 1, seed, EVAL_BATCH), strict=False):
        kept = (p.parts[:, 1] == 1.0).flatten(1).sum(1) < 28 * 28  # the partner is not the white square
        index.append(start + torch.nonzero(kept).flatten())
        x.append(p.images[kept])
        y.append(p.labels[kept])
    return torch.cat(index).numpy(), torch.cat(x).numpy(), torch.cat(y).numpy()


def test_shipped_multimnist_model_reads_the_cards_pairs_as_its_card_says(card, card_pairs):
    """The shipped graph's own errors on the card's test pairs that the fixtures rebuild (93 of them) are the
    card's misclassified pairs among them, to a CPU's last bits (FP32_FLIPS)."""
    index, images, labels = card_pairs
    assert len(index) > 50 and images.shape[1:] == (1, contract.MULTIMNIST_SIZE, contract.MULTIMNIST_SIZE)
    wrong = set(index[wrong_pairs(SHIPPED / contract.CAPSNET_ONNX, images, labels)].tolist())
    claimed = set(card["misclassified"]) & set(index.tolist())
    assert len(wrong ^ claimed) <= FP32_FLIPS, (sorted(wrong), sorted(claimed))
    assert card["test_count"] == 10_000  # one pair per MNIST test digit, as the test_set says


def test_results_row_states_the_cards_error_rate(card):
    """The results table's row gives the error rate of the card's misclassified list (checked against the
    graph above); `ours`, PyTorch's error on the same pairs, is within a few pairs of it (the graph matches
    PyTorch to 1e-4: export's parity check)."""
    row = json.loads((common.RESULTS_DIR / "multimnist.json").read_text())["rows"][0]
    assert row["onnx_error"] == pytest.approx(100 * len(card["misclassified"]) / card["test_count"], abs=0.005)
    assert abs(row["ours"] - row["onnx_error"]) <= 100 * 5 / card["test_count"]  # 5 of 10,000 pairs


def test_partners_are_other_classes_drawn_without_a_host_sync(split):
    """Defect 5: the rejection loop read `same.any()` back to the host several times per batch."""
    from tests.training.test_training_train import HostSyncs

    first = torch.arange(1000).repeat(20)
    with HostSyncs() as mode:
        second = pairs.partners(split.labels, first, torch.Generator().manual_seed(0))
        pairs.make_pairs(split, first[:64], torch.Generator().manual_seed(0))
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
    assert decay == mm.LR_DECAY and 0.9 < decay**50 < 1.0
