"""One object on a plain background -> the model's input (the card's `garment`), following how
Fashion-MNIST was made from product photos (github.com/zalandoresearch/fashion-mnist, "Get the data"):
trim the plain background, resize the longest edge to the frame, centre, negate, grey levels kept.
"""

import cv2
import numpy as np

from app.imaging import resample
from app.imaging.decode import ImageError, Picture, channels
from app.imaging.ink import LOW_CONTRAST, MIN_CONTRAST, MIN_PART, NOISE_FLOOR, median, robust_sigma
from app.imaging.prepared import Prepared

BORDER = 0.02  # the frame (fraction of the longer side) whose median is the background
TRIM = 0.05  # what differs from the background by less is trimmed (Fashion-MNIST's 5% distance)
MIN_SHARE = 0.25  # the heaviest part holds at least this share of what stands out, or nothing is one object
MIN_SIDE = 0.05  # an object whose longer side is under this fraction of the picture's is a speck


def on_white(image: Picture) -> np.ndarray:
    """Grey (H, W) in [0, 1] with transparent pixels on white, as a product cut-out is shown."""
    grey, alpha = channels(image)
    return grey if alpha is None else grey * alpha + (1.0 - alpha)


def prepare(image: Picture, size: int, box: int) -> Prepared:
    """One object on a plain background, as Fashion-MNIST made its images from product photos: the
    background (the median of the picture's frame) is trimmed, the object's longest edge resized to
    `box` (anti-aliased), the other edge extended to `size` around it, and the intensities negated so
    that the object is light on black; its grey levels are kept (a garment is not ink). A dark
    background is not negated. What differs from the background by under TRIM (or the frame's noise) is
    trimmed, and specks (parts with under MIN_PART of the heaviest's weight) are left out. A picture whose
    heaviest part holds under MIN_SHARE of what stands out (scattered specks, sparse noise), or whose object
    spans under MIN_SIDE of its longer side (a dot), shows no object to read: an ImageError says so."""
    x = on_white(image)
    h, w = x.shape
    m = max(1, round(BORDER * max(h, w)))
    frame = np.concatenate([x[:m].ravel(), x[-m:].ravel(), x[:, :m].ravel(), x[:, -m:].ravel()])
    paper = float(median(frame))
    a = (paper - x) / max(paper, 1e-6) if paper >= 0.5 else (x - paper) / max(1.0 - paper, 1e-6)
    a = np.clip(a, 0.0, 1.0)
    flat = ImageError(
        "nothing stands out from the background: the image is one flat colour (or noise); send a "
        "photo of one garment on a plain background"
    )
    if a.max() < MIN_CONTRAST:
        raise flat
    floor = max(TRIM, NOISE_FLOOR * robust_sigma(frame - paper))
    count, labels = cv2.connectedComponents((a > floor).view(np.uint8), connectivity=8)
    n = count - 1  # label 0 is the background
    if n == 0:  # all of it within the frame's noise of the background: noise, no object
        raise flat
    masses = np.bincount(labels.ravel(), a.ravel(), n + 1)[1:]
    if masses.max() < MIN_SHARE * masses.sum():
        raise ImageError(
            "no one object stands out: what differs from the background is scattered over the picture (noise "
            "or specks); send a photo of one garment on a plain background"
        )
    kept = np.flatnonzero(masses >= MIN_PART * masses.max()) + 1
    rows, cols = np.nonzero(np.isin(labels, kept))
    a = a[rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
    if max(a.shape) < MIN_SIDE * max(h, w):
        raise ImageError(
            f"the object that stands out spans {max(a.shape) / max(h, w):.1%} of the picture's longer side, too "
            "little to be read as a garment; crop the picture to the garment"
        )
    scale = box / max(a.shape)
    height, width = (min(box, max(1, round(side * scale))) for side in a.shape)
    small = np.clip(resample.resize(a, (width, height), "lanczos"), 0.0, 1.0)
    out = np.zeros((size, size), np.float32)
    top, left = (
        (size - height + 1) // 2,
        (size - width + 1) // 2,
    )  # an odd margin's extra pixel before, as Fashion-MNIST's
    out[top : top + height, left : left + width] = small
    notes = (
        []
        if a.max() >= LOW_CONTRAST
        else [f"very low contrast: the object differs from the background by {a.max():.2f} of the full range"]
    )
    return Prepared(out, notes)
