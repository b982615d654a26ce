"""Affine robustness: the translated and affNIST-like generators draw what they document, the CNN
baseline is the promised kind of model, and the experiment's command writes its result."""

import json
import math

import pytest
import torch

from model import contract
from model.capsnet import CapsNet, CapsNetConfig
from training import data
from training.experiments import affine


@pytest.fixture(scope="module")
def digits(mnist_fixture) -> torch.Tensor:
    return torch.from_numpy(mnist_fixture[0][:300].copy())


@pytest.fixture(scope="module")
def digit_labels(mnist_fixture) -> torch.Tensor:
    return torch.from_numpy(mnist_fixture[1][:300].astype("int64"))


def centre_of_mass(x: torch.Tensor) -> torch.Tensor:
    """(B, H, W) -> (B, 2) = (x, y) of the ink's centre of mass, relative to the canvas centre."""
    r = torch.arange(x.shape[-1], dtype=x.dtype) - (x.shape[-1] - 1) / 2
    return torch.stack([(x.sum(1) * r).sum(1), (x.sum(2) * r).sum(1)], 1) / x.sum((1, 2))[:, None]


def test_translation_covers_the_canvas_and_keeps_every_digit_whole(digits):
    x = affine.translate(digits, torch.Generator().manual_seed(0))
    assert x.shape == (300, 1, 40, 40)
    assert torch.allclose(x.sum((1, 2, 3)), data.to_float(digits).sum((1, 2, 3)))
    shift = centre_of_mass(x[:, 0]) - centre_of_mass(data.to_float(digits)[:, 0])  # 28 -> 40 keeps the centre
    assert shift.abs().max() <= 6 + 1e-4 and shift.abs().max() > 5.5  # 13 x 13 positions: +-6 px
    assert torch.allclose(shift, shift.round(), atol=1e-4)  # whole pixels, no resampling


