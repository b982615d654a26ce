"""QP-regularised routing (qp-regularized-routing.txt, Eqs. 5-15) on a worked example, and the qp CapsNet."""

import pytest
import torch

from model.capsnet import CapsNet, CapsNetConfig
from model.routing import QPRouting, qp_agreement, qp_routing, qp_update, squash


@pytest.fixture
def example():
    """Two observations (labels 0 and 1), two children, two parents, 2-D votes u_hat[k, i, j]."""
    u_hat = torch.tensor(
        [
            [
                [[1.0, 0.0], [1.0, 1.0]],  # k = 0, child 0: votes for parent 0 and parent 1
                [[0.0, 1.0], [0.0, 0.0]],
            ],  # k = 0, child 1
            [
                [[0.0, 0.0], [0.0, 1.0]],  # k = 1, child 0
                [[1.0, 0.0], [1.0, 0.0]],
            ],  # k = 1, child 1
        ]
    )
    b = torch.tensor([[0.5, 1.0], [-1.0, 0.5]])  # b[i, j]
    return u_hat, b, torch.tensor([0, 1])


def test_agreement_worked_example(example):
    """s_jk = U_k^T b_j (Eq. 6): k=0: s_0 = (0.5, -1), s_1 = (1, 1); k=1: s_0 = (-1, 0), s_1 = (0.5, 1).
    delta (Eq. 5b): k=0 -> (+1, -1), k=1 -> (-1, +1). Term [i, j] = sum_k delta_jk u_hat_j|i,k . s_jk:
    [0,0] = 0.5 + 0 = 0.5, [1,0] = -1 + 1 = 0, [0,1] = -2 + 1 = -1, [1,1] = 0 + 0.5 = 0.5."""
    u_hat, b, y = example
    v, c = qp_routing(u_hat, b)
    s = torch.tensor([[[0.5, -1.0], [1.0, 1.0]], [[-1.0, 0.0], [0.5, 1.0]]])
    assert torch.allclose(v, squash(s))
    assert torch.equal(c, b.expand(2, 2, 2))
    assert torch.allclose(qp_agreement(u_hat, b, y), torch.tensor([[0.5, -1.0], [0.0, 0.5]]))


def test_l2_update_eq13_worked_example(example):
    """b + 2 gamma (term - lambda b) with gamma = 0.1, lambda = 0.2:
    0.5 + 0.2 (0.5 - 0.1) = 0.58, 1 + 0.2 (-1 - 0.2) = 0.76, -1 + 0.2 (0 + 0.2) = -0.96, 0.58."""
    u_hat, b, y = example
    new = qp_update(b, qp_agreement(u_hat, b, y), lr=0.1, lam=0.2, penalty="l2")
    assert torch.allclose(new, torch.tensor([[0.58, 0.76], [-0.96, 0.58]]))


def test_l1_update_eq15_worked_example(example):
    """b + 2 gamma (term - lambda / 2 sign(b)) with gamma = 0.1, lambda = 0.2:
    0.5 + 0.2 (0.5 - 0.1) = 0.58, 1 + 0.2 (-1 - 0.1) = 0.78, -1 + 0.2 (0 + 0.1) = -0.98, 0.58."""
    u_hat, b, y = example
    new = qp_update(b, qp_agreement(u_hat, b, y), lr=0.1, lam=0.2, penalty="l1")
    assert torch.allclose(new, torch.tensor([[0.58, 0.78], [-0.98, 0.58]]))
    # d|x|/dx is 0 at 0 (the paper's convention): a zero coefficient with no agreement stays zero
    zero = torch.zeros(2, 2)
    assert torch.equal(qp_update(zero, torch.zeros(2, 2), lr=0.1, lam=0.2, penalty="l1"), zero)


