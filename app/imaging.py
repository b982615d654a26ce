"""Decode untrusted image bytes safely and turn them into what the model expects.

MNIST-style preprocessing follows how LeCun's MNIST was made (http://yann.lecun.com/exdb/mnist/):
the digit is cropped to its ink, fitted into a 20x20 box keeping its aspect ratio (anti-aliased),
and pasted into 28x28 so that its centre of mass sits at the centre. Our centre is pixel (14, 14),
the mean centre of mass of the MNIST test images (13.99, 14.01); like MNIST's the shift is whole
pixels. The model wants white ink (1.0) on black (0.0) (model/contract.py).

People send photos, scans and canvases, not MNIST, so before that the ink is found the way a photo
needs (each step is one function below):
  1. locate: on a copy box-reduced to LOCATE_SIZE, find the paper under the ink: what most of the
     picture's frame shows, either flat (the frame's most common level) or lit unevenly (a quadratic
     surface, robust to the ink), whichever more of the frame lies on. A gradient spreads the frame
     over many levels; a broad, blurry digit that fills its frame (a thumbnail, an old scan, a webcam
     crop) bends the surface towards itself, off the frame, and is read on flat paper. Then measure
     the noise where no ink inflates it (the finest detail, and the paper's side of the ink), tell
     dark ink from light ink, threshold the ink with hysteresis (noise floor, then Otsu), label the
     connected parts and keep those that make the digit (the heaviest and the parts near it; specks
     and far shapes are dropped).
  2. normalise: crop the digit from the full picture (at most NORM_BOX px), measure its stroke width
     at NORM_BOX px (the distance transform on the medial axis) and, when it is outside MNIST's range
     (contract.STROKE_RANGE), erode or dilate it to MNIST's median, so a marker's loops stay open.
  3. fit and centre as LeCun did.
An image with transparency (the demo's drawing pad sends strokes on a transparent canvas) has its ink in
the alpha channel: light ink on a black paper.

A model's card names its preprocessing (model/contract.py's PREPROCESSING, app/spec.py): `digit` is the
above; `digit-pair` is the same for two overlapping digits (MultiMNIST, section 6 of the paper), whose
union is fitted into the training pairs' median ink box and four boxes around it (candidates, of which
the model reads the one it redraws best); `garment` follows how Fashion-MNIST was made from product
photos (github.com/zalandoresearch/fashion-mnist, "Get the data"): trim the plain background, resize
the longest edge to the frame, centre, negate, grey levels kept.
"""
import base64
import binascii
import io
import math
import re
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError
from scipy import ndimage

from model import contract

FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP")
WORK_SIZE = 1024  # large images are box-reduced to at most this side before the float maths
LOCATE_SIZE = 128  # the paper, the ink and the digit's parts are found on a copy at most this side
NORM_BOX = 4 * contract.INK_BOX  # 80: the digit's longer side (px) while its stroke is measured and set
INK_FLOOR = 0.15  # ink below this fraction of the strongest ink is background noise (JPEG ringing)
NOISE_FLOOR = 4.0  # ink must also stand this many noise deviations (sigma) off the paper
PAPER_BAND = 3.0  # a pixel within this many noise deviations (plus a grey level) of a paper model is paper
MIN_CONTRAST = 0.1  # an image whose ink never differs from the background by this much is blank
LOW_CONTRAST = 0.25  # below this the answer comes with a warning
NEAR_PART = 0.5  # a part this close to the digit (fraction of its longer side) belongs to it
MIN_PART = 0.02  # a part with less ink than this fraction of the heaviest is a speck
OTHER_SHAPE = 0.25  # a far part with this fraction of the digit's ink is a second shape: warned
MARGIN = 0.15  # room around the digit's box (fraction of its longer side) for the stroke to grow
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R 601, what Pillow's convert("L") uses
BORDER = 0.02  # garment: the frame (fraction of the longer side) whose median is the background
TRIM = 0.05  # garment: what differs from the background by less is trimmed (Fashion-MNIST's 5% distance)
DATA_URL = re.compile(r"data:[^,]*?;base64,", re.IGNORECASE)
NO_INK = "no ink stands out from the noise: the image looks like blank paper; send a digit"


