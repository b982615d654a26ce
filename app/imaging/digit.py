"""One digit in a picture -> the model's input, as LeCun's MNIST was made (the card's `digit`).

MNIST-style preprocessing follows how LeCun's MNIST was made (http://yann.lecun.com/exdb/mnist/):
the digit is cropped to its ink, fitted into a 20x20 box keeping its aspect ratio (anti-aliased),
and pasted into 28x28 so that its centre of mass sits at the centre. Our centre is pixel (14, 14),
the mean centre of mass of the MNIST test images (13.99, 14.01); like MNIST's the shift is whole
pixels. The model wants white ink (1.0) on black (0.0) (model/contract.py).

People send photos, scans and canvases, not MNIST, so before that (each step is one function below):
  1. locate: find the paper and the parts of the ink that make the digit (app/imaging/ink.py).
  2. normalise: crop the digit from the full picture (at most NORM_BOX px), measure its stroke width
     at NORM_BOX px (the distance transform on the medial axis) and, when it is outside MNIST's range
     (contract.STROKE_RANGE), erode or dilate it to MNIST's median, so a marker's loops stay open.
  3. fit and centre as LeCun did.
"""

import math
from functools import cache

import cv2
import numpy as np
from PIL import Image

from app.imaging import resample
from app.imaging.decode import ImageError, Picture, pillow, size_of
from app.imaging.ink import (
    LOW_CONTRAST,
    NO_INK,
    Digit,
    Paper,
    ink_map,
    locate,
    noise_floor,
    paper_sigma,
    source,
    warnings_of,
)
from app.imaging.prepared import Prepared
from model import contract

NORM_BOX = 4 * contract.INK_BOX  # 80: the digit's longer side (px) while its stroke is measured and set
MARGIN = 0.15  # room around the digit's box (fraction of its longer side) for the stroke to grow
# The widest disk a stroke is thinned with (px at NORM_BOX): a digit's stroke wider than 2 * 20 * (1 - 0.125)
# + 10 = 45 px, over half its box and 2.25 times MNIST's widest (20 px), is a blob (a dot, a filled shape),
# left as it is; this also bounds the erosion's cost, which grows with the disk's area
MAX_THINNING = NORM_BOX / 4
BLOB = (
    "the ink is a blob, its strokes wider than half of it (a dot, a filled shape, or a digit too small "
    "for its pen): draw it larger or with a finer pen"
)


def stroke_width(ink: np.ndarray) -> float:
    """The median width (px) of the strokes of an ink map: twice the distance transform of the ink
    mask (ink >= 0.5) on its medial axis (where the distance is a local maximum), the usual
    estimate (e.g. Blum's medial axis transform); 0 for no ink."""
    mask = ink >= 0.5
    inked = np.count_nonzero(mask)
    if inked == mask.size:  # no background to measure from (OpenCV would answer 1.8e19): one solid stroke
        return float(min(mask.shape))
    if not inked:
        return 0.0
    # transformed: the ink's box and the ring of pixels around it, where the picture has them. A background
    # pixel further out is further from every ink pixel than one of that ring, so the distances are the
    # same, on about half the pixels of a digit at NORM_BOX with its MARGIN (the exact transform is the
    # largest single cost of preparing a digit)
    top, bottom, left, right = ink_box(mask)
    mask = np.ascontiguousarray(mask[max(top - 1, 0) : bottom + 1, max(left - 1, 0) : right + 1])
    # each distance is the root of a whole number of px², which OpenCV's float32 distances square to within
    # 2e-4 px² at 37 px: rounded back to it, equal distances are equal (the local-maximum test below breaks
    # no tie by rounding), and the radii are the float64 roots of those whole numbers, scipy's
    d2 = cv2.distanceTransform(mask.view(np.uint8), cv2.DIST_L2, cv2.DIST_MASK_PRECISE)
    d2 = np.rint(np.square(d2, out=d2), out=d2)
    ridge = d2[mask & (d2 >= cv2.dilate(d2, square(3)))]  # the ink's 3x3 local maxima, never none: the farthest ink
    k = ridge.size // 2  # twice the median radius, by a partial sort of the squares (np.median costs more)
    if ridge.size % 2:
        return 2.0 * math.sqrt(np.partition(ridge, k)[k])
    middle = np.partition(ridge, (k - 1, k))
    return math.sqrt(middle[k - 1]) + math.sqrt(middle[k])


