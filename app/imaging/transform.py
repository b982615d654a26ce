"""Transform a prepared model input along a sweep: what POST /explain feeds the model to show equivariance.

The paper's claim (section 2; section 5.1 and Fig. 4) is that a capsule's length says whether its entity
is present and its direction says how: pose, thickness, skew, width. Turning, scaling, shearing, moving or
thickening the model's own input one step at a time, as one batch, shows which of the winning capsule's 16
numbers follow the change smoothly (equivariance) while its length holds (invariance of the answer), and
where the answer breaks.

The geometric transforms turn about the ink's centre of mass (where digit.py centres it, so for a
prepared digit about the middle of the frame) and resample bilinearly with black outside; thickness
grows (or thins) every stroke with grey-level dilation (erosion) by a disc, blending the two nearest
whole radii for a fractional one so that the sweep moves smoothly.
"""

import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import numpy as np
from scipy import ndimage


class Transform(NamedTuple):
    """One family of input changes: its parameter's unit, its identity, the widest value it takes and the
    sweep a person would try first."""

    unit: str
    identity: float
    limits: tuple[float, float]
    default: tuple[float, float]  # start, stop
    describe: str


TransformName = Literal["rotate", "scale", "shear", "shift_x", "shift_y", "thickness"]  # TRANSFORMS' keys
TRANSFORMS: dict[TransformName, Transform] = {
    "rotate": Transform("degrees", 0.0, (-180.0, 180.0), (-45.0, 45.0), "turn anticlockwise about the ink's centre"),
    "scale": Transform("factor", 1.0, (0.25, 4.0), (0.7, 1.3), "grow (> 1) or shrink about the ink's centre"),
    "shear": Transform("degrees", 0.0, (-60.0, 60.0), (-30.0, 30.0), "slant: rows move right above the centre"),
    "shift_x": Transform("px", 0.0, (-14.0, 14.0), (-4.0, 4.0), "move right (> 0) or left"),
    "shift_y": Transform("px", 0.0, (-14.0, 14.0), (-4.0, 4.0), "move down (> 0) or up"),
    "thickness": Transform("px", 0.0, (-3.0, 3.0), (-1.0, 2.0), "thicken (> 0) or thin every stroke by a disc"),
}


def centre_of_mass(image: np.ndarray) -> np.ndarray:
    """(row, col) of the ink's mass; the frame's centre for an image without ink."""
    total = float(image.sum())
    if total <= 0:
        return (np.array(image.shape, np.float64) - 1) / 2
    rows, cols = np.indices(image.shape)
    return np.array([(rows * image).sum() / total, (cols * image).sum() / total])


def linear_map(name: str, value: float) -> np.ndarray:
    """The 2x2 matrix taking a point's (row, col) offset from the centre in the output back to the input
    (scipy's affine_transform pulls each output pixel from the input); shifts are the identity here."""
    if name == "rotate":
        t = math.radians(value)  # anticlockwise on screen (rows grow downwards)
        return np.array([[math.cos(t), math.sin(t)], [-math.sin(t), math.cos(t)]])
    if name == "scale":
        return np.eye(2) / value
    if name == "shear":  # an output row r above the centre (r < 0) comes from col + tan(t) * r
        return np.array([[1.0, 0.0], [math.tan(math.radians(value)), 1.0]])
    return np.eye(2)


def shift(name: str, value: float) -> np.ndarray:
    """How far the output moves, (rows, cols)."""
    return np.array([value if name == "shift_y" else 0.0, value if name == "shift_x" else 0.0])


def disc(radius: int) -> np.ndarray:
    """A disc of whole radius as a morphological footprint (radius 0: one pixel)."""
    rows, cols = np.mgrid[-radius : radius + 1, -radius : radius + 1]
    return rows**2 + cols**2 <= radius**2


def thicken(image: np.ndarray, pixels: float) -> np.ndarray:
    """Grey-level dilation (pixels > 0) or erosion (< 0) by a disc of radius |pixels|, blending the discs
    of the two nearest whole radii so the stroke grows smoothly."""
    morph: Callable = ndimage.grey_dilation if pixels > 0 else ndimage.grey_erosion
    radius = abs(pixels)
    low, frac = int(radius), radius - int(radius)
    below = image if low == 0 else morph(image, footprint=disc(low), mode="constant", cval=0.0)
    if frac == 0:
        return below
    above = morph(image, footprint=disc(low + 1), mode="constant", cval=0.0)
    return (1 - frac) * below + frac * above


def apply(image: np.ndarray, name: str, value: float, centre: np.ndarray | None = None) -> np.ndarray:
    """One transform of a (size, size) float32 input in [0, 1] by value (TRANSFORMS[name].unit), about
    `centre` (row, col; the ink's centre of mass when not given)."""
    if name == "thickness":
        out = thicken(image, value)
    else:
        centre = centre_of_mass(image) if centre is None else centre
        matrix = linear_map(name, value)
        # output pixel p pulls input pixel matrix @ (p - centre - shift) + centre
        offset = centre - matrix @ (centre + shift(name, value))
        out = ndimage.affine_transform(image, matrix, offset, order=1, mode="constant", cval=0.0)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def sweep(image: np.ndarray, name: TransformName, values: np.ndarray) -> np.ndarray:
    """The input under each value of one transform: (len(values), size, size) float32, one batch."""
    if name not in TRANSFORMS:
        raise ValueError(f"no transform is named {name!r}; choose from {', '.join(TRANSFORMS)}")
    centre = centre_of_mass(image)  # once: every step turns about the same point
    return np.stack([apply(image, name, float(v), centre) for v in values])
