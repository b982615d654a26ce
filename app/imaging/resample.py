"""Pillow's convolution resize of a float image, as two small matrix products.

Pillow resamples a mode "F" picture one row at a time in scalar C; the pipeline's pictures are small
(a digit's crop of tens of px; a garment's picture, at most 1024 px, into 28), so building the picture,
resizing and copying it back cost more than the arithmetic.
The same resize is out = V @ x @ H.T, where each row of V (H) holds the normalised filter weights
Pillow gives one output row (column): the filter is stretched by the scale when reducing (anti-aliased),
its support clipped to the picture; an axis whose size does not change is left as it is, as Pillow
leaves it. The weights depend only on the two sizes, so they are cached.
Results match Image.resize to float32 rounding (tests/app/test_app_imaging.py).
"""

from functools import lru_cache

import numpy as np


def bicubic(x: np.ndarray) -> np.ndarray:
    """Keys' cubic convolution with a = -0.5 (Pillow's BICUBIC), support 2."""
    a, x = -0.5, np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def lanczos(x: np.ndarray) -> np.ndarray:
    """The sinc truncated by a 3-lobed sinc (Pillow's LANCZOS), support 3."""
    return np.where((x >= -3) & (x < 3), np.sinc(x) * np.sinc(x / 3), 0.0)


FILTERS = {"bicubic": (bicubic, 2.0), "lanczos": (lanczos, 3.0)}


@lru_cache(maxsize=128)  # at most 14 MB: a garment's 1024 px into 28 is 115 kB
def weights(size_in: int, size_out: int, name: str) -> np.ndarray:
    """(size_out, size_in) float32: output pixel i is row i @ the input pixels, as Pillow weighs them."""
    if size_in == size_out:  # Pillow does not resample this axis (Lanczos' zeros are 4e-17 in floats)
        return np.eye(size_in, dtype=np.float32)
    kernel, support = FILTERS[name]
    scale = size_in / size_out
    stretch = max(scale, 1.0)  # reducing: the filter widens to cover every input pixel (anti-aliasing)
    centres = (np.arange(size_out) + 0.5) * scale
    first = np.maximum((centres - support * stretch + 0.5).astype(np.int64), 0)  # C's (int) truncation
    last = np.minimum((centres + support * stretch + 0.5).astype(np.int64), size_in)
    taps = np.arange(size_in)
    w = kernel((taps[None, :] - centres[:, None] + 0.5) / stretch)
    w = np.where((taps >= first[:, None]) & (taps < last[:, None]), w, 0.0)
    total = w.sum(axis=1, keepdims=True)
    return (w / np.where(total == 0, 1.0, total)).astype(np.float32)


def resize(x: np.ndarray, size: tuple[int, int], name: str) -> np.ndarray:
    """x (H, W) float32 -> (height, width) = size[::-1] (Pillow's (width, height) order) by `name`'s filter;
    an axis of the same size is not multiplied (its weights are the identity), and x of `size` is x itself."""
    width, height = size
    if height != x.shape[0]:
        x = weights(x.shape[0], height, name) @ x
    if width != x.shape[1]:
        x = x @ weights(x.shape[1], width, name).T
    return x
