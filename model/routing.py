"""Routing between capsule layers: dynamic routing, EM routing and QP-regularised routing.

Papers:
    `Dynamic Routing Between Capsules` - Sabour, Frosst & Hinton, NIPS 2017
        https://arxiv.org/abs/1710.09829 (Procedure 1, Eqs. 1-3)
    `Matrix Capsules with EM Routing` - Hinton, Sabour & Frosst, ICLR 2018
        https://openreview.net/forum?id=HJWLfGWRb (equation numbers as in our copy of the tutorial,
        shared/papers/tutorial-dynamic-and-em-routing.md, Eqs. 20-29)
    QP-regularised routing (shared/papers/qp-regularized-routing.txt): routing coefficients b_j learned
        by gradient ascent on a label-signed quadratic objective with an l2 or l1 penalty, no softmax
        (Eqs. 5-15, Algorithm 1)

Each algorithm is a plain function over tensors (testable on hand-made votes) plus a thin module with
one interface:

    routing(votes (B, N_in, N_out, D), activations (B, N_in) or None) -> (v, a, c)
        v: parent capsules (B, N_out, D); a: their activations (B, N_out), the class probabilities;
        c: the coefficients the algorithm routed with (B, N_in, N_out).

| name    | v                | a              | c                                     | extra state         |
|---------|------------------|----------------|---------------------------------------|---------------------|
| dynamic | squash(s_j)      | ||v_j||        | softmax couplings, rows sum to 1      | none                |
| em      | mean pose mu_j   | logistic a_j   | responsibilities R_ij, rows sum to 1  | learned beta_u/a    |
| qp-l2/1 | squash(U^T b_j)  | ||v_j||        | learned b_ij, any sign, rows free     | buffer b (Alg. 1)   |

The loops run over routing iterations only; every capsule is handled at once.
"""

import math
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

ROUTINGS = ("dynamic", "em", "qp-l2", "qp-l1")  # the --routing choices; em needs matrix capsules
CPU_CHUNK = 8  # images per chunk of fused_digit_routing on a CPU: their votes (0.7 MB each) stay in cache


