"""Every routing trains with one command, rebuilds from its checkpoint and exports under the contract."""

import numpy as np
import onnxruntime as ort
import pytest
import torch

from model import contract
from model.capsnet import CapsNet, CapsNetConfig
from model.routing import ROUTINGS
from training import export, graphs, train
from training.evaluate import load_checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("routing", ROUTINGS)
def test_each_routing_exports_and_matches_pytorch(routing, tmp_path, mnist_fixture):
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(routing=routing)).eval()
    if routing.startswith("qp"):  # learned coefficients of both signs must survive the export
        model.digits.routing.b.copy_(0.2 * torch.randn_like(model.digits.routing.b))
    capsnet_path, decoder_path = graphs.export(model, tmp_path)
    images, _ = mnist_fixture
    assert graphs.check_parity(model, capsnet_path, decoder_path, images, batches=(1, 7)) <= graphs.PARITY_TOL

    sess = ort.InferenceSession(str(capsnet_path), providers=["CPUExecutionProvider"])
    config = model.config
    outputs = contract.capsnet_outputs(config.image_size, config.routing, config.routing_iters)
    assert tuple(o.name for o in sess.get_outputs()) == tuple(outputs)  # dynamic: every iteration too
    for node in sess.get_outputs():
        assert tuple(node.shape) == outputs[node.name], node.name
    x = images[:3, None].astype(np.float32) / 255.0
    lengths, _, coefficients, _, vote_lengths = sess.run(list(contract.CAPSNET_OUTPUTS), {contract.IMAGE: x})
    assert ((lengths >= 0) & (lengths <= 1)).all() and (vote_lengths >= 0).all()
    if routing.startswith("qp"):  # routing = b broadcast: any sign, rows free
        b = model.digits.routing.b.numpy()
        np.testing.assert_allclose(coefficients, np.broadcast_to(b, coefficients.shape), atol=1e-6)
        assert (coefficients < 0).any()
    else:  # couplings (dynamic) or responsibilities (em): rows sum to 1 over the parents
        np.testing.assert_allclose(coefficients.sum(-1), 1.0, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("routing", ["em", "qp-l2", "qp-l1"])
def test_cli_trains_and_exports_each_routing(routing, idx_dir, tmp_path):
    out = tmp_path / "run"
    result = train.main(
        [
            "--data-dir",
            str(idx_dir),
            "--val-size",
            "100",
            "--batch-size",
            "32",
            "--train-limit",
            "64",
            "--epochs",
            "1",
            "--eval-batch-size",
            "200",
            "--routing",
            routing,
            "--out",
            str(out),
        ]
    )
    assert result["run"].kept_epoch == 1 and result["run"].history[0]["train_images_per_s"] > 0
    model, ckpt = load_checkpoint(out / "best.pt")  # weights_only=True inside
    assert ckpt["config"]["routing"] == routing == model.config.routing
    if routing.startswith("qp"):  # Algorithm 1's routing steps ran: b left its uniform start
        b = model.digits.routing.b
        assert torch.isfinite(b).all() and not torch.allclose(b, torch.full_like(b, 0.1))
    card = export.main(
        [
            "--checkpoint",
            str(out / "best.pt"),
            "--out-dir",
            str(tmp_path / "m"),
            "--data-dir",
            str(idx_dir),
            "--no-evaluate",
        ]
    )
    assert card["routing"] == routing and card["parity_max_abs_diff"] <= graphs.PARITY_TOL


@pytest.mark.slow
def test_qp_alternation_flags(idx_dir, tmp_path):
    """--n-r 0 leaves b at its start; --n-w 2 takes two weight steps per batch (Algorithm 1)."""
    args = [
        "--data-dir",
        str(idx_dir),
        "--val-size",
        "100",
        "--batch-size",
        "32",
        "--train-limit",
        "32",
        "--epochs",
        "1",
        "--eval-batch-size",
        "200",
        "--routing",
        "qp-l2",
    ]
    train.main([*args, "--n-r", "0", "--n-w", "2", "--out", str(tmp_path / "a")])
    ckpt = torch.load(tmp_path / "a" / "last.pt", weights_only=True)
    assert torch.equal(ckpt["model"]["digits.routing.b"], torch.full((1152, 10), 0.1))
    assert ckpt["optimizer"]["state"][0]["step"] == 2  # one batch, two Adam steps
