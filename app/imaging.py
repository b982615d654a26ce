"""Decode untrusted image bytes safely and turn them into what the model expects.

MNIST-style preprocessing follows how LeCun's MNIST was made (http://yann.lecun.com/exdb/mnist/):
the digit is cropped to its ink, fitted into a 20x20 box keeping its aspect ratio (anti-aliased),
and pasted into 28x28 so that its centre of mass sits at the centre. Our centre is pixel (14, 14),
the mean centre of mass of the MNIST test images (13.99, 14.01); like MNIST's the shift is whole
pixels. The model wants white ink (1.0) on black (0.0) (model/contract.py).

Ink: an image with transparency (a Gradio sketchpad sends RGBA strokes on a transparent layer) has
its ink in the alpha channel. Otherwise the background is the median of the border pixels and ink is
the distance from it, so dark-on-light, light-on-dark and strokes on the dark theme's #333333 all work.
"""
import base64
import binascii
import io
import math
import re
from contextlib import contextmanager

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from model import contract

FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP")
WORK_SIZE = 1024  # large images are box-reduced to at most this side before the float maths
INK_FLOOR = 0.15  # ink below this fraction of the strongest ink is background noise (JPEG ringing)
MIN_CONTRAST = 0.1  # an image whose ink never differs from the background by this much is blank
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R 601, what Pillow's convert("L") uses
CENTRE = contract.IMAGE_SIZE // 2  # 14
DATA_URL = re.compile(r"data:[^,]*?;base64,", re.IGNORECASE)


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
        image.draft(image.mode, (WORK_SIZE, WORK_SIZE))  # JPEG: decode at a reduced scale when large
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


def ink(grey: np.ndarray, alpha: np.ndarray | None) -> np.ndarray:
    """Ink (H, W) in [0, 1], 1 = the strongest stroke; raises ImageError when there is none."""
    if alpha is not None:
        x = alpha
    else:
        border = np.concatenate([grey[0], grey[-1], grey[:, 0], grey[:, -1]])
        x = np.abs(grey - np.median(border))
    peak = float(x.max())
    if peak < MIN_CONTRAST:
        raise ImageError("no ink was found: the image is blank (one flat colour); draw a digit")
    x = x / peak
    return np.where(x >= INK_FLOOR, x, 0.0).astype(np.float32)


def fit_and_centre(x: np.ndarray) -> np.ndarray:
    """Ink (H, W) -> (28, 28): crop to the ink, fit into 20x20 keeping aspect, centre of mass at (14, 14)."""
    rows, cols = np.flatnonzero(x.any(axis=1)), np.flatnonzero(x.any(axis=0))
    x = x[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1]
    scale = contract.INK_BOX / max(x.shape)
    height, width = (max(1, round(side * scale)) for side in x.shape)
    small = Image.fromarray(x).resize((width, height), Image.Resampling.LANCZOS)
    small = np.clip(np.asarray(small), 0.0, None)
    small = np.clip(small / small.max(), 0.0, 1.0)  # LeCun's digits reach full intensity
    ys, xs = np.indices(small.shape)
    mass = small.sum()
    top = int(np.floor(CENTRE - (ys * small).sum() / mass + 0.5))
    left = int(np.floor(CENTRE - (xs * small).sum() / mass + 0.5))
    size = contract.IMAGE_SIZE
    top, left = min(max(top, 0), size - height), min(max(left, 0), size - width)
    out = np.zeros((size, size), np.float32)
    out[top:top + height, left:left + width] = small
    return out


def preprocess(image: Image.Image, mode: str) -> np.ndarray:
    """A decoded image -> the (28, 28) float32 model input.

    Args:
        mode: "mnist" (find the ink, crop, fit, centre) or "none" (the image must already be a 28x28
            MNIST-style picture, white on black; transparent pixels count as black).
    """
    size = contract.IMAGE_SIZE
    if mode == "none":
        if image.size != (size, size):
            raise ImageError(f"preprocess=none needs a {size}x{size} image; this one is "
                             f"{image.width}x{image.height} (use preprocess=mnist)")
        grey, alpha = channels(image)
        return (grey if alpha is None else grey * alpha).astype(np.float32)
    return fit_and_centre(ink(*channels(image)))


def png_data_url(x: np.ndarray) -> str:
    """(H, W) floats in [0, 1] -> "data:image/png;base64,..." (8-bit grey)."""
    buffer = io.BytesIO()
    Image.fromarray(np.round(np.clip(x, 0.0, 1.0) * 255).astype(np.uint8)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
