"""Decode untrusted image bytes safely, turn them into what the model expects, and draw the answer.

decode.py     untrusted bytes (or base64) -> a loaded, upright Pillow image, or a plain grey PNG's pixels;
              ImageError (a 4xx and why)
ink.py        the paper under the ink, the noise on it, and the parts of the ink that make the digit
digit.py      one digit: cropped, its stroke brought into MNIST's range, fitted and centred as LeCun's
pair.py       two overlapping digits (MultiMNIST), fitted at several scales
garment.py    one object on a plain background, as Fashion-MNIST was made from product photos
resample.py   Pillow's bicubic and Lanczos resize of a small float picture, as two matrix products
prepared.py   what each of them returns: the input, its warnings, its candidates
registry.py   the card's preprocessing name -> its function; preprocess() picks one
render.py     the answer's pictures: PNG data URLs and the paper's Fig. 5 overlay
transform.py  /explain's transforms of the model's input (rotate, scale, shear, shift, thickness): sweep()
"""

from app.imaging.decode import ImageError, Picture, decode, from_base64, load, open_image, plain_grey_png
from app.imaging.prepared import Prepared
from app.imaging.registry import preprocess
from app.imaging.render import overlay, png_data_url

__all__ = [
    "ImageError",
    "Picture",
    "Prepared",
    "decode",
    "from_base64",
    "load",
    "open_image",
    "overlay",
    "plain_grey_png",
    "png_data_url",
    "preprocess",
]