def test_affnist_like_is_deterministic_and_draws_within_the_documented_ranges(digits):
    a, pa = affine.affnist_like(digits, torch.Generator().manual_seed(0))
    b, pb = affine.affnist_like(digits, torch.Generator().manual_seed(0))
    c, _ = affine.affnist_like(digits, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and all(torch.equal(u, v) for u, v in zip(pa, pb, strict=True)) and not torch.equal(a, c)
    assert a.shape == (300, 1, 40, 40) and a.min() >= 0 and a.max() <= 1
    assert pa.rotation.abs().max() <= affine.ROTATION and pa.rotation.abs().max() > 0.8 * affine.ROTATION
    assert pa.shear.abs().max() <= affine.SHEAR
    for s in (pa.scale_x, pa.scale_y):
        assert affine.SCALE[0] <= s.min() and s.max() <= affine.SCALE[1]


def test_affine_map_moves_the_ink_as_its_parameters_say(digits):
    """Bilinear resampling keeps the ink (scaled by the area factor sx * sy), nothing is cut at the
    border, and the centre of mass lands at A c + t: the parameters describe the image."""
    x, p = affine.affnist_like(digits, torch.Generator().manual_seed(0))
    src = data.place(data.to_float(digits).squeeze(1), torch.zeros(len(digits), 2, dtype=torch.long), 40, 0)
    area = p.scale_x * p.scale_y
    assert torch.allclose(x.sum((1, 2, 3)), src.sum((1, 2)) * area, rtol=0.02)
    a = torch.deg2rad(p.rotation)
    R = torch.stack([torch.cos(a), -torch.sin(a), torch.sin(a), torch.cos(a)], 1).view(-1, 2, 2)
    S = torch.stack([torch.ones_like(p.shear), p.shear, torch.zeros_like(p.shear), torch.ones_like(p.shear)], 1)
    A = R @ S.view(-1, 2, 2) @ torch.diag_embed(torch.stack([p.scale_x, p.scale_y], 1))
    expected = (A @ centre_of_mass(src).unsqueeze(-1)).squeeze(-1) + torch.stack([p.shift_x, p.shift_y], 1)
    assert (centre_of_mass(x[:, 0]) - expected).abs().max() < 0.25  # a quarter pixel


def test_translation_range_keeps_the_transformed_ink_box_inside(digits):
    x, p = affine.affnist_like(digits, torch.Generator().manual_seed(2))
    box = affine.ink_box(x[:, 0], threshold=0.3)
    assert (box[:, 0] >= 0).all() and (box[:, 1] <= 39).all()
    shifts = torch.stack([p.shift_x, p.shift_y], 1)
    assert shifts.abs().max() > 6  # translations reach well beyond MNIST's centred position


def test_tffs_recipe_shears_vertically_scales_in_log_and_reaches_five_px(digits):
    """The other public recipe (affine.TFF): its parameters within its ranges, its shear on the other
    axis (a vertical line stays vertical under ours, tilts under TFF's), its shifts within reach."""
    x, p = affine.affnist_like(digits, torch.Generator().manual_seed(3), recipe=affine.TFF)
    assert p.rotation.abs().max() <= affine.TFF.rotation and p.shear.abs().max() <= affine.TFF.shear
    for s in (p.scale_x, p.scale_y):
        assert affine.TFF.scale[0] <= s.min() and s.max() <= affine.TFF.scale[1] and s.max() > 1.2
    shifts = torch.stack([p.shift_x, p.shift_y], 1)
    assert shifts.abs().max() <= affine.TFF.reach and (x.sum((1, 2, 3)) > 0).all()
    bar = torch.zeros(1, 28, 28, dtype=torch.uint8)
    bar[0, 4:24, 13:15] = 255  # a vertical stroke
    sheared = {}
    for axis in ("x", "y"):
        recipe = affine.Recipe(0.0, 0.2, axis, (1.0, 1.0), log_scale=False, reach=0.0)
        generator = torch.Generator().manual_seed(0)
        while True:  # a draw with a clear shear
            image, q = affine.affnist_like(bar, generator, recipe=recipe)
            if q.shear.abs().item() > 0.15:
                break
        cols = image[0, 0].argmax(1)[image[0, 0].amax(1) > 0.3]  # the stroke's column, row by row
        sheared[axis] = (cols.max() - cols.min()).item()
    assert sheared["x"] >= 2 and sheared["y"] <= 1  # x' = x + s y tilts it; y' = y + s x only moves it down


def test_ink_box_finds_first_and_last_rows_and_columns():
    x = torch.zeros(2, 10, 10)
    x[0, 2:5, 3:8] = 1.0
    assert affine.ink_box(x)[0].tolist() == [2, 4, 3, 7]
    assert affine.ink_box(x)[1].tolist() == [10, -1, 10, -1]  # empty: no range


def test_cnn_baseline_has_pooling_dropout_and_about_the_capsnets_parameters():
    cnn = affine.BaselineCNN()
    kinds = {type(m) for m in cnn.modules()}
    assert torch.nn.MaxPool2d in kinds and torch.nn.Dropout in kinds
    capsnet = CapsNet(CapsNetConfig(image_size=affine.CANVAS))
    n_cnn = sum(p.numel() for p in cnn.parameters())
    assert math.isclose(n_cnn, capsnet.num_params(decoder=False), rel_tol=0.05)
    assert cnn(torch.rand(2, 1, 40, 40)).shape == (2, 10)


@pytest.mark.slow
def test_cli_trains_both_models_and_writes_four_rows(idx_dir, tmp_path):
    affine.main(
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
            str(tmp_path / "run"),
            "--results-dir",
            str(tmp_path),
            "--figure",
            str(tmp_path / "sets.png"),
            "--model-dir",
            str(tmp_path / "model"),
        ]
    )
    record = json.loads((tmp_path / "affine.json").read_text())
    assert [(r["model"], r["metric"].split(" test")[0]) for r in record["rows"]] == [
        ("CapsNet", "expanded MNIST"),
        ("CapsNet", "affNIST-like"),
        ("CNN baseline", "expanded MNIST"),
        ("CNN baseline", "affNIST-like"),
    ]
    assert [r["paper"] for r in record["rows"]] == [99.23, 79.0, 99.22, 66.0]
    assert all(r["reduced"] and 0 <= r["ours"] <= 100 and r["train_images"] == 128 for r in record["rows"])
    assert record["ranges"] == {"rotation_deg": affine.ROTATION, "shear": affine.SHEAR, "scale": list(affine.SCALE)}
    assert {p.name for p in (tmp_path / "run").iterdir()} == {"capsnet", "cnn"}
    assert all((tmp_path / "run" / m / "best.pt").exists() for m in ("capsnet", "cnn"))
    assert (tmp_path / "sets.png").stat().st_size > 5_000
    card = json.loads((tmp_path / "model" / contract.MODEL_CARD).read_text())  # the CapsNet, exported
    assert card["inputs"][contract.IMAGE] == ["N", 1, 40, 40] and card["test_count"] == 200
    assert card["parity_max_abs_diff"] < 1e-4 and record["rows"][1]["model_version"] == card["version"]
    assert card["test_accuracy"] * 100 == pytest.approx(record["rows"][1]["ours"], abs=0.01)  # ONNX = PyTorch


def test_shipped_affine_capsnet_reads_translated_and_affine_digits(digits, digit_labels):
    """models/affine/: the 40x40 CapsNet of the affine experiment, its card measured on its graph."""
    import onnxruntime as ort

    shipped = contract.SHIPPED["affine"]
    card = json.loads((shipped / contract.MODEL_CARD).read_text())
    sess = ort.InferenceSession(str(shipped / contract.CAPSNET_ONNX), providers=["CPUExecutionProvider"])
    for name, x in (
        ("expanded MNIST", affine.translate(digits, torch.Generator().manual_seed(5))),
        ("affNIST-like", affine.affnist_like(digits, torch.Generator().manual_seed(5))[0]),
    ):
        (lengths,) = sess.run([contract.LENGTHS], {contract.IMAGE: x.numpy()})
        right = (lengths.argmax(1) == digit_labels.numpy()).mean()
        measured = card["expanded_mnist_accuracy"] if name == "expanded MNIST" else card["test_accuracy"]
        assert abs(right - measured) < 0.06, (name, right, measured)  # 300 digits land near the 10,000's figure
    assert card["dataset"] == "affine" and card["test_count"] == 10_000


def test_training_batches_are_drawn_without_a_host_sync(digits):
    from tests.training.test_training_train import HostSyncs

    split = data.Split(digits, torch.zeros(len(digits), dtype=torch.long))
    task = affine.TranslatedDigits({"train": split, "val": split}, seed=0)
    with HostSyncs() as mode:
        batch = task.draw(torch.arange(8), torch.Generator().manual_seed(0))
    assert mode.seen == [] and batch.x.shape == (8, 1, 40, 40)