def squash(s: torch.Tensor, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    """The capsule non-linearity, Eq. 1: v = ||s||^2 / (1 + ||s||^2) * s / ||s||.

    Keeps the direction of s and maps its length ||s|| to ||s||^2 / (1 + ||s||^2) in [0, 1).

    Args:
        s: capsule total inputs, the vector along `dim`.
        dim: the capsule dimension.
        eps: added inside the square root so that s = 0 has a finite gradient (public
            reimplementations that add it outside, or not at all, produce NaN on dead capsules).
    """
    sq_norm = (s * s).sum(dim=dim, keepdim=True)
    return sq_norm / (1.0 + sq_norm) * s / torch.sqrt(sq_norm + eps)


def capsule_length(v: torch.Tensor, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    """||v_j||, the probability that capsule j's entity exists (section 2). eps inside the root."""
    return torch.sqrt((v * v).sum(dim=dim) + eps)


# --- dynamic routing (Sabour et al.) -------------------------------------------------------------


def dynamic_routing(u_hat: torch.Tensor, iters: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing by agreement, Procedure 1.

    b_ij = 0; then r times: c_i = softmax_j(b_i) (Eq. 3), s_j = sum_i c_ij u_hat_j|i (Eq. 2),
    v_j = squash(s_j) (Eq. 1), b_ij += u_hat_j|i . v_j (the agreement a_ij).

    Args:
        u_hat: prediction vectors u_hat_j|i = W_ij u_i, shape (B, N_in, N_out, D).
        iters: r, the number of routing iterations (the paper uses 3).

    Returns:
        v: output capsules, (B, N_out, D).
        c: the coupling coefficients used for the final v, (B, N_in, N_out); each row sums to 1.

    The logits b start at zero for every example on every call: they are never a parameter or a
    buffer, so one example cannot change another's routing and the batch size cannot change a
    prediction. The softmax runs over the N_out parents (dim 2), not over the N_in children.
    Gradients flow through every iteration, as in the official code and CapsNet-Keras.
    """
    if iters < 1:
        raise ValueError(f"routing needs at least one iteration, got {iters}")
    b = u_hat.new_zeros(u_hat.shape[:3])  # (B, N_in, N_out)
    for r in range(iters):
        c = torch.softmax(b, dim=2)  # (B, N_in, N_out)
        s = torch.einsum("bij,bijd->bjd", c, u_hat)  # (B, N_out, D)
        v = squash(s)  # (B, N_out, D)
        if r < iters - 1:
            b = b + torch.einsum("bijd,bjd->bij", u_hat, v)  # agreement a_ij
    return v, c


def _agreement(u_hat: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """a_ij = u_hat_j|i . v_j (Procedure 1, line 7) of parent-major votes (B, N_out, N_in, D) and parents
    (B, N_out, D): (B, N_out, N_in), one batched matmul."""
    B, J, I, D = u_hat.shape
    return torch.bmm(u_hat.view(B * J, I, D), v.view(B * J, D, 1)).view(B, J, I)


def _route(u_hat: torch.Tensor, iters: int) -> tuple[list, list, list, list]:
    """Procedure 1 on parent-major votes u_hat (B, N_out, N_in, D); every iteration's c, s and v, and the
    agreements a_ij that iterations 1..r-1 added to the logits (the last iteration adds none)."""
    B, J, I, D = u_hat.shape
    uf = u_hat.view(B * J, I, D)
    b = u_hat.new_zeros(B, J, I)
    cs, ss, vs, agreements = [], [], [], []
    for r in range(iters):
        c = torch.softmax(b, dim=1)  # Eq. 3, over the parents, (B, J, I)
        s = torch.bmm(c.view(B * J, 1, I), uf).view(B, J, D)  # Eq. 2
        v = squash(s)  # Eq. 1
        cs.append(c)
        ss.append(s)
        vs.append(v)
        if r < iters - 1:
            agreements.append(_agreement(u_hat, v))
            b = b + agreements[-1]
    return cs, ss, vs, agreements


def _squash_backward(s: torch.Tensor, grad_v: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """d L / d s of v = squash(s) (Eq. 1, eps as in squash), in closed form: v = k(n) s with n = |s|^2
    and k = n / ((1 + n) sqrt(n + eps)), so d L / d s = k g + 2 k'(n) (g . s) s."""
    n = (s * s).sum(-1, keepdim=True)
    q = 1.0 / ((1.0 + n) * torch.sqrt(n + eps))  # k / n, finite at n = 0
    k = n * q
    dk = q - k / (1.0 + n) - 0.5 * k / (n + eps)
    return k * grad_v + 2.0 * dk * (grad_v * s).sum(-1, keepdim=True) * s


def _route_backward(u_hat, cs, ss, vs, grad_v, grad_c) -> torch.Tensor:
    """d L / d u_hat of _route, given d L / d v and d L / d c of its last iteration (either may be None).

    The votes' gradient is a sum of outer products, sum_r c^r_ij g(s^r_j) + sum_{r<last} g(a^r_ij) v^r_j,
    taken as one batched matmul of rank 2r - 1 instead of one tensor the size of the votes per term.
    """
    B, J, I, D = u_hat.shape
    R = len(cs)
    uf = u_hat.view(B * J, I, D)
    left: list[torch.Tensor] = []  # d L / d u_hat = sum_k left_k (B, J, I) outer right_k (B, J, D)
    right: list[torch.Tensor] = []
    grad_b: torch.Tensor | None = None  # d L / d b^{r+1}, which flows back through b^{r+1} = b^r + a^r
    for r in reversed(range(R)):
        if r == R - 1:
            g_v = grad_v if grad_v is not None else torch.zeros_like(vs[r])
        else:  # v^r reaches the loss only through the agreement a^r = u_hat . v^r, whose gradient is grad_b
            assert grad_b is not None  # set by iteration r + 1, taken before this one
            g_v = torch.bmm(grad_b.view(B * J, 1, I), uf).view(B, J, D)
            left.append(grad_b)
            right.append(vs[r])
        g_s = _squash_backward(ss[r], g_v)
        g_c = torch.bmm(uf, g_s.view(B * J, D, 1)).view(B, J, I)  # from s = sum_i c_ij u_hat
        if r == R - 1 and grad_c is not None:
            g_c = g_c + grad_c
        left.append(cs[r])
        right.append(g_s)
        c = cs[r]
        g_b = c * (g_c - (c * g_c).sum(dim=1, keepdim=True))  # through the softmax over the parents
        grad_b = g_b if grad_b is None else g_b + grad_b
    K = len(left)
    grad = torch.bmm(torch.stack(left, -1).view(B * J, I, K), torch.stack(right, 2).view(B * J, K, D))
    return grad.view(B, J, I, D)


def _votes(u: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """u_hat_j|i = W_ij u_i (Eq. 2), laid out parent-major: u (B, N_in, K), W (N_in, N_out, D, K) ->
    (B, N_out, N_in, D). One bmm over the children on views of W, one copy into the layout."""
    I, J, D, K = W.shape
    u_hat = torch.bmm(u.transpose(0, 1), W.view(I, J * D, K).transpose(1, 2))  # (N_in, B, N_out * D)
    return u_hat.view(I, -1, J, D).permute(1, 2, 0, 3).contiguous()


def _routing_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The one dtype the fused routing computes in: float32, or float64 if an input is float64."""
    dtype = torch.float32
    for d in dtypes:
        dtype = torch.promote_types(dtype, d)
    return dtype


class _FusedDigitRouting(torch.autograd.Function):
    """Votes and Procedure 1 over chunks of the batch, the votes never stored (see fused_digit_routing)."""

    # Both passes run in fp32 (fp64 for fp64 inputs, as in gradcheck) whatever the autocast state they
    # run or are traced under: the inputs and the incoming gradients are cast explicitly to that one
    # dtype and autocast is off inside each. An eager backward runs outside the caller's autocast
    # region, but torch.compile traces this backward into its graph under the caller's bf16 autocast
    # (as does a backward called inside the region): there each bmm would come out in bf16, and the
    # in-place baddbmm_ into the fp32 grad_W would get mixed dtypes.

    @staticmethod
    def forward(ctx, u: torch.Tensor, W: torch.Tensor, iters: int, chunk: int):
        ctx.dtypes = u.dtype, W.dtype
        dtype = _routing_dtype(u.dtype, W.dtype)
        with torch.autocast(u.device.type, enabled=False):
            # contiguous: a no-op unless, say, W was made channels_last
            u, W = u.to(dtype).contiguous(), W.to(dtype).contiguous()
            parts = [_route(_votes(u[k : k + chunk], W), iters)[:3] for k in range(0, len(u), chunk)]
            cs, ss, vs = ([torch.cat([p[n][r] for p in parts]) for r in range(iters)] for n in range(3))
        ctx.save_for_backward(u, W, *cs, *ss, *vs)
        ctx.iters, ctx.chunk = iters, chunk
        return vs[-1], cs[-1].transpose(1, 2)  # in the routing dtype, as dynamic_routing on fp32 votes

    @staticmethod
    def backward(ctx, grad_v: torch.Tensor | None, grad_c: torch.Tensor | None):
        u, W, *saved = ctx.saved_tensors  # all in the routing dtype (see forward)
        R, n = ctx.iters, ctx.chunk
        cs, ss, vs = saved[:R], saved[R : 2 * R], saved[2 * R :]
        I, J, D, K = W.shape
        W_flat = W.view(I, J * D, K)
        with torch.autocast(u.device.type, enabled=False):
            grad_v = None if grad_v is None else grad_v.to(u.dtype)  # may arrive in bf16
            grad_c = None if grad_c is None else grad_c.to(u.dtype)
            grad_u, grad_W = torch.empty_like(u), torch.zeros_like(W)
            for k in range(0, len(u), n):
                part = slice(k, k + n)
                u_part = u[part].transpose(0, 1)  # (N_in, b, K)
                u_hat = _votes(u[part], W)  # recomputed: cheaper than storing (B, 10, 1152, 16)
                g = _route_backward(
                    u_hat,
                    [c[part] for c in cs],
                    [s[part] for s in ss],
                    [v[part] for v in vs],
                    None if grad_v is None else grad_v[part],
                    None if grad_c is None else grad_c[part].transpose(1, 2),
                )
                g = g.permute(2, 0, 1, 3).reshape(I, -1, J * D)  # (N_in, b, N_out * D), child-major like W
                grad_W.view(I, J * D, K).baddbmm_(g.transpose(1, 2), u_part)  # sum_b g u^T
                grad_u[part] = torch.bmm(g, W_flat).transpose(0, 1)  # W^T g
        u_dtype, W_dtype = ctx.dtypes  # each gradient in its input's dtype
        return grad_u.to(u_dtype), grad_W.to(W_dtype), None, None


def fused_digit_routing(
    u: torch.Tensor, W: torch.Tensor, iters: int = 3, chunk: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 2 and Procedure 1 in one: the votes u_hat_j|i = W_ij u_i, then dynamic routing, for training.

    The same results as dynamic_routing(einsum(W, u), iters), and the same gradients (checked in the
    tests), but the (B, N_in, N_out, D) votes are never stored: each chunk of the batch makes its
    votes, routes them and drops them; the backward remakes them and sums their gradient as one
    low-rank matmul (_route_backward). Plain autograd keeps five vote-sized tensors per batch and
    writes one per use in the backward; on a CPU, where this layer is bound by memory traffic, a
    chunk whose votes fit in cache runs it several times faster.

    Args:
        u: primary capsules (B, N_in, K).
        W: transformation matrices (N_in, N_out, D, K).
        iters: r of Procedure 1.
        chunk: images per chunk; None: 8 on a CPU (8 x 0.7 MB of votes), the whole batch on a GPU,
            whose bandwidth does not need it and whose kernel launches would.

    Returns:
        v (B, N_out, D) and the final couplings c (B, N_in, N_out), as dynamic_routing.
    """
    if iters < 1:
        raise ValueError(f"routing needs at least one iteration, got {iters}")
    chunk = chunk or (len(u) if u.is_cuda else CPU_CHUNK)
    return _FusedDigitRouting.apply(u, W, iters, chunk)


class RoutingIterations(NamedTuple):
    """What each of Procedure 1's R iterations did (digit_routing), for inspection; the contract's
    CAPSNET_ITERATION_OUTPUTS."""

    couplings: torch.Tensor  # (B, R, N_in, N_out): the c_ij = softmax_j(b_ij) (Eq. 3) iteration r used
    logit_changes: torch.Tensor  # (B, R): mean over i, j of |u_hat_j|i . v_j|, v_j after r iterations (Fig. A.1)


def digit_routing(
    u: torch.Tensor, W: torch.Tensor, iters: int = 3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RoutingIterations]:
    """Eq. 2 and Procedure 1 for inference and export: the votes and the routing of
    fused_digit_routing's forward (parent-major votes, every sum a batched matmul), keeping the votes
    and every iteration.

    The same values as dynamic_routing(einsum(W, u), iters). The formulation matters for export: each
    step becomes an ONNX MatMul, where einsum's equations become Einsum nodes that took 11.0 of the
    flagship's 20.9 ms per run at batch 1 in ONNX Runtime's CPU profiler on a 2-core Xeon (the MatMuls
    that replace them: about 1 ms).

    Returns:
        v (B, N_out, D), the final couplings c (B, N_in, N_out), the votes u_hat (B, N_in, N_out, D)
        (a transposed view of the parent-major votes) and the RoutingIterations: the couplings of
        iterations 1..R (c^1 = 1 / N_out, c^R = c) and per image the mean |delta b_ij| each adds, taken
        from the agreements the routing added (iterations 1..R-1) and one more agreement with the
        final v (what an R+1-th iteration would add).
    """
    if iters < 1:
        raise ValueError(f"routing needs at least one iteration, got {iters}")
    u_hat = _votes(u, W)  # (B, N_out, N_in, D)
    cs, _, vs, agreements = _route(u_hat, iters)
    agreements.append(_agreement(u_hat, vs[-1]))
    iterations = RoutingIterations(
        torch.stack(cs, 1).transpose(2, 3), torch.stack([a.abs().mean(dim=(1, 2)) for a in agreements], 1)
    )
    return vs[-1], cs[-1].transpose(1, 2), u_hat.transpose(1, 2), iterations


def routing_logit_changes(u_hat: torch.Tensor, iters: int = 10) -> torch.Tensor:
    """Appendix A, Fig. A.1: the mean |delta b_ij| that each iteration of Procedure 1 adds to the logits.

    Iteration k adds the agreement a_ij = u_hat_j|i . v_j, with v_j the output after k iterations;
    the mean is over examples, children and parents. Returns (iters,). The paper reports it falling
    about linearly in log scale after 500 epochs; our briefly trained networks' curve rises slowly
    (docs/results.md). digit_routing's RoutingIterations.logit_changes are the same means per image,
    from the routing's own agreements.
    """
    return torch.stack(
        [torch.einsum("bijd,bjd->bij", u_hat, dynamic_routing(u_hat, k)[0]).abs().mean() for k in range(1, iters + 1)]
    )


class DynamicRouting(nn.Module):
    """Procedure 1 behind the common interface; child activations are ignored (they are ||u_i||)."""

    def __init__(self, iters: int = 3):
        super().__init__()
        self.iters = iters

    def forward(self, u_hat: torch.Tensor, a_in: torch.Tensor | None = None):
        v, c = dynamic_routing(u_hat, self.iters)
        return v, capsule_length(v), c


# --- EM routing (matrix capsules) ----------------------------------------------------------------


def em_m_step(
    R: torch.Tensor,
    a_in: torch.Tensor,
    votes: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    inv_temp: float,
    var_floor: float = 1e-6,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """M-step for every parent j at once, Eqs. 21-27.

    R_ij <- R_ij a_i (Eq. 21); mu_j^h and (sigma_j^h)^2, the R-weighted mean and variance of the
    votes (Eq. 22); cost_j^h = (beta_u + log sigma_j^h) sum_i R_ij (Eq. 26);
    a_j = logistic(lambda (beta_a - sum_h cost_j^h)) (Eq. 27).

    Args:
        R: responsibilities (B, N_in, N_out), each row summing to 1 over the parents.
        a_in: child activations a_i (B, N_in) in [0, 1].
        votes: V_ij, the flattened 4x4 vote matrices (B, N_in, N_out, H) with H = 16.
        beta_u, beta_a: learned, one per parent (N_out,) or scalars.
        inv_temp: lambda, the inverse temperature of the logistic.
        var_floor: added to every variance so that identical votes give a finite log sigma.
        eps: keeps the weighted mean defined when no active child votes for a parent.

    Returns:
        mu (B, N_out, H), sigma_sq (B, N_out, H), a_out (B, N_out).
    """
    R = R * a_in.unsqueeze(-1)  # Eq. 21, (B, N_in, N_out)
    mass = R.sum(dim=1)  # sum_i R_ij, (B, N_out)
    weights = R / (mass.unsqueeze(1) + eps)  # (B, N_in, N_out), columns sum to ~1
    mu = torch.einsum("bij,bijh->bjh", weights, votes)  # Eq. 22, (B, N_out, H)
    sigma_sq = torch.einsum("bij,bijh->bjh", weights, (votes - mu.unsqueeze(1)) ** 2) + var_floor  # Eq. 22
    cost = (beta_u.unsqueeze(-1) + 0.5 * torch.log(sigma_sq)) * mass.unsqueeze(-1)  # Eq. 26, (B, N_out, H)
    cost = cost.sum(dim=-1)  # sum_h cost_j^h, (B, N_out)
    a_out = torch.sigmoid(inv_temp * (beta_a - cost))  # Eq. 27, (B, N_out)
    return mu, sigma_sq, a_out


def em_e_step(
    votes: torch.Tensor, mu: torch.Tensor, sigma_sq: torch.Tensor, a_out: torch.Tensor, tiny: float = 1e-30
) -> torch.Tensor:
    """E-step for every child i at once, Eqs. 28-29, in the log domain.

    ln p_j = -sum_h [(V_ij^h - mu_j^h)^2 / (2 (sigma_j^h)^2) + ln sigma_j^h + ln(2 pi) / 2] (Eq. 28),
    R_ij = a_j p_j / sum_k a_k p_k (Eq. 29) = softmax_j(ln a_j + ln p_j): the densities of 16-D
    Gaussians under- and overflow float32, their logs do not.

    Returns:
        R: (B, N_in, N_out), each row sums to 1 over the parents.
    """
    diff_sq = (votes - mu.unsqueeze(1)) ** 2  # (B, N_in, N_out, H)
    log_p = -0.5 * (diff_sq / sigma_sq.unsqueeze(1) + torch.log(2 * math.pi * sigma_sq).unsqueeze(1)).sum(-1)
    log_a = torch.log(a_out + tiny).unsqueeze(1)  # (B, 1, N_out); tiny: a_j may underflow to 0
    return torch.softmax(log_a + log_p, dim=2)  # Eq. 29, (B, N_in, N_out)


def em_routing(
    votes: torch.Tensor,
    a_in: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    iters: int = 3,
    inv_temp: float = 1e-3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """EM routing: R_ij = 1 / N_out (Eq. 20), then r times an M-step (Eqs. 21-27) and, between
    them, an E-step (Eqs. 28-29).

    Args:
        votes: V_ij = M_i W_ij flattened, (B, N_in, N_out, 16).
        a_in: child activations (B, N_in).
        beta_u, beta_a: learned cost offset and activation threshold, (N_out,).
        iters: r, the number of M-steps (the paper uses 3).
        inv_temp: lambda of Eq. 27, the same at every iteration.

    Returns:
        mu: parent poses (B, N_out, 16); a: parent activations (B, N_out) in [0, 1];
        R: the responsibilities used by the last M-step (B, N_in, N_out), rows summing to 1.

    As in dynamic routing, R starts afresh for every example and gradients flow through every
    iteration.
    """
    if iters < 1:
        raise ValueError(f"routing needs at least one iteration, got {iters}")
    B, N_in, N_out, _ = votes.shape
    R = votes.new_full((B, N_in, N_out), 1.0 / N_out)  # Eq. 20
    for t in range(iters):
        # NOTE the paper raises lambda by "a fixed schedule" it does not give (the tutorial: over
        # training). We keep it fixed and small at every iteration, as public implementations do: the
        # raw costs of Eq. 26 sum over 1,152 children and 16 pose entries, and lambda = 1e-3 puts them
        # in the logistic's working range. A trained model carries no training-time state and exports
        # as it was trained.
        mu, sigma_sq, a = em_m_step(R, a_in, votes, beta_u, beta_a, inv_temp)
        if t < iters - 1:
            R = em_e_step(votes, mu, sigma_sq, a)
    return mu, a, R


class EMRouting(nn.Module):
    """EM routing behind the common interface, with learned beta_u, beta_a per parent (Eqs. 26-27)."""

    def __init__(self, num_out: int = 10, iters: int = 3, inv_temp: float = 1e-3):
        super().__init__()
        self.iters, self.inv_temp = iters, inv_temp
        # The paper gives neither start: at 0 every parent starts alike, for the spread loss to separate.
        self.beta_u = nn.Parameter(torch.zeros(num_out))
        self.beta_a = nn.Parameter(torch.zeros(num_out))

    def forward(self, votes: torch.Tensor, a_in: torch.Tensor):
        return em_routing(votes, a_in, self.beta_u, self.beta_a, self.iters, self.inv_temp)


# --- QP-regularised routing ----------------------------------------------------------------------


def qp_routing(u_hat: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """s_j = sum_i b_ij u_hat_j|i = U^T b_j (Eq. 6) with the learned b (no softmax), v_j = squash(s_j).

    Args:
        u_hat: prediction vectors (B, N_in, N_out, D).
        b: routing coefficients (N_in, N_out), shared by every example; any sign, rows need not
            sum to 1 (the paper drops Assumption 1: a child may count against a parent).

    Returns:
        v (B, N_out, D) and b broadcast to (B, N_in, N_out).
    """
    s = torch.einsum("ij,bijd->bjd", b, u_hat)  # Eq. 6, (B, N_out, D)
    return squash(s), b.expand(u_hat.shape[0], -1, -1)


def qp_agreement(u_hat: torch.Tensor, b: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """sum_k delta_j,k U_k U_k^T b_j for every parent j: the data term of dJ/db_j (Eqs. 9, 12-15).

    delta_j,k = +1 if observation k is of class j, -1 otherwise (Eq. 5b). The rows of U_k are the
    u_hat_j|i of observation k, so U_k^T b_j = s_j,k (Eq. 6) and U_k s_j,k = (u_hat_j|i . s_j,k)_i:
    the term is the label-signed agreement of each child with each parent, summed over the batch.

    Args:
        u_hat: (B, N_in, N_out, D) prediction vectors, no gradient needed.
        b: (N_in, N_out) routing coefficients.
        targets: class indices (B,) or a multi-hot (B, N_out).

    Returns:
        (N_in, N_out), a sum over the batch (so a DDP all-reduce adds up the global batch).
    """
    T = targets if targets.dim() == 2 else F.one_hot(targets, u_hat.shape[2])
    delta = 2.0 * T.to(u_hat.dtype) - 1.0  # Eq. 5b, (B, N_out)
    s = torch.einsum("ij,bijd->bjd", b, u_hat)  # U_k^T b_j, (B, N_out, D)
    return torch.einsum("bj,bijd,bjd->ij", delta, u_hat, s)


def qp_update(
    b: torch.Tensor, agreement: torch.Tensor, lr: float, lam: float = 1e-3, penalty: str = "l2"
) -> torch.Tensor:
    """One gradient-ascent step on b, Eq. 13 (l2) or Eq. 15 (l1).

    l2: b_j <- b_j + 2 gamma sum_k (delta_j,k U_k U_k^T - lambda / p I) b_j     (Eq. 13)
    l1: b_j <- b_j + 2 gamma (sum_k delta_j,k U_k U_k^T b_j - lambda / 2 sign(b_j))

    Args:
        b: (N_in, N_out) current coefficients.
        agreement: qp_agreement(u_hat, b, targets), the batch sum.
        lr: gamma, the routing step size.
        lam: lambda of Eqs. 10 and 14 (the paper: "usually set small, e.g. 0.001").
        penalty: "l2" (Eq. 10) or "l1" (Eq. 14).
    """
    if penalty == "l2":
        return b + 2 * lr * (agreement - lam * b)  # Eq. 13
    if penalty == "l1":
        # NOTE our scan of Eq. 15 leaves the factor of the l1 term unclear; we take the exact
        # gradient of Eq. 14, 2 sum_k delta U U^T b - lambda sign(b), with sign(0) = 0 as the paper
        # defines d|x|/dx at 0.
        return b + 2 * lr * (agreement - 0.5 * lam * torch.sign(b))  # Eq. 15
    raise ValueError(f"penalty must be 'l2' or 'l1', got {penalty!r}")


class QPRouting(nn.Module):
    """QP-regularised routing: coefficients b (a buffer, not an optimiser parameter) used as in Eq. 6
    and learned by `ascend`, Algorithm 1's routing steps, between the weight updates.

    Inference is one weighted sum: no iterations, no softmax.
    """

    b: torch.Tensor  # (N_in, N_out), the buffer registered in __init__

    def __init__(self, num_in: int = 1152, num_out: int = 10, penalty: str = "l2", lam: float = 1e-3):
        super().__init__()
        if penalty not in ("l2", "l1"):
            raise ValueError(f"penalty must be 'l2' or 'l1', got {penalty!r}")
        self.penalty, self.lam = penalty, lam
        # NOTE the paper does not give b's start; 1 / N_out makes the first forward the same as one
        # iteration of dynamic routing (uniform couplings).
        self.register_buffer("b", torch.full((num_in, num_out), 1.0 / num_out))

    def forward(self, u_hat: torch.Tensor, a_in: torch.Tensor | None = None):
        v, c = qp_routing(u_hat, self.b)
        return v, capsule_length(v), c

    @torch.no_grad()
    def ascend(self, u_hat: torch.Tensor, targets: torch.Tensor, lr: float, reduce=None) -> None:
        """One routing step of Algorithm 1 (lines 7-9): b_j += gamma dJ/db_j, Eq. 13 or 15.

        Args:
            u_hat: the batch's prediction vectors (B, N_in, N_out, D).
            targets: its labels (B,) or multi-hot (B, N_out).
            lr: gamma.
            reduce: applied in place to the batch-summed data term before the step, e.g.
                torch.distributed.all_reduce so that every rank takes the global batch's step.
        """
        agreement = qp_agreement(u_hat.float(), self.b, targets)
        if reduce is not None:
            reduce(agreement)
        self.b.copy_(qp_update(self.b, agreement, lr, self.lam, self.penalty))
