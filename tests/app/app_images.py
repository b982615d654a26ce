"""Image helpers for the app tests (a module, not conftest, so tests can import it)."""
import io

import numpy as np
from PIL import Image


def png_bytes(image: Image.Image | np.ndarray, fmt: str = "PNG", **save_args) -> bytes:
    if isinstance(image, np.ndarray):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **save_args)
    return buffer.getvalue()
