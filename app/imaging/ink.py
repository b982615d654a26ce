"""Find the ink in a photo, scan or canvas: the paper under it and the parts of it that make the digit.

People send photos, scans and canvases, not MNIST, so the ink is found the way a photo needs (each
step is one function below; app/imaging/digit.py crops, normalises and centres what is found):
on a copy box-reduced to LOCATE_SIZE, find the paper under the ink: what most of the picture's frame
shows, either flat (the frame's most common level) or lit unevenly (a quadratic surface, robust to the
ink), whichever more of the frame lies on. A gradient spreads the frame over many levels; a broad,
blurry digit that fills its frame (a thumbnail, an old scan, a webcam crop) bends the surface towards
itself, off the frame, and is read on flat paper. Then measure the noise where no ink inflates it (the
finest detail, and the paper's side of the ink), tell dark ink from light ink, threshold the ink with
hysteresis (noise floor, then Otsu), label the connected parts and keep those that make the digit (the
heaviest and the parts near it; specks and far shapes are dropped).

An image with transparency (the demo's drawing pad sends strokes on a transparent canvas) has its ink in
the alpha channel: light ink on a black paper.
"""

import math
from typing import NamedTuple

import cv2
import numpy as np
from PIL import Image
from scipy import ndimage

from app.imaging.decode import ImageError, Picture, alpha_channel, pillow, size_of

LOCATE_SIZE = 128  # the paper, the ink and the digit's parts are found on a copy at most this side
INK_FLOOR = 0.15  # ink below this fraction of the strongest ink is background noise (JPEG ringing)
NOISE_FLOOR = 4.0  # ink must also stand this many noise deviations (sigma) off the paper
PAPER_BAND = 3.0  # a pixel within this many noise deviations (plus a grey level) of a paper model is paper
MIN_CONTRAST = 0.1  # an image whose ink never differs from the background by this much is blank
LOW_CONTRAST = 0.25  # below this the answer comes with a warning
NEAR_PART = 0.5  # a part this close to the digit (fraction of its longer side) belongs to it
MIN_PART = 0.02  # a part with less ink than this fraction of the heaviest is a speck
OTHER_SHAPE = 0.25  # a far part with this fraction of the digit's ink is a second shape: warned
NO_INK = "no ink stands out from the noise: the image looks like blank paper; send a digit"


class Paper(NamedTuple):
    """What lies under the ink: the paper's lighting, the noise on it and which way the ink goes."""

    surface: np.ndarray  # (6,) quadratic in (u, v), the picture's coordinates scaled to [-1, 1]
    sigma: float  # the noise's standard deviation on the paper (fit_paper)
    polarity: float  # +1: ink lighter than the paper, -1: darker


class Digit(NamedTuple):
    """The parts of the ink that make the digit, found on the reduced copy."""

    mask: np.ndarray  # (h, w) bool on the reduced copy: the kept parts
    box: tuple[int, int, int, int]  # (top, left, bottom, right) of the kept parts, reduced copy's px
    contrast: float  # the strongest ink's distance from the paper, in [0, 1]
    other_shapes: int  # far parts heavy enough to be a second shape (left out)


def source(image: Picture) -> tuple[Picture, bool]:
    """An 8-bit grey picture to find the ink in, and whether its ink is known to be light on black
    (the alpha channel of a transparent image). Its full size is kept: only the digit's box of it is
    ever read at more than LOCATE_SIZE."""
    if isinstance(image, np.ndarray):  # grey pixels: dark ink or light, as any grey picture's
        return image, False
    alpha = alpha_channel(image)
    if alpha is not None and alpha.getextrema()[0] < 255:  # type: ignore[operator]  # one band: (min, max)
        picture, light_ink = alpha, True
    elif image.mode.startswith("I"):  # 16-bit grey PNG ("I;16") or 32-bit integer
        grey = np.asarray(image.convert("I"), np.float32) / 257
        picture, light_ink = Image.fromarray(np.clip(np.round(grey), 0, 255).astype(np.uint8)), False
    else:
        picture, light_ink = (image if image.mode == "L" else image.convert("L")), False
    return picture, light_ink


