"""EM routing (matrix capsules, tutorial Eqs. 20-29) on hand-made votes, and the em CapsNet."""

import math

import pytest
import torch

from model import contract
from model.capsnet import CapsNet, CapsNetConfig, MatrixDigitCaps, PrimaryMatrixCaps, spread_loss
from model.routing import em_e_step, em_m_step, em_routing

ZERO = torch.zeros(())  # beta_u = beta_a = 0


def test_responsibilities_sum_to_one_over_parents():
    torch.manual_seed(0)
    votes, a_in = torch.randn(3, 40, 5, 16), torch.rand(3, 40)
    mu, a, R = em_routing(votes, a_in, torch.zeros(5), torch.zeros(5), iters=3)
    assert mu.shape == (3, 5, 16) and a.shape == (3, 5) and R.shape == (3, 40, 5)
    assert torch.allclose(R.sum(dim=2), torch.ones(3, 40), atol=1e-5)
    assert ((a > 0) & (a < 1)).all()
    mu, sigma_sq, a = em_m_step(R, a_in, votes, ZERO, ZERO, inv_temp=1.0)
    assert torch.allclose(em_e_step(votes, mu, sigma_sq, a).sum(dim=2), torch.ones(3, 40), atol=1e-5)


def test_one_iteration_routes_uniformly():
    """Eq. 20: R_ij = 1 / N_out before the first M-step."""
    _, _, R = em_routing(torch.randn(2, 8, 4, 16), torch.rand(2, 8), torch.zeros(4), torch.zeros(4), iters=1)
    assert torch.allclose(R, torch.full_like(R, 0.25))


def test_m_step_recovers_the_mean_and_variance_of_the_votes():
    """Eq. 22 on hand-made votes: R-weighted by a_i (Eq. 21), so an inactive child is left out."""
    torch.manual_seed(0)
    votes = torch.randn(1, 6, 2, 16)
    R = torch.full((1, 6, 2), 0.5)
    a_in = torch.tensor([[1.0, 1, 1, 1, 1, 0]])  # the last child is absent
    mu, sigma_sq, _ = em_m_step(R, a_in, votes, ZERO, ZERO, inv_temp=1.0, var_floor=0.0, eps=0.0)
    present = votes[0, :5]  # (5, 2, 16)
    assert torch.allclose(mu[0], present.mean(dim=0), atol=1e-6)
    assert torch.allclose(sigma_sq[0], present.var(dim=0, unbiased=False), atol=1e-6)
    # responsibilities weigh the votes: all of child 0 and none of the others gives its vote back
    R = torch.zeros(1, 6, 2)
    R[0, 0, 0] = R[0, 1:, 1] = 1.0
    mu, sigma_sq, _ = em_m_step(R, torch.ones(1, 6), votes, ZERO, ZERO, inv_temp=1.0, var_floor=1e-6, eps=0.0)
    assert torch.allclose(mu[0, 0], votes[0, 0, 0], atol=1e-6)
    assert torch.allclose(sigma_sq[0, 0], torch.full((16,), 1e-6))  # one vote: only the floor is left


def test_activations_fall_when_votes_disagree():
    """Eqs. 26-27: a parent whose votes spread out costs more and is less active."""
    torch.manual_seed(0)
    centre = torch.randn(1, 1, 3, 16)
    noise = torch.randn(1, 50, 3, 16)
    spread = torch.tensor([0.01, 0.1, 1.0]).view(1, 1, 3, 1)  # parent 0 tight ... parent 2 scattered
    votes, a_in, beta_u = centre + spread * noise, torch.ones(1, 50), torch.zeros(3)
    # beta_a at the scale of these costs (16 entries x 50 children x a few nats): lambda beta_a = -1
    beta_a = torch.full((3,), -1000.0)
    _, a, _ = em_routing(votes, a_in, beta_u, beta_a, iters=1)  # one M-step: uniform R, equal masses
    assert a[0, 0] > a[0, 1] > a[0, 2]
    _, a, R = em_routing(votes, a_in, beta_u, beta_a, iters=3)
    assert (R[0, :, 0] > 0.99).all()  # the E-steps hand every child to the parent that explains it
    # parent 0: cost ~ 50 x 16 x ln 0.01 ~ -3,700 nats, a = logistic(3.7 - 1); the others, left with
    # no mass, fall to logistic(lambda beta_a) = logistic(-1) = 0.27
    assert a[0, 0] > 0.9 and torch.allclose(a[0, 1:], torch.sigmoid(torch.tensor(-1.0)), atol=0.01)
    # scattering parent 0's votes (sigma 3, log sigma > 0) takes its activation down
    spread[0, 0, 0, 0] = 3.0
    _, a_scattered, _ = em_routing(centre + spread * noise, a_in, beta_u, beta_a, iters=3)
    assert a_scattered[0, 0] < 0.27 < 0.9 < a[0, 0]


