"""squash (Eq. 1) and dynamic routing (Procedure 1) against the paper."""
import pytest
import torch

from model.routing import capsule_length, dynamic_routing, squash


@pytest.mark.parametrize("norm", [0.0, 1e-3, 0.5, 1.0, 3.0, 100.0])
def test_squash_maps_length_as_eq1_and_keeps_direction(norm):
    direction = torch.nn.functional.normalize(torch.randn(5, 16), dim=-1)
    v = squash(direction * norm)
    expected = norm ** 2 / (1 + norm ** 2)
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