def quadratic(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(..., 6) basis 1, u, v, u², uv, v² of a smooth lighting surface."""
    return np.stack([np.ones_like(u), u, v, u * u, u * v, v * v], axis=-1)


def axes(shape: tuple[int, int], box: tuple[float, float, float, float], size: tuple[int, int]) -> tuple:
    """u (columns) and v (rows) in [-1, 1] of the whole picture (`size` = (width, height)) at the
    centres of a `shape` grid of pixels that covers `box` = (left, top, right, bottom) of it."""
    left, top, right, bottom = box
    xs = left + (np.arange(shape[1], dtype=np.float32) + 0.5) * (right - left) / shape[1]
    ys = top + (np.arange(shape[0], dtype=np.float32) + 0.5) * (bottom - top) / shape[0]
    return 2 * xs / size[0] - 1, 2 * ys / size[1] - 1


def grid(shape: tuple[int, int], box: tuple[float, float, float, float], size: tuple[int, int]) -> tuple:
    """(u, v) of every pixel of the `shape` grid of axes()."""
    return np.meshgrid(*axes(shape, box, size))


def median(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """The (upper) median along an axis by one partial sort: np.median's bookkeeping costs more than
    the sort itself on the few thousand values here."""
    k = values.shape[axis] // 2
    return np.take(np.partition(values, k, axis=axis), k, axis=axis)


def robust_sigma(r: np.ndarray) -> float:
    """The standard deviation of Gaussian noise from the median absolute deviation (ink-proof).

    The (upper) median of |r| counts its zeros first and partially sorts the rest: a drawn or rendered
    picture's finest detail is mostly exact zeros, a tie numpy's partition is slow on where it runs
    x86-simd-sort's AVX-512 code on AMD Zen 4 (2,209 values, 153 of them not zero: 120 µs, 7 µs without the zeros).
    """
    deviations = np.abs(r).ravel()
    k = deviations.size // 2
    spread = deviations[deviations != 0]
    zeros = deviations.size - spread.size
    return 0.0 if zeros > k or not spread.size else 1.4826 * float(np.partition(spread, k - zeros)[k - zeros])


def noise_sigma(x: np.ndarray) -> float:
    """The noise's standard deviation from x's finest diagonal detail: the MAD of its 2x2 Haar HH
    coefficients / 0.6745 (Donoho & Johnstone 1994), which lighting, a broad or blurry stroke and
    straight edges hardly change."""
    h, w = x.shape
    b = x[: h - h % 2, : w - w % 2]
    return robust_sigma((b[0::2, 0::2] - b[0::2, 1::2] - b[1::2, 0::2] + b[1::2, 1::2]) / 2)


def peak(values: np.ndarray, sigma: float) -> float:
    """The most common grey level of values in [0, 1]: their 256-level histogram's peak, smoothed over the noise."""
    counts = np.bincount(np.round(values * 255).astype(np.int32), minlength=256).astype(np.float32)
    return float(np.argmax(ndimage.gaussian_filter1d(counts, max(0.5, 255 * sigma), mode="constant"))) / 255


def paper_sigma(a: np.ndarray) -> float:
    """The noise's standard deviation from the paper's side of an ink map (ink positive): sqrt(pi / 2)
    x the mean of |a| where a <= 0, a half-normal's. No ink lies on that side, so a digit that fills
    its frame does not inflate it; a mean, unlike a median, is not rounded to the 8-bit grey levels."""
    side = np.count_nonzero(a <= 0)
    return math.sqrt(math.pi / 2) * float(-np.minimum(a, 0.0).sum()) / side if side else 0.0


def frame(x: np.ndarray) -> np.ndarray:
    """The outermost pixels of x, each side in turn."""
    return np.concatenate([x[0], x[-1], x[:, 0], x[:, -1]])


def paper_surface(x: np.ndarray, noise: float) -> np.ndarray:
    """The paper's brightness under x as the 6 coefficients of a quadratic in x's (u, v) (grid()):
    what most of the picture's frame shows (ink crosses the frame but does not fill it).

    A frame that is one exact value (a canvas, a rendered PNG) is flat paper of that value. Otherwise
    the paper is flat (the mean of the pixels within PAPER_BAND noise deviations of the frame's most
    common level) or lit unevenly (fit_surface), whichever more of the frame lies within PAPER_BAND
    noise deviations of. A gradient or vignetting spreads the frame over many levels, so its surface
    wins; a broad, blurry stroke that fills its frame bends the surface towards itself, off the frame,
    and flat paper wins.
    """
    border = frame(x)
    if border.min() == border.max():  # drawn or rendered, not photographed: one exact paper value
        return np.array([border[0], 0, 0, 0, 0, 0], np.float32)
    band = PAPER_BAND * noise + 1 / 255
    level = float(x[np.abs(x - peak(border, noise)) <= band].mean())
    flat = np.array([level, 0, 0, 0, 0, 0], np.float32)
    on_flat = np.count_nonzero(np.abs(border - level) <= band)
    if on_flat == border.size:  # no surface can hold more of the frame
        return flat
    lit = fit_surface(x)
    h, w = x.shape
    on_lit = np.count_nonzero(np.abs(border - frame_basis(h, w) @ lit) <= band)
    return lit if on_lit > on_flat else flat


def frame_basis(h: int, w: int) -> np.ndarray:
    """quadratic() at the outermost pixels of an h x w picture, in frame()'s order."""
    u, v = axes((h, w), (0, 0, w, h), (w, h))
    rows, cols = np.ones(w, np.float32), np.ones(h, np.float32)  # frame(): top, bottom, left, right
    return quadratic(
        np.concatenate([u, u, u[0] * cols, u[-1] * cols]), np.concatenate([v[0] * rows, v[-1] * rows, v, v])
    )


def fit_paper(x: np.ndarray, light_ink: bool) -> tuple[Paper, np.ndarray]:
    """The paper's brightness (paper_surface), the noise on it and the ink's polarity; and the ink of x
    (its distance from the paper, towards the ink; negative: paper noise).

    Polarity: the ink is the side whose extreme lies further from the paper after a 3x3 mean (which a
    lone noisy pixel cannot win). The noise: the larger of two estimates that each miss some noise but
    that no ink inflates: the finest detail's (noise_sigma: blind to noise correlated over pixels, a
    JPEG's) and the paper's side of the ink's (paper_sigma: blind where paper at black or white clips it).
    """
    h, w = x.shape
    noise = noise_sigma(x)
    surface = paper_surface(x, noise)
    r = x - lighting(surface, x.shape, (0, 0, w, h), (w, h))
    polarity = 1.0 if light_ink or lighter(r) else -1.0
    ink = r if polarity > 0 else -r
    return Paper(surface, max(noise, paper_sigma(ink)), polarity), ink


def lighter(r: np.ndarray) -> bool:
    """Whether the ink of r (a picture minus its paper) is lighter than the paper: its lightest 3x3 mean
    lies at least as far from the paper as its darkest."""
    smooth = cv2.blur(r, (3, 3), borderType=cv2.BORDER_REFLECT)  # scipy's uniform_filter(r, 3), in SIMD
    return bool(smooth.max() >= -smooth.min())


def fit_surface(x: np.ndarray) -> np.ndarray:
    """The 6 coefficients (quadratic) of the paper's brightness: least squares on 16x16 block medians
    of x, 3 rounds that drop blocks more than 2.5 sigma off (ink)."""
    h, w = x.shape
    step = max(1, min(h, w, max(h, w) // 16))  # a strip thinner than a block is one row of blocks
    blocks = x[: h - h % step, : w - w % step].reshape(h // step, step, w // step, step).swapaxes(1, 2)
    medians = median(blocks.reshape(h // step, w // step, step * step)).ravel()
    u, v = grid((h // step, w // step), (0, 0, w - w % step, h - h % step), (w, h))
    basis = quadratic(u.ravel(), v.ravel())
    keep = np.ones(medians.size, bool)
    surface = np.zeros(6, np.float32)
    surface[0] = median(medians)
    for _ in range(3):
        residual = medians - basis @ surface
        keep = np.abs(residual) <= 2.5 * robust_sigma(residual[keep]) + 1e-3
        if keep.sum() >= 6:
            surface = np.linalg.lstsq(basis[keep], medians[keep], rcond=None)[0].astype(np.float32)
    return surface


def histogram(values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """np.histogram(values, bins) without its checks: its edges in the values' dtype, a value on an edge in
    the bin above it, the top edge in the last bin, a range of one value widened by 0.5 each way."""
    low, high = values.min(), values.max()
    if low == high:
        low, high = low - 0.5, high + 0.5
    dtype = np.result_type(low, high, values)
    edges = np.arange(bins + 1, dtype=dtype) * ((high - low) / dtype.type(bins)) + low  # np.linspace's arithmetic
    edges[-1] = high
    counts = np.bincount(np.minimum(np.searchsorted(edges, values, "right") - 1, bins - 1), minlength=bins)
    return counts, edges


def otsu(values: np.ndarray, bins: int = 64) -> float:
    """Otsu's threshold (1979): the cut of the histogram with the largest between-class variance."""
    counts, edges = histogram(values, bins)
    centres = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(counts)[:-1]
    w1 = values.size - w0
    mass = np.cumsum(counts * centres)  # its last: the sum of every value's centre
    m0 = mass[:-1] / np.maximum(w0, 1)
    m1 = (mass[-1] - mass[:-1]) / np.maximum(w1, 1)
    return float(edges[1:-1][np.argmax(w0 * w1 * (m0 - m1) ** 2)])


def lighting(surface: np.ndarray, shape: tuple[int, int], box: tuple, size: tuple[int, int]) -> np.ndarray | float:
    """The paper's brightness (a quadratic surface) on a `shape` grid covering `box` of a picture of
    `size` (grid()); flat paper is one number, and no grid is made for it."""
    if not surface[1:].any():
        return float(surface[0])
    u, v = axes(shape, box, size)
    c = surface
    # c0 + c1 u + c2 v + c3 u² + c4 uv + c5 v², by rows and columns (no (h, w, 6) basis)
    return (c[0] + c[2] * v + c[5] * v * v)[:, None] + (c[1] + c[4] * v)[:, None] * u + c[3] * u * u


def ink_map(x: np.ndarray, paper: Paper, box: tuple[float, float, float, float], size: tuple[int, int]) -> np.ndarray:
    """x minus the paper under it, signed so that ink is positive; x covers `box` of a picture of `size`."""
    r = x - lighting(paper.surface, x.shape, box, size)
    return r if paper.polarity > 0 else -r


def noise_floor(peak: float, sigma: float) -> float:
    """The ink level below which it is noise: NOISE_FLOOR sigma, and at least INK_FLOOR of the strongest ink."""
    return max(NOISE_FLOOR * sigma, INK_FLOOR * peak)


def gap(a: tuple, b: tuple) -> int:
    """Pixels between two (top, left, bottom, right) boxes (0 when they touch or overlap)."""
    return max(0, a[0] - b[2], b[0] - a[2], a[1] - b[3], b[1] - a[3])


def union(a: tuple, b: tuple) -> tuple:
    return min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])


def digit_parts(a: np.ndarray, floor: float) -> Digit:
    """The connected parts of the ink (8-connected, above the floor, with a core above Otsu's
    threshold of the ink: hysteresis) that make the digit: the heaviest, and every part with at least
    MIN_PART of its ink within NEAR_PART of the digit's longer side of the growing box."""
    inked = a > floor
    count, labels, stats, _ = cv2.connectedComponentsWithStats(inked.view(np.uint8), connectivity=8)
    n = count - 1  # label 0 is the background
    if n == 0:
        raise ImageError(NO_INK)
    peak = float(a.max())
    if n == 1:  # the one part holds the strongest ink, so it has a core: it is the digit, and nothing is left out
        left, top, width, height = stats[1, :4].tolist()
        return Digit(inked, (top, left, top + height, left + width), peak, 0)
    core = min(otsu(a[labels > 0]), peak)  # the strongest part always has a core
    strong = np.zeros(n + 1, bool)
    strong[labels[a >= core]] = True
    masses = np.where(strong, np.bincount(labels.ravel(), a.ravel(), n + 1), 0.0)[1:]
    strong = strong[1:]
    left, top, width, height = (stats[1:, i].tolist() for i in range(4))
    boxes = [(y, x, y + h, x + w) for x, y, w, h in zip(left, top, width, height, strict=True)]
    heaviest = masses.max()

    def first_pixel(i: int) -> tuple[int, int]:  # part i's first pixel in raster order (scipy's label order)
        return boxes[i][0], int(np.argmax(labels[boxes[i][0]] == i + 1))

    # heaviest first, parts of equal ink in raster order (OpenCV numbers them in another); specks never count
    order = sorted(
        (i for i in range(n) if masses[i] >= MIN_PART * heaviest), key=lambda i: (-masses[i], first_pixel(i))
    )
    kept, box = {order[0]}, boxes[order[0]]
    grown = True
    while grown:
        grown = False
        for i in order:
            near = gap(box, boxes[i]) <= NEAR_PART * max(box[2] - box[0], box[3] - box[1])
            if i not in kept and near:
                kept.add(i)
                box, grown = union(box, boxes[i]), True
    digit_mass = sum(masses[i] for i in kept)
    others = sum(1 for i in order if i not in kept and masses[i] >= OTHER_SHAPE * digit_mass)
    keep = np.zeros(n + 1, bool)
    keep[[i + 1 for i in kept]] = True
    mask = keep[labels]
    return Digit(mask, box, peak, others)


def locate(picture: Picture, light_ink: bool) -> tuple[Paper, Digit, int, np.ndarray]:
    """Paper, digit and the reduction factor, found on a copy box-reduced to LOCATE_SIZE, and the ink map
    of that copy (fit_paper's; at factor 1, of the picture's own pixels)."""
    factor = math.ceil(max(size_of(picture)) / LOCATE_SIZE)
    x = np.divide(np.asarray(pillow(picture).reduce(factor) if factor > 1 else picture), 255, dtype=np.float32)
    paper, ink = fit_paper(x, light_ink)
    a = np.maximum(ink, 0.0)
    peak = float(a.max())
    if peak < MIN_CONTRAST:
        blank = f"nothing differs from the paper by {MIN_CONTRAST:.0%} of the full range"
        if factor == 1:
            raise ImageError(f"no ink was found: the image is blank ({blank}); draw a digit")
        raise ImageError(  # a digit under about 1% of the picture's side fades into the copy's paper
            f"no ink was found: the image is blank ({blank}) when reduced to {LOCATE_SIZE} px a side; "
            "draw a digit, or crop the picture closer to a small one"
        )
    return paper, digit_parts(a, noise_floor(peak, paper.sigma)), factor, ink


def warnings_of(digit: Digit, what: str = "one digit") -> list[str]:
    """Sentences about an input the model may misread; `what` the model wants in one image."""
    notes = []
    if digit.contrast < LOW_CONTRAST:
        notes.append(
            f"very low contrast: the ink differs from the paper by {digit.contrast:.2f} of the full "
            "range; a darker pen or more light would help"
        )
    if digit.other_shapes:
        notes.append(f"{digit.other_shapes} other shape(s) beside the digit were left out; send {what} per image")
    return notes