def two_clusters(seed: int = 0) -> torch.Tensor:
    """40 children, 3 parents: children 0-19 vote tightly (sigma 0.05) for parent 0, 20-39 for parent 1;
    every other vote is scattered (sigma 1) around its parent's centre. (1, 40, 3, 16)."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randn(1, 1, 3, 16, generator=g)
    sigma = torch.ones(1, 40, 3, 1)
    sigma[0, :20, 0] = sigma[0, 20:, 1] = 0.05
    return centre + sigma * torch.randn(1, 40, 3, 16, generator=g)


def test_two_clusters_of_votes_one_parent_takes_each():
    """The routing result is known: each cluster's children go to the parent they agree on, both those
    parents are active and the third, with no agreement, is not; Eq. 21 weighs a child by a_i."""
    votes, zeros = two_clusters(), torch.zeros(3)
    _, a, R = em_routing(votes, torch.ones(1, 40), zeros, zeros, iters=3)
    assert (R[0, :20, 0] > 0.9).all() and (R[0, 20:, 1] > 0.9).all()
    # 20 children x 16 entries x ln 0.05 ~ -960 nats at lambda = 1e-3: logistic(0.96) = 0.72; the third
    # parent is left with no mass, its cost 0: logistic(0) = 0.5
    assert min(a[0, 0], a[0, 1]) > 0.7 and abs(a[0, 2] - 0.5) < 0.01
    # the second cluster's children nearly absent (a_i = 0.05): parent 1 loses its mass and its
    # activation, parent 0 keeps both
    a_in = torch.ones(1, 40)
    a_in[0, 20:] = 0.05
    _, a_faint, _ = em_routing(votes, a_in, zeros, zeros, iters=3)
    assert a_faint[0, 1] < 0.6 < 0.7 < a[0, 1]
    assert torch.allclose(a_faint[0, 0], a[0, 0], atol=0.02)


def test_gradient_reaches_the_votes_the_activations_and_both_betas():
    """Training moves W (through the votes), the primary activations and beta_u, beta_a: every one of
    them gets a finite, non-zero gradient through the three iterations."""
    votes = two_clusters().requires_grad_()
    a_in = torch.full((1, 40), 0.9, requires_grad=True)
    beta_u, beta_a = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
    mu, a, _ = em_routing(votes, a_in, beta_u, beta_a, iters=3)
    (spread_loss(a, torch.tensor([1]), 0.5) + mu.square().mean()).backward()
    for name, t in {"votes": votes, "a_in": a_in, "beta_u": beta_u, "beta_a": beta_a}.items():
        assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0, name
    # lowering the loss of target 1 means raising parent 1's activation: beta_a's gradient says so
    assert beta_a.grad[1] < 0


def test_e_step_prefers_the_parent_whose_gaussian_fits():
    """Eq. 29: R_ij ~ a_j p_j(V_ij); a vote at parent 1's mean goes to parent 1."""
    mu = torch.stack([torch.zeros(16), torch.ones(16)]).unsqueeze(0)  # (1, 2, 16)
    sigma_sq = torch.full((1, 2, 16), 0.1)
    votes = torch.stack([torch.zeros(2, 16), torch.ones(2, 16)]).unsqueeze(0)  # child 0 at mu_0, child 1 at mu_1
    R = em_e_step(votes, mu, sigma_sq, torch.tensor([[0.5, 0.5]]))
    assert R[0, 0, 0] > 0.99 and R[0, 1, 1] > 0.99


def test_e_step_is_stable_where_densities_underflow():
    """16-D Gaussian densities of far votes are 0 in float32; the log domain still ranks them."""
    mu = torch.stack([torch.zeros(16), torch.full((16,), 50.0)]).unsqueeze(0)
    sigma_sq = torch.full((1, 2, 16), 1e-3)
    votes = torch.full((1, 1, 2, 16), 100.0)  # far from both, nearer parent 1
    assert torch.exp(-0.5 * ((votes - mu.unsqueeze(1)) ** 2 / sigma_sq).sum(-1)).max() == 0
    R = em_e_step(votes, mu, sigma_sq, torch.tensor([[0.5, 0.5]]))
    assert torch.isfinite(R).all() and R[0, 0, 1] > 0.99


