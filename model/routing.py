"""Routing between capsule layers.

Paper: `Dynamic Routing Between Capsules` - Sabour, Frosst & Hinton, NIPS 2017
    https://arxiv.org/abs/1710.09829

Plain functions over tensors (no modules, no parameters) so that each can be tested on hand-made
votes. The loop runs over routing iterations only; every capsule is handled at once.
"""
import torch


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