@pytest.mark.parametrize("penalty", ["l2", "l1"])
def test_updates_ascend_the_objective_of_eqs_12_and_14(penalty):
    """b' = b + gamma dJ/db with J = sum_j sum_k delta_jk ||U_k^T b_j||^2 - lambda ||b||_2^2 (or _1)."""
    torch.manual_seed(0)
    u_hat, y = torch.randn(6, 9, 4, 3), torch.randint(0, 4, (6,))
    b = torch.randn(9, 4, requires_grad=True)
    delta = 2 * torch.nn.functional.one_hot(y, 4) - 1
    s = torch.einsum("ij,bijd->bjd", b, u_hat)
    penalty_term = (b**2).sum() if penalty == "l2" else b.abs().sum()
    J = (delta * (s**2).sum(-1)).sum() - 0.05 * penalty_term
    (grad,) = torch.autograd.grad(J, b)
    new = qp_update(b.detach(), qp_agreement(u_hat, b.detach(), y), lr=1e-2, lam=0.05, penalty=penalty)
    assert torch.allclose(new, b.detach() + 1e-2 * grad, atol=1e-5)


def test_coefficients_are_unconstrained_in_sign():
    """No softmax (section III-B): a child that agrees with parent 0 only on other classes' images is
    pushed below zero and then counts against parent 0; rows need not sum to 1."""
    u_hat = torch.zeros(2, 2, 2, 2)
    u_hat[0, 1, 0] = torch.tensor([1.0, 0.0])  # class-0 image: only child 1 votes for parent 0
    u_hat[1, :, 0] = torch.tensor([1.0, 0.0])  # class-1 image: both children vote for parent 0
    y = torch.tensor([0, 1])
    routing = QPRouting(num_in=2, num_out=2, penalty="l2", lam=1e-3)
    for _ in range(20):
        routing.ascend(u_hat, y, lr=0.05)
    b = routing.b
    assert b[0, 0] < 0 < b[1, 0]
    v, lengths, c = routing(u_hat)
    assert torch.equal(c[1], b) and not torch.allclose(c.sum(-1), torch.ones(2, 2))
    assert torch.allclose(v[1, 0], squash(b[0, 0] * u_hat[1, 0, 0] + b[1, 0] * u_hat[1, 1, 0]))
    # lengths are ||v|| with capsule_length's eps inside the root, so a parent no child votes for
    # (v = 0, parent 1 here) has length sqrt(1e-8) = 1e-4, not 0: compare with that definition,
    # not with v.norm(), which differs from it by up to 1e-4 (and by rounding, just over atol=1e-4)
    torch.testing.assert_close(lengths, torch.sqrt((v * v).sum(-1) + 1e-8))
    assert (v[:, 1] == 0).all() and torch.allclose(lengths[:, 1], torch.full((2,), 1e-4))


def test_ascend_reduces_the_batch_term_before_the_step(example):
    """`reduce` (all_reduce under DDP) sees the batch sum; doubling it is the step of a doubled batch."""
    u_hat, b, y = example
    routing = QPRouting(num_in=2, num_out=2, penalty="l2", lam=0.2)
    routing.b.copy_(b)
    routing.ascend(u_hat, y, lr=0.1, reduce=lambda t: t.mul_(2))
    expected = qp_update(b, 2 * qp_agreement(u_hat, b, y), lr=0.1, lam=0.2, penalty="l2")
    assert torch.allclose(routing.b, expected)


def test_b_is_a_buffer_the_optimiser_never_sees():
    """Algorithm 1 updates the weights with b fixed: b is no parameter and gets no gradient."""
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(routing="qp-l1"))
    assert model.num_params() == 8_215_568  # the same weights as dynamic routing
    assert "digits.routing.b" in model.state_dict()
    assert all(p is not model.digits.routing.b for p in model.parameters())
    x, y = torch.rand(2, 1, 28, 28), torch.tensor([3, 4])
    model.loss(model(x, y), x, y).backward()
    assert model.digits.routing.b.grad is None
    assert model.digits.routing.penalty == "l1" and model.digits.routing.lam == 1e-3
    with pytest.raises(ValueError, match="penalty"):
        QPRouting(penalty="l3")
