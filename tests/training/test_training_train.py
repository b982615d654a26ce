"""The training loop learns, writes what it promises, resumes, and runs under DDP with gloo."""
import json
import os
import subprocess
import sys

import pytest
import torch

from model.capsnet import CapsNet, CapsNetConfig
from tests.conftest import REPO
from training import data, train
from training.evaluate import evaluate, load_checkpoint, summarise


@pytest.mark.parametrize("routing, n, steps", [
    ("dynamic", 256, 12),
    pytest.param("em", 128, 8, marks=pytest.mark.slow),
])
def test_a_few_steps_lower_the_loss(mnist_fixture, routing, n, steps):
    torch.manual_seed(0)
    images, labels = mnist_fixture
    x = data.to_float(torch.from_numpy(images[:n].copy()))
    y = torch.from_numpy(labels[:n])
    model = CapsNet(CapsNetConfig(routing=routing))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torch.no_grad():
        before = model.loss(model(x, y), x, y).item()
    for step in range(steps):
        idx = torch.arange(step * 32 % n, step * 32 % n + 32)
        loss = model.loss(model(x[idx], y[idx]), x[idx], y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    with torch.no_grad():
        after = model.loss(model(x, y), x, y).item()
    assert after < 0.8 * before


@pytest.mark.slow
def test_cli_writes_checkpoints_logs_and_resumes(idx_dir, tmp_path):
    out = tmp_path / "run"
    args = ["--data-dir", str(idx_dir), "--val-size", "100", "--batch-size", "64", "--out", str(out),
            "--eval-batch-size", "200", "--lr-decay", "0.9", "--train-limit", "192"]
    record = train.main(args + ["--epochs", "1"])
    assert {"best.pt", "last.pt", "metrics.json", "curves.png"} <= {p.name for p in out.iterdir()}
    assert record["epoch"] == 1 and 0 <= record["test_acc"] <= 1
    model, ckpt = load_checkpoint(out / "best.pt")  # weights_only=True inside
    assert ckpt["config"]["routing_iters"] == 3 and ckpt["epoch"] == 1
    assert ckpt["optimizer"]["param_groups"][0]["lr"] == pytest.approx(1e-3 * 0.9, rel=1e-3)
    record = train.main(args + ["--epochs", "2", "--resume"])
    history = json.loads((out / "metrics.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2] and record["epoch"] == 2
    assert history[1]["lr"] == pytest.approx(1e-3 * 0.81, rel=1e-3)


def test_evaluate_summary_counts_errors_and_confusion():
    import numpy as np
    result = summarise(np.array([0, 1, 2, 2]), np.array([0, 1, 1, 2]), num_classes=3)
    assert result["errors"] == 1 and result["misclassified"] == [2]
    assert result["confusion"] == [[1, 0, 0], [0, 1, 1], [0, 0, 1]]
    assert result["accuracy"] == 0.75


def test_evaluate_runs_the_model_on_a_split(mnist_fixture):
    images, labels = mnist_fixture
    split = data.Split(torch.from_numpy(images[:50].copy()), torch.from_numpy(labels[:50]))
    result = evaluate(CapsNet(CapsNetConfig()), split, batch_size=20)
    assert result["count"] == 50 and len(result["confusion"]) == 10 and result["loss"] > 0


@pytest.mark.slow
def test_torchrun_with_gloo_on_cpu(idx_dir, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29531",
           "-m", "training.train", "--data-dir", str(idx_dir), "--val-size", "100", "--train-limit", "128",
           "--batch-size", "32", "--epochs", "1", "--device", "cpu", "--out", str(tmp_path / "ddp"),
           "--eval-batch-size", "200"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x2" in proc.stdout
    history = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    assert history[0]["epoch"] == 1
