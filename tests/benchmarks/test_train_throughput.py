"""The training-throughput benchmark measures what it says: real shifted digits, one sync per timed
span, gradients zeroed between routing calls, the CUDA fast settings, ours beside the baseline."""

import numpy as np
import pytest
import torch

from benchmarks import public_capsnet
from benchmarks import train_throughput as tt
from model.capsnet import CapsNet, CapsNetConfig
from model.routing import dynamic_routing
from tests.harness import FIXTURES


def test_one_sync_per_timed_span_not_per_step(monkeypatch):
    syncs = []
    monkeypatch.setattr(tt, "sync", lambda device: syncs.append(device))
    calls = []
    tt.per_step(lambda: calls.append(1), "cuda", steps=7)
    assert len(calls) == tt.WARMUP + 7 and len(syncs) == 2  # before and after the span


def test_batches_are_shifted_real_digits():
    task = tt.digits("cpu")
    with np.load(FIXTURES / "mnist_test_1000.npz") as f:
        assert torch.equal(task.train.images, torch.from_numpy(f["images"]))
    batch = task.draw(torch.arange(tt.BATCH), torch.Generator().manual_seed(0))
    x = tt.data.to_float(task.train.images[: tt.BATCH])
    assert batch.x.shape == x.shape and not torch.equal(batch.x, x)
    kept = batch.x.sum((1, 2, 3)) / x.sum((1, 2, 3))
    assert (kept > 0.95).all() and (kept > 0.999).float().mean() > 0.9  # shifted by 2 px: little ink cut


def test_routing_gradients_are_zeroed_between_calls():
    torch.manual_seed(0)
    u = torch.randn(4, 1152, 8, requires_grad=True)
    W = (0.05 * torch.randn(1152, 10, 16, 8)).requires_grad_()
    ref_u, ref_W = u.detach().clone().requires_grad_(), W.detach().clone().requires_grad_()
    dynamic_routing(torch.einsum("ijdk,bik->bijd", ref_W, ref_u), 3)[0].sum().backward()
    steps = tt.routing_steps(u, W)
    for _ in range(3):
        steps["ours_forward_backward"]()
    torch.testing.assert_close(u.grad, ref_u.grad)  # one call's gradient, not three calls' worth
    torch.testing.assert_close(W.grad, ref_W.grad)


def test_public_baseline_is_the_papers_network():
    model = public_capsnet.PublicCapsNet()
    assert sum(p.numel() for p in model.parameters()) == CapsNet(CapsNetConfig()).num_params() == 8_215_568
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([1, 2])
    lengths, recon = model(x, y)
    assert lengths.shape == (2, 10) and recon.shape == (2, 1, 28, 28)
    assert torch.isfinite(model.loss(lengths, recon, x, y))


@pytest.mark.slow
def test_bench_sets_the_fast_backends_and_reports_both_networks(monkeypatch):
    seen = []
    monkeypatch.setattr(tt, "setup_backends", lambda device: seen.append(device))
    result = tt.bench_device("cpu", steps=1, compile=False)
    assert seen == ["cpu"]
    timed = {
        "ours_forward_ms",
        "ours_forward_backward_ms",
        "baseline_forward_ms",
        "baseline_images_per_s",
        f"ours_{result['default_precision']}_images_per_s",
        "ratio",
    }
    assert timed <= set(result) and all(np.isfinite(result[k]) and result[k] > 0 for k in timed)


def test_setup_backends_turns_on_tf32_and_cudnn_benchmark(monkeypatch):
    for flag in ("benchmark", "allow_tf32"):
        monkeypatch.setattr(torch.backends.cudnn, flag, False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    tt.setup_backends("cuda")
    assert torch.backends.cudnn.benchmark and torch.backends.cudnn.allow_tf32
    assert torch.backends.cuda.matmul.allow_tf32