@cache
def square(side: int) -> np.ndarray:
    """A side x side square as a structuring element (uint8, OpenCV's)."""
    return np.ones((side, side), np.uint8)


def disk(radius: float) -> np.ndarray:
    """A disk of `radius` px as a structuring element (uint8, OpenCV's)."""
    r = math.ceil(radius)
    ys, xs = np.mgrid[-r : r + 1, -r : r + 1]
    return (ys * ys + xs * xs <= radius * radius).view(np.uint8)


def at_norm_box(ink: np.ndarray, side: float) -> np.ndarray:
    """A digit's ink whose longer side is `side` px rescaled so that it is NORM_BOX px (bicubic), its
    overshoot beyond [0, 1] kept: stroke_width's threshold does not see it, and normalise_stroke clips it
    off what it erodes or dilates."""
    scale = NORM_BOX / side
    size = (max(1, round(ink.shape[1] * scale)), max(1, round(ink.shape[0] * scale)))
    return resample.resize(ink, size, "bicubic")


def measured_stroke(ink: np.ndarray, side: float) -> tuple[np.ndarray, float]:
    """The digit (its longer side `side` px) at NORM_BOX px, and its stroke width there."""
    x = ink if side == NORM_BOX else at_norm_box(ink, side)
    return x, stroke_width(x)


def radius_to_median(width: float, share: float = 1.0) -> float:
    """The radius (px at NORM_BOX) of the disk that erodes or dilates strokes `width` px wide to MNIST's
    median: r solves (w -+ 2r) / (S -+ 2r) = median (normalise_stroke; `share` as there)."""
    target = contract.STROKE_MEDIAN * share
    return abs(width - target * NORM_BOX) / (2 * (1 - target))


def is_blob(width: float, share: float = 1.0) -> bool:
    """Whether strokes `width` px wide at NORM_BOX make a blob rather than a pen's strokes: a dot, a filled
    shape, a digit drawn small with a broad pen. Thinning them to MNIST's median would take a disk wider
    than MAX_THINNING (strokes over 45 of 80 px), so normalise_stroke leaves them as they are."""
    return width > NORM_BOX * contract.STROKE_RANGE[1] * share and radius_to_median(width, share) > MAX_THINNING


def normalise_stroke(
    ink: np.ndarray, side: float, share: float = 1.0, measured: tuple[np.ndarray, float] | None = None
) -> np.ndarray:
    """The digit (its longer side `side` px) with its strokes eroded (a marker) or dilated (a fine pen)
    by grey morphology with a disk to MNIST's median width, at NORM_BOX px, when they lie outside
    MNIST's range (contract.STROKE_RANGE); a digit within the range comes back as it was.

    The disk's radius is radius_to_median's: eroding or dilating also shrinks or grows the digit's box,
    which fit_and_centre scales back to its ink box; a blob (is_blob) is left as it is. `share`: one digit's
    box over the ink's (MNIST's 20 px over a pair's 23), since the widths are fractions of a digit.
    `measured`: measured_stroke(ink, side), when it is known already (a pair's five boxes share it).
    """
    x, width = measured or measured_stroke(ink, side)
    low, high = (NORM_BOX * f * share for f in contract.STROKE_RANGE)
    radius = radius_to_median(width, share)
    if width > high:
        if is_blob(width, share):
            return ink
        thinner = eroded(np.clip(x, 0.0, 1.0), radius)
        return thinner if thinner.any() else ink  # a solid shape no stroke is as wide as: left as it is
    if 0 < width < low:
        return dilated(np.clip(x, 0.0, 1.0), radius)
    return ink


