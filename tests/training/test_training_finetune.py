"""training/finetune.py: a fine-tune starts from a model folder's weights, mixes font digits into every
batch, logs their held-out accuracy beside MNIST's, checkpoints and resumes as every run does."""

import json
from pathlib import Path

import matplotlib
import pytest
import torch

from model import contract
from training import data, fonts
from training.config import TrainConfig
from training.finetune import FineTuneConfig, FontMix, blend, finetune, recipe
from training.graphs import model_from_graphs


@pytest.fixture
def few_fonts(monkeypatch):
    """Two training fonts (matplotlib's DejaVu Sans where none is installed): a bank drawn in a second."""
    files = fonts.available()[:2] or [Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"]
    monkeypatch.setattr(fonts, "available", lambda names=fonts.FONTS: files)
    return files


def test_every_batch_holds_its_share_of_font_digits_and_of_augmented_mnist(mnist_fixture):
    images, labels = (torch.from_numpy(a[:100].copy()) for a in mnist_fixture)
    splits = {"train": data.Split(images, labels), "val": data.Split(images[:10], labels[:10])}
    bank = data.Split(torch.zeros(5, 28, 28, dtype=torch.uint8), torch.full((5,), 7))  # blank "7"s
    task = FontMix(
        splits,
        bank,
        bank,
        font_share=0.25,
        augment_mnist=0.5,
        epoch_images=64,
        max_shift=0,
        augment=data.Augment(rotate=90),
    )
    batch = task.draw(torch.arange(16), torch.Generator().manual_seed(0))
    assert batch.x.shape == (16, 1, 28, 28) and task.train_size == 64
    assert (batch.y[-4:] == 7).all() and (batch.x[-4:] == 0).all()  # the last quarter from the bank
    assert (batch.x[:-4].flatten(1).amax(1) > 0.5).all()  # MNIST digits before them
    originals = data.to_float(images)  # (100, 1, 28, 28): which MNIST digit each of the 12 is
    match = [(originals - x).abs().flatten(1).amax(1).min().item() < 1e-6 for x in batch.x[:12]]
    assert match == [True] * 6 + [False] * 6  # half of MNIST as it is, half turned by up to 90 degrees


@pytest.mark.slow
def test_a_few_steps_from_the_shipped_weights_and_a_resume(idx_dir, tmp_path, few_fonts):
    tune = FineTuneConfig(model_dir=str(contract.SHIPPED["mnist"]), font_images=20, font_val_images=10, epoch_images=32)
    config = TrainConfig(
        data_dir=str(idx_dir),
        val_size=100,
        train_limit=200,
        batch_size=16,
        eval_batch_size=100,
        epochs=1,
        lr=1e-4,
        precision="fp32",
        device="cpu",
        out=str(tmp_path),
        log_every=1,
    )
    run = finetune(config, tune)
    record = run.history[0]
    assert record["step"] == 2 and {"val_acc", "val_fonts_acc"} <= set(record)
    assert record["val_acc"] >= 0.9  # the shipped model's weights (a fresh CapsNet reads ~10% after 2 steps)
    assert {"best.pt", "last.pt", "metrics.json", "finetune.json"} <= {p.name for p in tmp_path.iterdir()}
    settings = json.loads((tmp_path / "finetune.json").read_text())
    assert settings["font_share"] == tune.font_share and settings["fonts"] == [str(p) for p in few_fonts]
    resumed = finetune(TrainConfig(**{**vars(config), "epochs": 2, "resume": True}), tune)
    assert [h["epoch"] for h in resumed.history] == [1, 2]

    # WiSE-FT: halfway between the shipped weights and the kept epoch's, parameter by parameter
    start = model_from_graphs(contract.SHIPPED["mnist"]).state_dict()
    kept = torch.load(tmp_path / "best.pt", weights_only=True)["model"]
    half = torch.load(blend(tmp_path, 0.5), weights_only=True)["model"]
    moved = [k for k in kept if not torch.equal(kept[k], start[k])]
    assert moved and all(torch.allclose(half[k], (start[k] + kept[k]) / 2, atol=1e-6) for k in kept)
    assert blend(tmp_path, 1.0) == tmp_path / "best.pt"
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        blend(tmp_path, 1.5)


def test_the_served_card_states_its_fine_tune():
    """models/mnist/capsnet.json: the recipe in words from its own settings, and the flagship it started from."""
    card = json.loads((contract.SHIPPED["mnist"] / contract.MODEL_CARD).read_text())
    tune, config = card["fine_tune"], card["train_config"]
    assert card["augmentations"] == recipe(card["train_config"], card["fine_tune"])
    assert f"lr {config['lr']:g}" in card["augmentations"] and f"{tune['font_share']:.0%}" in card["augmentations"]
    assert tune["base"]["version"] == tune["source"]["version"] != card["version"]
    assert tune["base"]["test_accuracy"] <= card["test_accuracy"]  # the gate: not below the flagship on MNIST
