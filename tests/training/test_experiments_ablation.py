"""Table 1's ablation: each variant's switches change exactly what they say, the convergence measure
is appendix A's mean |delta b_ij|, and the experiment's command writes its rows and plot."""

import json
from dataclasses import asdict, replace

import pytest
import torch

from model.capsnet import CapsNet, margin_loss, reconstruction_loss
from model.routing import dynamic_routing, routing_logit_changes, squash
from training.experiments import ablation


def model_of(variant: str, tmp_path) -> CapsNet:
    """The network training/train.py builds from the variant's configs."""
    _, model_config = ablation.variant_configs(variant, ablation.parse_args(["--out", str(tmp_path)]), seed=0)
    return CapsNet(model_config)


@pytest.mark.parametrize(
    "variant, iters, decoder",
    [("r1-no-recon", 1, False), ("r1-recon", 1, True), ("r3-no-recon", 3, False), ("r3-recon", 3, True)],
)
def test_variant_switches_change_routing_and_decoder_only(variant, iters, decoder, tmp_path):
    model = model_of(variant, tmp_path)
    assert model.digits.routing.iters == iters and (model.decoder is not None) == decoder
    assert model.num_params() == (8_215_568 if decoder else 6_804_224)
    torch.manual_seed(0)
    x = torch.rand(2, 1, 28, 28)
    out = model(x, torch.tensor([3, 4]))
    assert (out.reconstruction is not None) == decoder
    y = torch.tensor([3, 4])
    expected = margin_loss(out.lengths, y) + (0.0005 * reconstruction_loss(out.reconstruction, x) if decoder else 0)
    assert torch.allclose(model.loss(out, x, y), expected)
    config, model_config = ablation.variant_configs(variant, ablation.parse_args([]), seed=1)
    other, other_model = ablation.variant_configs("r3-recon", ablation.parse_args([]), seed=1)
    assert replace(config, out=other.out) == other and config.seed == 1  # only the run directory differs
    diff = {k for k, v in asdict(model_config).items() if asdict(other_model)[k] != v}
    assert diff <= {"routing_iters", "reconstruction"}


def test_one_iteration_has_uniform_couplings_and_three_differ():
    torch.manual_seed(0)
    u_hat = torch.randn(2, 50, 10, 16)
    v1, c1 = dynamic_routing(u_hat, 1)
    _v3, c3 = dynamic_routing(u_hat, 3)
    assert torch.allclose(c1, torch.full_like(c1, 0.1)) and not torch.allclose(c3, c1)
    assert torch.allclose(v1, squash(0.1 * u_hat.sum(1)), atol=1e-6)  # r=1: v_j = squash(sum_i u_hat_j|i / 10)


def test_routing_logit_changes_are_the_agreements_added_per_iteration():
    torch.manual_seed(0)
    u_hat = torch.randn(3, 40, 10, 16)
    changes = routing_logit_changes(u_hat, 4)
    b = torch.zeros(3, 40, 10)
    for k in range(4):  # Procedure 1 by hand, recording |delta b| = |u_hat . v| at every iteration
        v = squash(torch.einsum("bij,bijd->bjd", torch.softmax(b, 2), u_hat))
        delta = torch.einsum("bijd,bjd->bij", u_hat, v)
        assert changes[k].item() == pytest.approx(delta.abs().mean().item(), rel=1e-5)
        b = b + delta
    assert changes.shape == (4,)


@pytest.mark.slow
def test_cli_trains_four_variants_and_plots_convergence(idx_dir, tmp_path):
    argv = [
        "--data-dir",
        str(idx_dir),
        "--val-size",
        "100",
        "--train-limit",
        "64",
        "--batch-size",
        "32",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "runs"),
        "--results-dir",
        str(tmp_path),
        "--figure",
        str(tmp_path / "conv.png"),
        "--max-iters",
        "4",
        "--curve-images",
        "20",
    ]
    ablation.main([*argv, "--seeds", "0"])
    first = (tmp_path / "runs" / "r3-recon" / "seed0" / "best.pt").stat().st_mtime_ns
    result = ablation.main([*argv, "--seeds", "0", "1"])  # seed 0 is kept, seed 1 is trained
    assert (tmp_path / "runs" / "r3-recon" / "seed0" / "best.pt").stat().st_mtime_ns == first
    record = json.loads((tmp_path / "ablation.json").read_text())
    assert [r["variant"] for r in record["rows"]] == list(ablation.VARIANTS)
    assert [r["paper"] for r in record["rows"]] == [0.34, 0.29, 0.35, 0.25]
    assert all(r["reduced"] and r["train_images"] == 64 for r in record["rows"])
    for r in record["rows"]:  # two trials each: the row is their mean, with their sample std
        assert len(r["trials"]) == 2 and r["ours"] == pytest.approx(sum(r["trials"]) / 2, abs=0.011)
        assert r["std"] == pytest.approx(abs(r["trials"][0] - r["trials"][1]) / 2**0.5, abs=0.011)
    assert set(record["convergence"]["curves"]) == {"trained with r=3", "trained with r=1"}
    assert all(len(c) == 4 for c in result["curves"].values())
    assert (tmp_path / "conv.png").stat().st_size > 5_000
    ckpt = torch.load(tmp_path / "runs" / "r1-no-recon" / "seed1" / "best.pt", weights_only=True)
    assert ckpt["config"]["reconstruction"] is False and ckpt["config"]["routing_iters"] == 1