def ink_box(x: np.ndarray) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) of the non-zero pixels of x (it has some), bottom and right excluded:
    OpenCV's bounding rectangle of a mask, one pass over it where numpy's any() takes one per axis."""
    left, top, width, height = cv2.boundingRect((x if x.dtype == bool else x != 0).view(np.uint8))
    return top, top + height, left, left + width


def eroded(x: np.ndarray, radius: float) -> np.ndarray:
    """cv2.erode(x, disk(radius)) of ink x >= 0, computed on the ink's box alone: the erosion is 0 where x
    is, and within the box a side that is not the picture's edge borders zeros, for which one row or column
    of them stands in. A box no wider than the disk between two such sides erodes to nothing. Its cost is
    bounded by the box's, not by the margin around it (a dot's, scaled up to measure its stroke, is most)."""
    out = np.zeros_like(x)
    if not x.any():
        return out
    top, bottom, left, right = ink_box(x)
    height, width = x.shape
    reach = int(radius)  # the disk's offsets along an axis
    walled = (top > 0 and bottom < height, left > 0 and right < width)  # zeros on both sides of each axis
    if (walled[0] and bottom - top <= 2 * reach) or (walled[1] and right - left <= 2 * reach):
        return out
    rows, cols = slice(max(top - 1, 0), min(bottom + 1, height)), slice(max(left - 1, 0), min(right + 1, width))
    out[rows, cols] = cv2.erode(x[rows, cols], disk(radius))
    return out


def dilated(x: np.ndarray, radius: float) -> np.ndarray:
    """cv2.dilate(x, disk(radius)) of ink x >= 0, computed on the ink's box grown by the disk's reach: beyond
    it the dilation is 0, and within it the pixels left out are zeros, which a maximum of x >= 0 ignores."""
    out = np.zeros_like(x)
    if not x.any():
        return out
    top, bottom, left, right = ink_box(x)
    reach = math.ceil(radius)
    rows = slice(max(top - reach, 0), min(bottom + reach, x.shape[0]))
    cols = slice(max(left - reach, 0), min(right + reach, x.shape[1]))
    out[rows, cols] = cv2.dilate(x[rows, cols], disk(radius))
    return out


def digit_ink(
    picture: Picture, paper: Paper, digit: Digit, factor: int, found: np.ndarray
) -> tuple[np.ndarray, float, float]:
    """The digit's ink cropped from the full picture, in [0, 1] (1 = its strongest strokes), only where
    the kept parts are (specks and other shapes are gone), the digit's longer side in its px, and the
    ink's contrast (Digit.contrast, measured again at the crop's scale when it is low: crop_contrast).
    `found`: the ink map locate found the digit in (ink.locate; at factor 1, of the picture's own pixels).

    A digit larger than NORM_BOX is box-reduced to NORM_BOX; a smaller one keeps its pixels, so that
    an MNIST-like image comes back as it was.
    """
    top, left, bottom, right = (side * factor for side in digit.box)
    side = max(bottom - top, right - left)
    pad = math.ceil(MARGIN * side) + factor
    width, height = size_of(picture)
    box = (max(0, left - pad), max(0, top - pad), min(width, right + pad), min(height, bottom + pad))
    scale = min(1.0, NORM_BOX / side)
    size = (max(1, round((box[2] - box[0]) * scale)), max(1, round((box[3] - box[1]) * scale)))
    if scale == 1 and factor == 1:  # found at full size, kept at it: a crop of each
        r = found[box[1] : box[3], box[0] : box[2]]
        gate = digit.mask[box[1] : box[3], box[0] : box[2]]
    else:
        x = np.divide(np.asarray(pillow(picture).resize(size, Image.Resampling.BOX, box=box)), 255, dtype=np.float32)
        r = ink_map(x, paper, box, (width, height))
        reduced_box = (box[0] / factor, box[1] / factor, box[2] / factor, box[3] / factor)  # on the reduced copy
        gate = np.asarray(Image.fromarray(digit.mask).resize(size, Image.Resampling.NEAREST, box=reduced_box))
    reach = 2 * math.ceil(scale * factor) + 1
    gate = cv2.dilate(gate.view(np.uint8), square(reach)).view(bool)
    paper_side = ~gate
    sigma = paper_sigma(r[paper_side]) if np.count_nonzero(paper_side) >= 64 else paper.sigma  # the noise here
    a = np.maximum(r, 0.0)
    strongest = cv2.minMaxLoc(a, gate.view(np.uint8))[1]  # within the gate
    if strongest == 0.0:
        raise ImageError(NO_INK)
    contrast = crop_contrast(a, gate, digit.contrast)
    floor = min(noise_floor(float(a.max()), sigma), strongest)  # the strongest ink stays
    a = np.where(gate & (a >= floor), a, 0.0)
    return np.divide(a, strongest, out=a), side * scale, contrast


def crop_contrast(a: np.ndarray, gate: np.ndarray, located: float) -> float:
    """The ink's contrast: `located`, the strongest ink of the copy reduced to LOCATE_SIZE, unless that is
    below LOW_CONTRAST; then the largest 3x3 mean of the crop's ink a within the gate (a lone noisy pixel
    cannot win it), if larger. A digit small in a large picture is thinner than a pixel of the reduced copy,
    which averages its black strokes with the paper around them into grey."""
    if located >= LOW_CONTRAST:
        return located
    return max(located, cv2.minMaxLoc(cv2.blur(a, (3, 3)), gate.view(np.uint8))[1])


def fit_and_centre(x: np.ndarray, box: int | None = contract.INK_BOX, size: int = contract.IMAGE_SIZE) -> np.ndarray:
    """Ink (H, W) -> (size, size): crop to the ink, fit into box x box keeping aspect (None: keep its
    scale), centre of mass at the centre (LeCun's MNIST: box 20, size 28, centre (14, 14))."""
    top, bottom, left, right = ink_box(x)
    x = x[top:bottom, left:right]
    scale = 1.0 if box is None else box / max(x.shape)
    height, width = (max(1, round(side * scale)) for side in x.shape)
    small = np.maximum(resample.resize(x, (width, height), "lanczos"), 0.0)
    small = small / small.max()  # LeCun's digits reach full intensity (and no more: 0 <= small <= its max)
    # its mass (m00) and first moments (m10: along x, m01: along y) in one pass; the shift is rounded at a
    # millionth of a pixel first, so that a symmetric digit's exact half is not tipped by the sums' rounding
    moments = cv2.moments(small)
    top = math.floor(round(size // 2 - moments["m01"] / moments["m00"] + 0.5, 6))
    left = math.floor(round(size // 2 - moments["m10"] / moments["m00"] + 0.5, 6))
    top, left = min(max(top, 0), size - height), min(max(left, 0), size - width)
    out = np.zeros((size, size), np.float32)
    out[top : top + height, left : left + width] = small
    return out


def digits(image: Picture, boxes: tuple[int, ...] | None, size: int, what: str) -> Prepared:
    """One digit (or an overlapping pair, `what`) found, cropped, its stroke set, fitted into each ink
    box of `boxes` and centred (candidates when there are several, the first as the image); boxes None:
    a picture already at the model's scale, its ink only found and centred."""
    picture, light_ink = source(image)
    paper, digit, factor, found = locate(picture, light_ink)
    ink, side, contrast = digit_ink(picture, paper, digit, factor, found)
    notes = warnings_of(digit._replace(contrast=contrast), what)
    if boxes is None:
        return Prepared(fit_and_centre(ink, None, size), notes)
    # share: one digit's box over the whole ink's, since MNIST's stroke widths are fractions of one digit
    measured = measured_stroke(ink, side)
    if is_blob(measured[1], contract.INK_BOX / boxes[0]):  # of the input answered, the first box's
        notes.append(BLOB)
    fitted = [fit_and_centre(normalise_stroke(ink, side, contract.INK_BOX / box, measured), box, size) for box in boxes]
    return Prepared(fitted[0], notes, np.stack(fitted) if len(boxes) > 1 else None)


def prepare(image: Picture, size: int, box: int) -> Prepared:
    """One digit found, its stroke set, fitted into a box x box ink box and centred in size x size."""
    return digits(image, (box,), size, "one digit")
