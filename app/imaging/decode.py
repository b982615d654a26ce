"""Untrusted bytes -> a decoded, upright Pillow image, and its pixels as floats.

Only PNG, JPEG, BMP, GIF and WebP are opened; the pixel limit is checked from the header before a
pixel is decoded, and whatever a malformed file makes Pillow raise becomes an ImageError: the 4xx to
answer and a sentence saying why. Base64 and data URLs (a JSON body's `image`) are read here too.
A small plain grey PNG (an MNIST digit as Pillow or OpenCV saves it) is read without Pillow: its
chunks are checked here and its pixels decoded by OpenCV (plain_grey_png), the same pixels in one call.

The pixel limit is the service's (Settings.max_pixels) alone: Pillow's own decompression-bomb guard, whose
limit and words are not the service's, is off.
"""

import base64
import binascii
import io
import math
import re
import struct
import zlib
from contextlib import contextmanager

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from model.contract import WORK_SIZE

FORMATS = ("PNG", "JPEG", "BMP", "GIF", "WEBP")
MAX_SIDE = 2**31 - 1  # the largest side a file of FORMATS can hold (PNG's, BMP's; the others stop below)
LUMA = np.array([0.299, 0.587, 0.114], np.float32)  # ITU-R 601, what Pillow's convert("L") uses
DATA_URL = re.compile(r"data:[^,]*?;base64,", re.IGNORECASE)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLAIN_GREY = bytes([8, 0, 0, 0, 0])  # IHDR's bit depth, colour type (grey), compression, filter, interlace (none)

# A decoded picture: a Pillow image, or a grey picture's pixels (H, W) uint8 (plain_grey_png's)
Picture = Image.Image | np.ndarray

Image.MAX_IMAGE_PIXELS = None  # open_image checks the service's limit, from the same header


class ImageError(ValueError):
    """An image the service cannot use, with the 4xx status to answer and a sentence saying why."""

    def __init__(self, detail: str, status_code: int = 422):
        super().__init__(detail)
        self.detail, self.status_code = detail, status_code


def from_base64(text: str) -> bytes:
    """Base64 or a base64 data URL ("data:image/png;base64,...") -> bytes; whitespace is ignored."""
    text = text.strip()
    if match := DATA_URL.match(text):
        text = text[match.end() :]
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
    except UnidentifiedImageError:
        raise ImageError("the file is not a readable PNG, JPEG, BMP, GIF or WebP image") from None
    except Exception as exc:
        raise ImageError(f"the image could not be decoded, it may be truncated or corrupt ({exc})") from None


def open_image(data: bytes, max_pixels: int) -> Image.Image:
    """Bytes -> a Pillow image whose header is read and checked; no pixel is decoded yet.

    The pixel limit is checked here, from the header (Pillow's own guard is off: the module's docstring).
    """
    if not data:
        raise ImageError("the image is empty (0 bytes)")
    with _decoder_errors():
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    width, height = image.size
    if max(width, height) > MAX_SIDE:  # a side no format stores: a negative one read as unsigned
        raise ImageError(
            f"the image's header gives it {width}x{height} pixels, a size no image has: the file is corrupt"
        )
    if width * height > max_pixels:
        raise ImageError(
            f"the image has {width}x{height} = {width * height:,} pixels; the limit is {max_pixels:,}", 413
        )
    return image


