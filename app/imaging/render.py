"""The answer's pictures: arrays as PNG data URLs, and the paper's Fig. 5 overlay of two objects."""

import base64

import cv2
import numpy as np

OVERLAY_INPUT = 0.35  # the input's brightness under the reconstructions of overlay()
# zlib level 3: as small as Pillow's PNG of a 28x28 digit (its level 6) in half its time
PNG_OPTIONS = [cv2.IMWRITE_PNG_COMPRESSION, 3]


def overlay(image: np.ndarray, drawings: np.ndarray) -> np.ndarray:
    """The paper's Fig. 5 colours, in an order of ours: the first object's reconstruction in red and the
    second's in green (yellow where both explain a pixel; a third, if any, in blue) over the dimmed input.

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
    """(H, W) grey or (H, W, 3) RGB floats in [0, 1] -> "data:image/png;base64,..." (8 bits a channel),
    written by OpenCV (which takes colour as BGR)."""
    pixels = np.round(np.clip(x, 0.0, 1.0) * 255).astype(np.uint8)
    _, png = cv2.imencode(".png", pixels[..., ::-1] if pixels.ndim == 3 else pixels, PNG_OPTIONS)
    return "data:image/png;base64," + base64.b64encode(png.tobytes()).decode("ascii")