class ImageError(ValueError):
    """An image the service cannot use, with the 4xx status to answer and a sentence saying why."""

    def __init__(self, detail: str, status_code: int = 422):
        super().__init__(detail)
        self.detail, self.status_code = detail, status_code


def from_base64(text: str) -> bytes:
    """Base64 or a base64 data URL ("data:image/png;base64,...") -> bytes; whitespace is ignored."""
    text = text.strip()
    if match := DATA_URL.match(text):
        text = text[match.end():]
    elif text.startswith("data:"):
        raise ImageError("`image` is a data URL without ;base64, send data:image/png;base64,<...>")
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("`image` is not valid base64 (A-Z, a-z, 0-9, +, / and = padding)") from None


@contextmanager
def _decoder_errors():
    """Whatever a malformed file makes Pillow raise becomes an ImageError (the file's fault, a 4xx)."""
    try:
        yield
    except ImageError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageError(f"the image is a decompression bomb ({exc})", 413) from None
    except UnidentifiedImageError:
        raise ImageError("the file is not a readable PNG, JPEG, BMP, GIF or WebP image") from None
    except Exception as exc:
        raise ImageError(f"the image could not be decoded, it may be truncated or corrupt ({exc})") from None


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Bytes -> a Pillow image whose header is read and checked; no pixel is decoded yet.

    The pixel limit is checked here, from the header; Pillow's own decompression-bomb guard
    (Image.open) is the second line.
    """
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    with _decoder_errors():
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    width, height = image.size
    if width * height > max_pixels:
        raise ImageError(f"the image has {width}x{height} = {width * height:,} pixels; the limit is {max_pixels:,}",
                         413)
    return image


def load(image: Image.Image) -> Image.Image:
    """Decode the pixels of an opened image (the first frame of an animation), upright per its EXIF."""
    with _decoder_errors():
        # JPEG: decode at a reduced scale when large, and colour photos as grey (their Y channel, the
        # luma both preprocessings read) without the chroma work
        image.draft("L" if image.mode == "RGB" else image.mode, (WORK_SIZE, WORK_SIZE))
        image.load()
        return ImageOps.exif_transpose(image)


def decode(data: bytes, max_pixels: int) -> Image.Image:
    """Bytes -> a loaded, upright Pillow image; every failure is an ImageError."""
    return load(open_image(data, max_pixels))


def has_transparency(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info


def channels(image: Image.Image) -> tuple[np.ndarray, np.ndarray | None]:
    """Grey (H, W) and alpha (H, W) or None when fully opaque, float32 in [0, 1].

    Grey, RGB, palette, 1-bit, CMYK and 16-bit grey are all read; images larger than WORK_SIZE are
    box-reduced first.
    """
    if image.mode.startswith("I"):  # 16-bit grey PNG ("I;16") or 32-bit integer
        image, scale = image.convert("I"), 65535.0
    elif has_transparency(image):
        image, scale = image.convert("RGBA"), 255.0
    else:
        image, scale = image.convert("L"), 255.0
    factor = math.ceil(max(image.size) / WORK_SIZE)
    if factor > 1:
        image = image.reduce(factor)
    x = np.clip(np.asarray(image, dtype=np.float32) / scale, 0.0, 1.0)
    if x.ndim == 2:
        return x, None
    alpha = x[..., 3]
    return x[..., :3] @ LUMA, (alpha if alpha.min() < 1.0 else None)


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


class Prepared(NamedTuple):
    """The model input and what was unusual on the way to it."""
    image: np.ndarray  # (size, size) float32, white on black
    warnings: list[str]
    candidates: np.ndarray | None = None  # (k, size, size): inputs at k scales, `image` first; the one the
    #                                       model's answer redraws best is read (a pair drawn at any size)


def source(image: Image.Image) -> tuple[Image.Image, bool]:
    """An 8-bit grey picture to find the ink in, and whether its ink is known to be light on black
    (the alpha channel of a transparent image). Its full size is kept: only the digit's box of it is
    ever read at more than LOCATE_SIZE."""
    if has_transparency(image) and (alpha := image.convert("RGBA").getchannel("A")).getextrema()[0] < 255:
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


def grid(shape: tuple[int, int], box: tuple[float, float, float, float], size: tuple[int, int]) -> tuple:
    """(u, v) in [-1, 1] of the whole picture (`size` = (width, height)) at the centres of a
    `shape` grid of pixels that covers `box` = (left, top, right, bottom) of it."""
    left, top, right, bottom = box
    xs = left + (np.arange(shape[1], dtype=np.float32) + 0.5) * (right - left) / shape[1]
    ys = top + (np.arange(shape[0], dtype=np.float32) + 0.5) * (bottom - top) / shape[0]
    return np.meshgrid(2 * xs / size[0] - 1, 2 * ys / size[1] - 1)


def median(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """The (upper) median along an axis by one partial sort: np.median's bookkeeping costs more than
    the sort itself on the few thousand values here."""
    k = values.shape[axis] // 2
    return np.take(np.partition(values, k, axis=axis), k, axis=axis)


def robust_sigma(r: np.ndarray) -> float:
    """The standard deviation of Gaussian noise from the median absolute deviation (ink-proof)."""
    return 1.4826 * float(median(np.abs(r).ravel())) if r.size else 0.0


def noise_sigma(x: np.ndarray) -> float:
    """The noise's standard deviation from x's finest diagonal detail: the MAD of its 2x2 Haar HH
    coefficients / 0.6745 (Donoho & Johnstone 1994), which lighting, a broad or blurry stroke and
    straight edges hardly change."""
    h, w = x.shape
    b = x[:h - h % 2, :w - w % 2]
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


def paper_surface(x: np.ndarray, basis: np.ndarray, noise: float) -> np.ndarray:
    """The paper's brightness under x as the 6 coefficients of a quadratic (basis: quadratic() of x's
    pixels): what most of the picture's frame shows (ink crosses the frame but does not fill it).

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
    return lit if np.count_nonzero(np.abs(border - frame(basis) @ lit) <= band) > on_flat else flat


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
    basis = quadratic(*grid(x.shape, (0, 0, w, h), (w, h)))
    surface = paper_surface(x, basis, noise)
    r = x - basis @ surface
    smooth = ndimage.uniform_filter(r, 3)
    polarity = 1.0 if light_ink or smooth.max() >= -smooth.min() else -1.0
    return Paper(surface, max(noise, paper_sigma(polarity * r)), polarity), polarity * r


