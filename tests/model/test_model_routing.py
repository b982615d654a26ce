"""squash (Eq. 1) and dynamic routing (Procedure 1) against the paper, and the fused training path against both."""

import pytest
import torch

from model.capsnet import DigitCaps
from model.routing import (
    capsule_length,
    digit_routing,
    dynamic_routing,
    fused_digit_routing,
    routing_logit_changes,
    squash,
)


@pytest.mark.parametrize("norm", [0.0, 1e-3, 0.5, 1.0, 3.0, 100.0])
def test_squash_maps_length_as_eq1_and_keeps_direction(norm):
    direction = torch.nn.functional.normalize(torch.randn(5, 16), dim=-1)
    v = squash(direction * norm)
    expected = norm**2 / (1 + norm**2)
    assert torch.allclose(v.norm(dim=-1), torch.full((5,), expected), atol=1e-6)
    if norm > 0:
        assert torch.allclose(torch.nn.functional.normalize(v, dim=-1), direction, atol=1e-5)


def test_squash_of_zero_has_finite_gradient():
    s = torch.zeros(3, 8, requires_grad=True)
    squash(s).sum().backward()
    assert torch.isfinite(s.grad).all()
    length = torch.zeros(2, 16, requires_grad=True)
    capsule_length(length).sum().backward()
    assert torch.isfinite(length.grad).all()


def test_coupling_rows_sum_to_one_and_shapes():
    u_hat = torch.randn(4, 1152, 10, 16)
    v, c = dynamic_routing(u_hat, iters=3)
    assert v.shape == (4, 10, 16) and c.shape == (4, 1152, 10)
    assert torch.allclose(c.sum(dim=2), torch.ones(4, 1152), atol=1e-6)
    assert (v.norm(dim=-1) < 1).all()


def test_one_iteration_output_is_eq2_with_uniform_c():
    u_hat = torch.randn(1, 6, 3, 4)
    v, _ = dynamic_routing(u_hat, iters=1)
    assert torch.allclose(v, squash(u_hat.sum(dim=1) / 3), atol=1e-6)


def test_agreeing_parent_gets_the_coupling():
    """Six children all predict the same vector for parent 0 and cancelling ones for parent 1."""
    agree = torch.tensor([0.5, 0.5, 0.0, 0.0]).expand(6, 4)
    scatter = torch.tensor([[0.0, 0, 1, 0], [0, 0, -1, 0], [0, 0, 0, 1], [0, 0, 0, -1], [0, 1, 0, 0], [0, -1, 0, 0]])
    u_hat = torch.stack([agree, scatter], dim=1).unsqueeze(0)  # (1, 6, 2, 4)
    _, c1 = dynamic_routing(u_hat, iters=1)
    _, c3 = dynamic_routing(u_hat, iters=3)
    assert torch.allclose(c1, torch.full_like(c1, 0.5))
    assert (c3[0, :, 0] > 0.5).all()
    assert c3[0, :, 0].mean() > 0.6


def test_routing_does_not_depend_on_the_batch():
    """b_ij restarts at zero for every example: one image alone routes as it does in a batch."""
    u_hat = torch.randn(5, 100, 10, 16)
    v_batch, c_batch = dynamic_routing(u_hat, iters=3)
    v_one, c_one = dynamic_routing(u_hat[2:3], iters=3)
    assert torch.allclose(v_batch[2:3], v_one, atol=1e-6)
    assert torch.allclose(c_batch[2:3], c_one, atol=1e-6)


def test_gradient_flows_through_every_iteration():
    """The coupling coefficients depend on u_hat; back-propagating through them changes the gradient."""
    u_hat = torch.randn(2, 20, 10, 16, requires_grad=True)
    v, _ = dynamic_routing(u_hat, iters=3)
    (g_full,) = torch.autograd.grad(v.norm(dim=-1).sum(), u_hat)
    _, c = dynamic_routing(u_hat.detach(), iters=3)
    v_const_c = squash(torch.einsum("bij,bijd->bjd", c, u_hat))
    (g_const,) = torch.autograd.grad(v_const_c.norm(dim=-1).sum(), u_hat)
    assert not torch.allclose(g_full, g_const, atol=1e-6)


def test_zero_iterations_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        dynamic_routing(torch.randn(1, 2, 3, 4), iters=0)


def test_one_iteration_couples_uniformly():
    _, c = dynamic_routing(torch.randn(2, 50, 10, 16), iters=1)
    assert torch.allclose(c, torch.full_like(c, 0.1))