def plain_grey_png(data: bytes, max_side: int, max_pixels: int) -> np.ndarray | None:
    """The pixels (H, W) uint8 of a plain 8-bit grey PNG of at most max_side px a side and max_pixels pixels,
    decoded by OpenCV: one call into libpng, where Pillow reads a PNG's chunks and rows in Python, which costs
    a small picture more than its pixels. None for any other file, which open_image and load read.

    Plain: its chunks are IHDR (8-bit grey, not interlaced), IDAT and IEND, each with its CRC right, and the
    IDAT data is one complete zlib stream of exactly its rows, each led by a PNG filter type (0-4). Such a file
    has nothing Pillow would read differently (no transparency, no orientation, no text), and nothing libpng
    could refuse or warn about, which it would write to the process's stderr."""
    if not data.startswith(PNG_SIGNATURE) or data[24:29] != PLAIN_GREY:  # IHDR's layout, read before any CRC
        return None
    chunks, at, kind = [], len(PNG_SIGNATURE), b""
    while at < len(data):
        if at + 12 > len(data):
            return None
        length, kind = struct.unpack_from(">I4s", data, at)
        end = at + 12 + length
        if kind != (b"IHDR" if at == len(PNG_SIGNATURE) else b"IDAT") and (kind != b"IEND" or end != len(data)):
            return None  # IHDR first, IEND last, IDAT between
        if end > len(data) or zlib.crc32(data[at + 4 : end - 4]) != struct.unpack_from(">I", data, end - 4)[0]:
            return None
        chunks.append(data[at + 8 : end - 4])
        at = end
    if kind != b"IEND" or len(chunks) < 3 or len(chunks[0]) != 13 or chunks[-1]:  # IHDR's 13 bytes, IEND empty
        return None
    width, height = struct.unpack_from(">II", chunks[0])  # its layout, PLAIN_GREY, read above
    if not (0 < width <= max_side and 0 < height <= max_side):
        return None
    if width * height > max_pixels:
        return None  # open_image says so
    size = height * (width + 1)  # each row: its filter type, then its pixels
    stream = zlib.decompressobj()
    try:
        rows = stream.decompress(b"".join(chunks[1:-1]), size + 1)
    except zlib.error:
        return None
    if (
        len(rows) != size
        or not stream.eof
        or stream.unused_data
        or stream.unconsumed_tail
        or max(rows[:: width + 1]) > 4
    ):
        return None
    pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    return pixels if pixels is not None and pixels.shape == (height, width) and pixels.dtype == np.uint8 else None


def size_of(picture: Picture) -> tuple[int, int]:
    """(width, height) of a picture, Pillow's order."""
    return (picture.shape[1], picture.shape[0]) if isinstance(picture, np.ndarray) else picture.size


def pillow(picture: Picture) -> Image.Image:
    """A picture as a Pillow image, for Pillow's resampling (grey pixels: an "L" image of the same memory)."""
    return Image.fromarray(picture) if isinstance(picture, np.ndarray) else picture


def load(image: Image.Image) -> Image.Image:
    """Decode the pixels of an opened image (the first frame of an animation), upright per its EXIF."""
    with _decoder_errors():
        # JPEG: decode at a reduced scale when large, and colour photos as grey (their Y channel, the
        # luma both preprocessings read) without the chroma work
        image.draft("L" if image.mode == "RGB" else image.mode, (WORK_SIZE, WORK_SIZE))
        image.load()
        ImageOps.exif_transpose(image, in_place=True)  # in place: an upright image is not copied
        return image


def decode(data: bytes, max_pixels: int) -> Image.Image:
    """Bytes -> a loaded, upright Pillow image; every failure is an ImageError."""
    return load(open_image(data, max_pixels))


def has_transparency(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info


def alpha_channel(image: Image.Image) -> Image.Image | None:
    """The image's opacity as one 8-bit band (255: opaque), or None for an image without transparency. A 16-bit
    grey PNG's one transparent value is matched at its depth: Pillow's RGBA conversion matches it after
    clipping the grey to 8 bits (65535 would make every grey from 255 up transparent, 32896 none)."""
    if not has_transparency(image):
        return None
    value = image.info.get("transparency")
    if image.mode.startswith("I") and isinstance(value, int):
        return Image.fromarray(np.where(np.asarray(image.convert("I")) == value, 0, 255).astype(np.uint8))
    return image.convert("RGBA").getchannel("A")


def channels(image: Picture) -> tuple[np.ndarray, np.ndarray | None]:
    """Grey (H, W) and alpha (H, W) or None when fully opaque, float32 in [0, 1].

    Grey, RGB, palette, 1-bit, CMYK and 16-bit grey are all read, with their transparency (an alpha
    channel, or a PNG's one transparent value: at 16 bits too); images larger than WORK_SIZE are
    box-reduced first.
    """
    factor = math.ceil(max(size_of(image)) / WORK_SIZE)

    def read(band: Picture, scale: float) -> np.ndarray:
        band = pillow(band).reduce(factor) if factor > 1 else band
        return np.clip(np.asarray(band, dtype=np.float32) / scale, 0.0, 1.0)

    if isinstance(image, np.ndarray):  # grey pixels
        return read(image, 255.0), None
    if image.mode.startswith("I"):  # 16-bit grey PNG ("I;16") or 32-bit integer, its grey at full depth
        grey, opacity = read(image.convert("I"), 65535.0), alpha_channel(image)
        alpha = None if opacity is None else read(opacity, 255.0)
    elif has_transparency(image):
        rgba = read(image.convert("RGBA"), 255.0)
        grey, alpha = rgba[..., :3] @ LUMA, rgba[..., 3]
    else:
        return read(image.convert("L"), 255.0), None
    return grey, (alpha if alpha is not None and alpha.min() < 1.0 else None)