def fit_surface(x: np.ndarray) -> np.ndarray:
    """The 6 coefficients (quadratic) of the paper's brightness: least squares on 16x16 block medians
    of x, 3 rounds that drop blocks more than 2.5 sigma off (ink)."""
    h, w = x.shape
    step = max(1, min(h, w, max(h, w) // 16))  # a strip thinner than a block is one row of blocks
    blocks = x[:h - h % step, :w - w % step].reshape(h // step, step, w // step, step).swapaxes(1, 2)
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


def otsu(values: np.ndarray, bins: int = 64) -> float:
    """Otsu's threshold (1979): the cut of the histogram with the largest between-class variance."""
    counts, edges = np.histogram(values, bins)
    centres = (edges[:-1] + edges[1:]) / 2
    w0 = np.cumsum(counts)[:-1]
    w1 = values.size - w0
    m0 = np.cumsum(counts * centres)[:-1] / np.maximum(w0, 1)
    m1 = (np.sum(counts * centres) - np.cumsum(counts * centres)[:-1]) / np.maximum(w1, 1)
    return float(edges[1:-1][np.argmax(w0 * w1 * (m0 - m1) ** 2)])


def ink_map(x: np.ndarray, paper: Paper, box: tuple[float, float, float, float],
            size: tuple[int, int]) -> np.ndarray:
    """x minus the paper under it, signed so that ink is positive; x covers `box` of a picture of `size`."""
    return paper.polarity * (x - quadratic(*grid(x.shape, box, size)) @ paper.surface)


def noise_floor(a: np.ndarray, sigma: float) -> float:
    """The ink level below which it is noise: NOISE_FLOOR sigma, and at least INK_FLOOR of the peak."""
    return max(NOISE_FLOOR * sigma, INK_FLOOR * float(a.max()))


def gap(a: tuple, b: tuple) -> int:
    """Pixels between two (top, left, bottom, right) boxes (0 when they touch or overlap)."""
    return max(0, a[0] - b[2], b[0] - a[2], a[1] - b[3], b[1] - a[3])


def union(a: tuple, b: tuple) -> tuple:
    return min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])


def digit_parts(a: np.ndarray, floor: float) -> Digit:
    """The connected parts of the ink (8-connected, above the floor, with a core above Otsu's
    threshold of the ink: hysteresis) that make the digit: the heaviest, and every part with at least
    MIN_PART of its ink within NEAR_PART of the digit's longer side of the growing box."""
    labels, n = ndimage.label(a > floor, np.ones((3, 3), bool))
    if n == 0:
        raise ImageError(NO_INK)
    core = min(otsu(a[labels > 0]), float(a.max()))  # the strongest part always has a core
    strong = np.zeros(n + 1, bool)
    strong[labels[a >= core]] = True
    masses = np.where(strong, np.bincount(labels.ravel(), a.ravel(), n + 1), 0.0)[1:]
    strong = strong[1:]
    boxes = [(s[0].start, s[1].start, s[0].stop, s[1].stop) for s in ndimage.find_objects(labels)]
    heaviest = masses.max()
    order = [int(i) for i in np.argsort(-masses) if masses[i] >= MIN_PART * heaviest]  # specks never count
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
    mask = np.isin(labels, [i + 1 for i in kept])
    return Digit(mask, box, float(a.max()), others)


def locate(picture: Image.Image, light_ink: bool) -> tuple[Paper, Digit, int]:
    """Paper, digit and the reduction factor, found on a copy box-reduced to LOCATE_SIZE."""
    factor = math.ceil(max(picture.size) / LOCATE_SIZE)
    x = np.asarray(picture.reduce(factor) if factor > 1 else picture, np.float32) / 255
    paper, ink = fit_paper(x, light_ink)
    a = np.clip(ink, 0.0, None)
    if a.max() < MIN_CONTRAST:
        raise ImageError("no ink was found: the image is blank (one flat colour); draw a digit")
    return paper, digit_parts(a, noise_floor(a, paper.sigma)), factor


def stroke_width(ink: np.ndarray) -> float:
    """The median width (px) of the strokes of an ink map: twice the distance transform of the ink
    mask (ink >= 0.5) on its medial axis (where the distance is a local maximum), the usual
    estimate (e.g. Blum's medial axis transform); 0 for no ink."""
    distance = ndimage.distance_transform_edt(ink >= 0.5)
    axis = (distance > 0) & (distance >= ndimage.maximum_filter(distance, size=3))
    return 2.0 * float(np.median(distance[axis])) if axis.any() else 0.0


def disk(radius: float) -> np.ndarray:
    r = math.ceil(radius)
    ys, xs = np.mgrid[-r:r + 1, -r:r + 1]
    return ys * ys + xs * xs <= radius * radius


def at_norm_box(ink: np.ndarray, side: float) -> np.ndarray:
    """A digit's ink whose longer side is `side` px rescaled so that it is NORM_BOX px (bicubic)."""
    scale = NORM_BOX / side
    size = (max(1, round(ink.shape[1] * scale)), max(1, round(ink.shape[0] * scale)))
    return np.clip(np.asarray(Image.fromarray(ink).resize(size, Image.Resampling.BICUBIC)), 0.0, 1.0)


def normalise_stroke(ink: np.ndarray, side: float, share: float = 1.0) -> np.ndarray:
    """The digit (its longer side `side` px) with its strokes eroded (a marker) or dilated (a fine pen)
    by grey morphology with a disk to MNIST's median width, at NORM_BOX px, when they lie outside
    MNIST's range (contract.STROKE_RANGE); a digit within the range comes back as it was.

    The disk's radius r solves (w -+ 2r) / (S -+ 2r) = median: eroding or dilating also shrinks or
    grows the digit's box S, which fit_and_centre scales back to its ink box. `share`: one digit's
    box over the ink's (MNIST's 20 px over a pair's 23), since the widths are fractions of a digit.
    """
    x = ink if side == NORM_BOX else at_norm_box(ink, side)
    width, target = stroke_width(x), contract.STROKE_MEDIAN * share
    low, high = (NORM_BOX * f * share for f in contract.STROKE_RANGE)
    radius = abs(width - target * NORM_BOX) / (2 * (1 - target))
    if width > high:
        return ndimage.grey_erosion(x, footprint=disk(radius))
    if 0 < width < low:
        return ndimage.grey_dilation(x, footprint=disk(radius))
    return ink


def digit_ink(picture: Image.Image, paper: Paper, digit: Digit, factor: int) -> tuple[np.ndarray, float]:
    """The digit's ink cropped from the full picture, in [0, 1] (1 = its strongest strokes), only where
    the kept parts are (specks and other shapes are gone), and the digit's longer side in its px.

    A digit larger than NORM_BOX is box-reduced to NORM_BOX; a smaller one keeps its pixels, so that
    an MNIST-like image comes back as it was.
    """
    top, left, bottom, right = (side * factor for side in digit.box)
    side = max(bottom - top, right - left)
    pad = math.ceil(MARGIN * side) + factor
    box = (max(0, left - pad), max(0, top - pad), min(picture.width, right + pad), min(picture.height, bottom + pad))
    scale = min(1.0, NORM_BOX / side)
    size = (max(1, round((box[2] - box[0]) * scale)), max(1, round((box[3] - box[1]) * scale)))
    x = np.asarray(picture.resize(size, Image.Resampling.BOX, box=box), np.float32) / 255
    gate = Image.fromarray(digit.mask).resize(size, Image.Resampling.NEAREST, box=tuple(c / factor for c in box))
    gate = ndimage.maximum_filter(np.asarray(gate), size=2 * math.ceil(scale * factor) + 1)
    r = ink_map(x, paper, box, picture.size)
    sigma = paper_sigma(r[~gate]) if (~gate).sum() >= 64 else paper.sigma  # the noise at this scale
    a = np.clip(r, 0.0, None)
    strongest = float(a.max(where=gate, initial=0.0))
    if strongest == 0.0:
        raise ImageError(NO_INK)
    a = np.where(gate & (a >= min(noise_floor(a, sigma), strongest)), a, 0.0)  # the strongest ink stays
    return (a / strongest).astype(np.float32), side * scale


def warnings_of(digit: Digit, what: str = "one digit") -> list[str]:
    """Sentences about an input the model may misread; `what` the model wants in one image."""
    notes = []
    if digit.contrast < LOW_CONTRAST:
        notes.append(f"very low contrast: the ink differs from the paper by {digit.contrast:.2f} of the full "
                     "range; a darker pen or more light would help")
    if digit.other_shapes:
        notes.append(f"{digit.other_shapes} other shape(s) beside the digit were left out; send {what} "
                     "per image")
    return notes


def fit_and_centre(x: np.ndarray, box: int | None = contract.INK_BOX, size: int = contract.IMAGE_SIZE) -> np.ndarray:
    """Ink (H, W) -> (size, size): crop to the ink, fit into box x box keeping aspect (None: keep its
    scale), centre of mass at the centre (LeCun's MNIST: box 20, size 28, centre (14, 14))."""
    rows, cols = np.flatnonzero(x.any(axis=1)), np.flatnonzero(x.any(axis=0))
    x = x[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    scale = 1.0 if box is None else box / max(x.shape)
    height, width = (max(1, round(side * scale)) for side in x.shape)
    small = Image.fromarray(x).resize((width, height), Image.Resampling.LANCZOS)
    small = np.clip(np.asarray(small), 0.0, None)
    small = np.clip(small / small.max(), 0.0, 1.0)  # LeCun's digits reach full intensity
    ys, xs = np.indices(small.shape)
    mass = small.sum()
    top = int(np.floor(size // 2 - (ys * small).sum() / mass + 0.5))
    left = int(np.floor(size // 2 - (xs * small).sum() / mass + 0.5))
    top, left = min(max(top, 0), size - height), min(max(left, 0), size - width)
    out = np.zeros((size, size), np.float32)
    out[top:top + height, left:left + width] = small
    return out


def digits(image: Image.Image, boxes: tuple[int, ...] | None, size: int, what: str) -> Prepared:
    """One digit (or an overlapping pair, `what`) found, cropped, its stroke set, fitted into each ink
    box of `boxes` and centred (candidates when there are several, the first as the image); boxes None:
    a picture already at the model's scale, its ink only found and centred."""
    picture, light_ink = source(image)
    paper, digit, factor = locate(picture, light_ink)
    ink, side = digit_ink(picture, paper, digit, factor)
    if boxes is None:
        return Prepared(fit_and_centre(ink, None, size), warnings_of(digit, what))
    # share: one digit's box over the whole ink's, since MNIST's stroke widths are fractions of one digit
    fitted = np.stack([fit_and_centre(normalise_stroke(ink, side, contract.INK_BOX / box), box, size)
                       for box in boxes])
    return Prepared(fitted[0], warnings_of(digit, what), fitted if len(boxes) > 1 else None)


def on_white(image: Image.Image) -> np.ndarray:
    """Grey (H, W) in [0, 1] with transparent pixels on white, as a product cut-out is shown."""
    grey, alpha = channels(image)
    return grey if alpha is None else grey * alpha + (1.0 - alpha)


def garment(image: Image.Image, box: int, size: int) -> Prepared:
    """One object on a plain background, as Fashion-MNIST made its images from product photos: the
    background (the median of the picture's frame) is trimmed, the object's longest edge resized to
    `box` (anti-aliased), the other edge extended to `size` around it, and the intensities negated so
    that the object is light on black; its grey levels are kept (a garment is not ink). A dark
    background is not negated. What differs from the background by under TRIM (or the frame's noise) is
    trimmed, and specks (parts with under MIN_PART of the heaviest's weight) are left out."""
    x = on_white(image)
    h, w = x.shape
    m = max(1, round(BORDER * max(h, w)))
    frame = np.concatenate([x[:m].ravel(), x[-m:].ravel(), x[:, :m].ravel(), x[:, -m:].ravel()])
    paper = float(median(frame))
    a = (paper - x) / max(paper, 1e-6) if paper >= 0.5 else (x - paper) / max(1.0 - paper, 1e-6)
    a = np.clip(a, 0.0, 1.0)
    flat = ImageError("nothing stands out from the background: the image is one flat colour (or noise); send a "
                      "photo of one garment on a plain background")
    if a.max() < MIN_CONTRAST:
        raise flat
    floor = max(TRIM, NOISE_FLOOR * robust_sigma(frame - paper))
    labels, n = ndimage.label(a > floor, np.ones((3, 3), bool))
    if n == 0:  # all of it within the frame's noise of the background: noise, no object
        raise flat
    masses = np.bincount(labels.ravel(), a.ravel(), n + 1)[1:]
    kept = np.flatnonzero(masses >= MIN_PART * masses.max()) + 1
    rows, cols = np.nonzero(np.isin(labels, kept))
    a = a[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
    scale = box / max(a.shape)
    height, width = (min(box, max(1, round(side * scale))) for side in a.shape)
    small = np.clip(np.asarray(Image.fromarray(a).resize((width, height), Image.Resampling.LANCZOS)), 0.0, 1.0)
    out = np.zeros((size, size), np.float32)
    top, left = (size - height + 1) // 2, (size - width + 1) // 2  # an odd margin's extra pixel before, as Fashion-MNIST's
    out[top:top + height, left:left + width] = small
    notes = [] if a.max() >= LOW_CONTRAST else [
        f"very low contrast: the object differs from the background by {a.max():.2f} of the full range"]
    return Prepared(out, notes)


PAIR = "two overlapping digits"
PAIR_STEPS = (0, -4, -2, 2, 4)  # px added to the median union's ink box: the scales a drawn pair is read at


def preprocess(image: Image.Image, kind: str = "digit", size: int = contract.IMAGE_SIZE,
               box: int = contract.INK_BOX) -> Prepared:
    """A decoded image -> the (size, size) float32 model input and warnings about it.

    Args:
        kind: a model's preprocessing (contract.PREPROCESSING: digit, digit-pair, garment), or "none":
            the image must already be the model's size x size picture, white on black (transparent
            pixels count as black).
        size: the model's input side (its card's serving.input.size).
        box: the ink box's longer side in the input (its card's serving.preprocessing.ink_box).
    """
    if kind == "none":
        if image.size != (size, size):
            raise ImageError(f"preprocess=none needs a {size}x{size} image; this one is "
                             f"{image.width}x{image.height} (use preprocess=auto)")
        grey, alpha = channels(image)
        return Prepared((grey if alpha is None else grey * alpha).astype(np.float32), [])
    if kind == "garment":
        return garment(image, box, size)
    if kind == "digit-pair":
        # Two digits' union has no one size (each digit is 20 px, their shifts differ by up to 8): a picture
        # at the model's size is taken at its scale (fitting the union to the median box cost the model 13
        # points on the card's test pairs: 71% vs 84%); a drawing or photo is fitted to unions from 4 px
        # under the median to 4 over, and the scale the model's answer redraws best is kept
        # (app/routes/predict.py: read).
        if image.size == (size, size):
            return digits(image, None, size, PAIR)
        return digits(image, tuple(box + step for step in PAIR_STEPS), size, PAIR)
    return digits(image, (box,), size, "one digit")


OVERLAY_INPUT = 0.35  # the input's brightness under the reconstructions of overlay()


def overlay(image: np.ndarray, drawings: np.ndarray) -> np.ndarray:
    """The paper's Fig. 5 colouring: the first object's reconstruction in red and the second's in green
    (yellow where both explain a pixel; a third, if any, in blue) over the dimmed input.

    Args:
        image: the model's input (H, W) in [0, 1].
        drawings: the objects' reconstructions (k, H, W), longest capsule first.
    Returns:
        (H, W, 3) float32 in [0, 1].
    """
    base = OVERLAY_INPUT * image
    rgb = np.repeat(base[..., None], 3, axis=-1)
    for channel, drawing in enumerate(drawings[:3]):
        rgb[..., channel] = np.maximum(base, drawing)
    return np.clip(rgb, 0.0, 1.0).astype(np.float32)


def png_data_url(x: np.ndarray) -> str:
    """(H, W) grey or (H, W, 3) RGB floats in [0, 1] -> "data:image/png;base64,..." (8 bits a channel)."""
    buffer = io.BytesIO()
    Image.fromarray(np.round(np.clip(x, 0.0, 1.0) * 255).astype(np.uint8)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
