"""Dynamic routing's coupling coefficients read for the answer: where each class's evidence came from on
the primary grid, and how far each iteration of Procedure 1 moved the couplings.

Paper: `Dynamic Routing Between Capsules` - Sabour, Frosst & Hinton, NIPS 2017
    https://arxiv.org/abs/1710.09829
"""

import numpy as np


def routing_maps(routing: np.ndarray, vote_lengths: np.ndarray, types: int, grid: int) -> np.ndarray:
    """Per-class grid x grid maps of where the routing sent each class's evidence from.

    map_j(row, col) = Σ over the primary types t of c_ij · ||u_hat_j|i||, i = t*grid² + row*grid + col
    (contract's capsule index), with c_ij the coupling coefficients of Procedure 1 (Eq. 3) and u_hat
    the prediction vectors of Eq. 2.

    Args:
        routing: c_ij, (types * grid², classes): (1152, 10) for MNIST's 32 types on a 6x6 grid.
        vote_lengths: ||u_hat_j|i||, the same shape.
        types, grid: the card's primary capsules (types on a grid x grid grid).
    Returns:
        (classes, grid, grid) float32.
    """
    maps = (routing * vote_lengths).reshape(types, grid, grid, -1).sum(axis=0)  # (grid, grid, classes)
    return np.ascontiguousarray(maps.transpose(2, 0, 1), dtype=np.float32)


def iteration_maps(couplings: np.ndarray, vote_lengths: np.ndarray, types: int, grid: int) -> np.ndarray:
    """routing_maps of every iteration's couplings (R, primary, classes): (R, classes, grid, grid)."""
    return np.stack([routing_maps(c, vote_lengths, types, grid) for c in couplings])


def coupling_changes(couplings: np.ndarray) -> np.ndarray:
    """How far each iteration of Procedure 1 moved the couplings: mean over i, j of |c_ij^r - c_ij^(r-1)|,
    0 for r = 1 (which has no predecessor).

    Args:
        couplings: c_ij of every iteration (R, primary, classes), a routing_iterations row.
    Returns:
        (R,) float32.
    """
    steps = np.abs(np.diff(couplings, axis=0)).mean(axis=(1, 2))
    return np.concatenate([np.zeros(1, np.float32), steps.astype(np.float32)])