def test_no_nan_with_zero_activation_inputs():
    """No active child: every parent gets no mass; the variance floor keeps logs and gradients finite."""
    votes = torch.randn(2, 30, 10, 16, requires_grad=True)
    a_in = torch.zeros(2, 30, requires_grad=True)
    beta_u, beta_a = torch.zeros(10, requires_grad=True), torch.zeros(10, requires_grad=True)
    mu, a, R = em_routing(votes, a_in, beta_u, beta_a, iters=3)
    for t in (mu, a, R):
        assert torch.isfinite(t).all()
    (mu.sum() + a.sum()).backward()
    for t in (votes, a_in, beta_u, beta_a):
        assert torch.isfinite(t.grad).all()
    # identical votes (zero variance) are finite too
    same = torch.ones(1, 30, 10, 16)
    assert all(torch.isfinite(t).all() for t in em_routing(same, torch.ones(1, 30), torch.zeros(10), torch.zeros(10)))


def test_routing_does_not_depend_on_the_batch():
    torch.manual_seed(0)
    votes, a_in = torch.randn(4, 20, 10, 16), torch.rand(4, 20)
    mu, a, R = em_routing(votes, a_in, torch.zeros(10), torch.zeros(10))
    mu1, a1, R1 = em_routing(votes[1:2], a_in[1:2], torch.zeros(10), torch.zeros(10))
    assert torch.allclose(mu[1:2], mu1, atol=1e-5) and torch.allclose(a[1:2], a1, atol=1e-6)
    assert torch.allclose(R[1:2], R1, atol=1e-6)


def test_zero_iterations_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        em_routing(torch.randn(1, 2, 3, 16), torch.ones(1, 2), torch.zeros(3), torch.zeros(3), iters=0)


def test_votes_are_pose_times_w():
    """V_ij = M_i W_ij with 4x4 matrices, flattened row-major into the 16-D capsule."""
    torch.manual_seed(0)
    layer = MatrixDigitCaps(in_caps=5, num_caps=3)
    pose, a = torch.randn(2, 5, 16), torch.rand(2, 5)
    votes = layer((pose, a)).votes
    assert votes.shape == (2, 5, 3, 16)
    M, W = pose[1, 4].view(4, 4), layer.W[4, 2]
    assert torch.allclose(votes[1, 4, 2], (M @ W).flatten(), atol=1e-6)


def test_primary_matrix_capsules_follow_the_capsule_index():
    """Pose channel type*16+h and activation channel type at (row, col) -> capsule type*36 + row*6 + col."""
    layer = PrimaryMatrixCaps(in_chans=1)
    layer.conv = torch.nn.Identity()
    x = torch.zeros(1, 256, 6, 6)
    pose, a = layer(x)
    assert pose.shape == (1, 1152, 16) and a.shape == (1, 1152)
    with torch.no_grad():
        layer.pose.weight.zero_()
        layer.pose.bias.zero_()
        layer.pose.bias[3 * 16 + 5] = 1.0  # type 3, pose entry 5, everywhere
    pose, _ = layer(x)
    assert (pose[0, 3 * 36 : 4 * 36, 5] == 1).all() and pose.abs().sum() == 36


def test_em_capsnet_keeps_the_contract_shapes():
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(routing="em")).eval()
    with torch.no_grad():
        out = model(torch.rand(3, 1, 28, 28))
        blank = model(torch.zeros(2, 1, 28, 28))
    assert out.lengths.shape == (3, contract.NUM_CLASSES)
    assert out.capsules.shape == (3, contract.NUM_CLASSES, contract.CAPSULE_DIM)
    assert out.routing.shape == (3, contract.NUM_PRIMARY, contract.NUM_CLASSES)
    assert out.votes.shape == (3, contract.NUM_PRIMARY, contract.NUM_CLASSES, contract.CAPSULE_DIM)
    assert ((out.lengths > 0) & (out.lengths < 1)).all()
    assert torch.allclose(out.routing.sum(-1), torch.ones(3, contract.NUM_PRIMARY), atol=1e-5)
    assert all(torch.isfinite(t).all() for t in blank if t is not None)


def test_config_checks_the_routing():
    with pytest.raises(ValueError, match="routing must be one of"):
        CapsNetConfig(routing="softmax")
    with pytest.raises(ValueError, match="4x4"):
        CapsNetConfig(routing="em", caps_dim=8)
    assert math.isclose(CapsNetConfig().em_inv_temp, 1e-3)
    with pytest.raises(ValueError, match="loss must be one of"):
        CapsNetConfig(loss="hinge")


def test_each_routing_takes_its_papers_loss():
    """EM routing trains with matrix capsules' spread loss, the others with Eq. 4's margin loss; either
    can be chosen."""
    assert CapsNetConfig(routing="em").loss == "spread" and CapsNetConfig().loss == "margin"
    assert CapsNetConfig(routing="qp-l2").loss == "margin"
    assert CapsNetConfig(routing="em", loss="margin").loss == "margin"