@pytest.mark.parametrize("iters", [1, 3])
def test_digit_routing_is_procedure_1_on_the_votes_of_eq_2(iters):
    """The inference formulation (matmuls, parent-major votes) = dynamic_routing(einsum(W, u)), votes included."""
    torch.manual_seed(0)
    u, W = torch.randn(5, 7, 3, dtype=torch.float64), torch.randn(7, 4, 6, 3, dtype=torch.float64)
    u_hat_ref = torch.einsum("ijdk,bik->bijd", W, u)
    v_ref, c_ref = dynamic_routing(u_hat_ref, iters)
    v, c, u_hat, iterations = digit_routing(u, W, iters)
    for got, want in ((v, v_ref), (c, c_ref), (u_hat, u_hat_ref)):
        torch.testing.assert_close(got, want)
    assert iterations.couplings.shape == (5, iters, 7, 4) and iterations.logit_changes.shape == (5, iters)
    for r in range(iters):  # iteration r + 1 used the couplings of dynamic_routing(u_hat, r + 1)
        torch.testing.assert_close(iterations.couplings[:, r], dynamic_routing(u_hat_ref, r + 1)[1])
    torch.testing.assert_close(iterations.couplings[:, -1], c)
    per_image = torch.stack([routing_logit_changes(u_hat_ref[b : b + 1], iters) for b in range(5)])
    torch.testing.assert_close(iterations.logit_changes, per_image)


@pytest.mark.parametrize("iters, chunk", [(1, 2), (2, 3), (3, 2), (3, 8)])
def test_fused_digit_routing_matches_procedure_1_and_its_gradients(iters, chunk):
    """fused_digit_routing = dynamic_routing(W u) in value and in both gradients (its backward is
    hand-written); gradcheck in float64, chunks that do and do not divide the batch."""
    torch.manual_seed(0)
    u = torch.randn(5, 7, 3, dtype=torch.float64, requires_grad=True)
    W = torch.randn(7, 4, 6, 3, dtype=torch.float64, requires_grad=True)
    v_ref, c_ref = dynamic_routing(torch.einsum("ijdk,bik->bijd", W, u), iters)
    v, c = fused_digit_routing(u, W, iters, chunk)
    torch.testing.assert_close(v, v_ref)
    torch.testing.assert_close(c, c_ref)
    gv, gc = torch.randn_like(v), torch.randn_like(c)  # a loss through both outputs
    ref = torch.autograd.grad((v_ref * gv).sum() + (c_ref * gc).sum(), (u, W))
    got = torch.autograd.grad((v * gv).sum() + (c * gc).sum(), (u, W))
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b)
    assert torch.autograd.gradcheck(lambda a, b: fused_digit_routing(a, b, iters, chunk), (u, W))


def test_training_forward_uses_the_fused_routing_with_the_same_result():
    """DigitCaps in training (fused, no votes stored) and in eval (plain Procedure 1) agree."""
    torch.manual_seed(0)
    layer, u = DigitCaps(), torch.randn(3, 1152, 8, requires_grad=True)
    trained = layer.train()(u)
    assert trained.votes is None and trained.iterations is None and trained.capsules.requires_grad
    with torch.no_grad():
        evaluated = layer.eval()(u)
    assert evaluated.votes.shape == (3, 1152, 10, 16)
    assert evaluated.iterations.couplings.shape == (3, 3, 1152, 10)
    torch.testing.assert_close(trained.capsules, evaluated.capsules)
    torch.testing.assert_close(trained.routing, evaluated.routing)


def test_fused_digit_routing_is_fp32_under_bf16_autocast_and_with_bf16_inputs():
    """The fused routing computes in fp32 whatever the autocast state and input dtypes: run (and
    differentiated) inside a bf16 autocast region, as torch.compile traces its backward, and fed bf16
    capsules and bf16 output gradients, it matches the fp32 computation on the same values."""
    torch.manual_seed(0)
    u, W = squash(torch.randn(4, 12, 8)), 0.1 * torch.randn(12, 10, 16, 8)
    gv, gc = torch.randn(4, 10, 16), torch.randn(4, 12, 10)

    def run(u, W, gv, gc, amp):
        u, W = u.clone().requires_grad_(), W.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            v, c = fused_digit_routing(u, W, 3, 3)
            torch.autograd.backward((v, c), (gv, gc))
        return v, c, u.grad, W.grad

    u16, gv16, gc16 = u.bfloat16(), gv.bfloat16(), gc.bfloat16()
    ref = run(u16.float(), W, gv16.float(), gc16.float(), amp=False)
    for u_in, gv_in, gc_in in (u16.float(), gv16.float(), gc16.float()), (u16, gv16, gc16):
        v, c, grad_u, grad_W = run(u_in, W, gv_in, gc_in, amp=True)
        assert v.dtype == c.dtype == grad_W.dtype == torch.float32
        assert grad_u.dtype == u_in.dtype  # each gradient in its input's dtype
        for a, b in zip((v, c, grad_u, grad_W), ref, strict=True):
            torch.testing.assert_close(a, b.to(a.dtype), rtol=0, atol=1e-5)
