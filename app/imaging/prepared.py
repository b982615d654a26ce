"""What every preprocessing returns: the model's input and what was unusual on the way to it."""

from typing import NamedTuple

import numpy as np


class Prepared(NamedTuple):
    """The model input and what was unusual on the way to it."""

    image: np.ndarray  # (size, size) float32, white on black
    warnings: list[str]
    candidates: np.ndarray | None = None  # (k, size, size): inputs at k scales, `image` first; the one the
    #                                       model's answer redraws best is read (a pair drawn at any size)
