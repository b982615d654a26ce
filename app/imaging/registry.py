"""The card's preprocessing name -> the function that turns a decoded picture into the model's input.

A model's card names its preprocessing (model/contract.py's PREPROCESSING, model/card.py); a request may
ask for none instead (preprocess=none): the picture is already the model's input.
"""

from collections.abc import Callable

import numpy as np

from app.imaging import digit, garment, pair
from app.imaging.decode import ImageError, Picture, channels, size_of
from app.imaging.ink import LOW_CONTRAST, MIN_CONTRAST, frame, median
from app.imaging.prepared import Prepared
from model import contract

# name -> prepare(image, size: the model's input side, box: the ink box's longer side in it)
PREPROCESSINGS: dict[str, Callable[[Picture, int, int], Prepared]] = {
    "digit": digit.prepare,
    "digit-pair": pair.prepare,
    "garment": garment.prepare,
}


def as_is(image: Picture, size: int) -> Prepared:
    """The picture itself as the input: it must already be size x size, white on black (transparent
    pixels count as black); one that cannot be such an input is answered with warnings (as_is_warnings)."""
    width, height = size_of(image)
    if (width, height) != (size, size):
        raise ImageError(
            f"preprocess=none needs a {size}x{size} image; this one is {width}x{height} (use preprocess=auto)"
        )
    grey, alpha = channels(image)
    x = (grey if alpha is None else grey * alpha).astype(np.float32)
    return Prepared(x, as_is_warnings(x))


def as_is_warnings(x: np.ndarray) -> list[str]:
    """Sentences about an input taken as it is that is unlike every image the models learnt from: blank (no
    pixel MIN_CONTRAST off another), of low contrast (under LOW_CONTRAST), or on light paper (its frame's
    (upper) median above 0.5: the models read white ink on black, and no MNIST or Fashion-MNIST test image's frame
    is lighter than 0.35)."""
    contrast = float(x.max() - x.min())
    if contrast < MIN_CONTRAST:
        return [
            f"the image is blank: no pixel differs from another by {MIN_CONTRAST:.0%} of the full range, so there "
            "is no ink for the model to read"
        ]
    notes = []
    if contrast < LOW_CONTRAST:
        notes.append(
            f"very low contrast: the image's pixels span {contrast:.2f} of the full range, where the model's "
            "training images span all of it"
        )
    if median(frame(x)) > 0.5:
        notes.append(
            "the image's edges are light: the model reads white ink on black, so it reads this paper as ink; "
            "invert the image, or send it with preprocess=auto"
        )
    return notes


def preprocess(
    image: Picture, kind: str = "digit", size: int = contract.IMAGE_SIZE, box: int = contract.INK_BOX
) -> Prepared:
    """A decoded picture (a Pillow image, or grey pixels) -> the (size, size) float32 model input and warnings
    about it.

    Args:
        kind: a model's preprocessing (contract.PREPROCESSING: digit, digit-pair, garment), or "none":
            the image must already be the model's size x size picture, white on black (transparent
            pixels count as black).
        size: the model's input side (its card's serving.input.size).
        box: the ink box's longer side in the input (its card's serving.preprocessing.ink_box).
    """
    if kind == "none":
        return as_is(image, size)
    if kind not in PREPROCESSINGS:
        raise ValueError(
            f"no preprocessing is named {kind!r}: a model's card names one of "
            f"{', '.join(PREPROCESSINGS)}, and a request may ask for none"
        )
    return PREPROCESSINGS[kind](image, size, box)
