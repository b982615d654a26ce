"""Pictures for the demo, drawn with numpy and Pillow (no matplotlib in the demo image).

Each function takes plain arrays from the API and returns one PIL image:
`digit` (a 28x28 picture, upscaled without blur), `lengths_chart` (the 10 capsule lengths with the
margin-loss lines m+ and m-), `routing_heatmaps` (the per-class 6x6 routing maps) and `fig4_grid`
(the paper's Fig. 4: one row per capsule dimension, one column per perturbation).
"""
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from model.contract import M_MINUS, M_PLUS, NUM_CLASSES

PAPER = (255, 255, 255)
INK = (40, 40, 48)
MUTED = (120, 120, 130)
BAR = (148, 163, 184)
WINNER = (234, 88, 12)  # the predicted class, in the demo's accent colour
# Anchor colours of a dark-to-bright heat scale (black, purple, red, orange, pale yellow).
HEAT = np.array(
    [(0, 0, 4), (81, 18, 124), (183, 55, 121), (252, 137, 97), (252, 253, 191)], dtype=np.float32
)


def font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)


def digit(pixels: np.ndarray, scale: int = 8) -> Image.Image:
    """A 28x28 image, floats in [0, 1] or uint8, as a crisp greyscale picture `scale` times larger."""
    x = np.asarray(pixels)
    if x.dtype != np.uint8:
        x = (np.clip(x, 0.0, 1.0) * 255).round().astype(np.uint8)
    image = Image.fromarray(x, mode="L")
    return image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)


def heat(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] (any shape) to RGB uint8 (shape + (3,)) on the HEAT scale."""
    x = np.clip(values, 0.0, 1.0) * (len(HEAT) - 1)
    low = np.floor(x).astype(int).clip(0, len(HEAT) - 2)
    t = (x - low)[..., None]
    return ((1 - t) * HEAT[low] + t * HEAT[low + 1]).round().astype(np.uint8)


def lengths_chart(lengths: np.ndarray, prediction: int, width: int = 560, height: int = 260) -> Image.Image:
    """Bar chart of the 10 capsule lengths ||v_j|| with the margin-loss lines m+ and m-.

    A present digit is trained to a length above m+ and an absent one below m- (paper, Eq. 4).
    """
    left, right, top, bottom = 44, 70, 14, 30
    plot_w, plot_h = width - left - right, height - top - bottom
    image = Image.new("RGB", (width, height), PAPER)
    draw = ImageDraw.Draw(image)
    small, label = font(12), font(14)

    def y_of(value: float) -> float:
        return top + plot_h * (1.0 - value)

    for tick in (0.0, 0.5, 1.0):
        draw.text((left - 8, y_of(tick)), f"{tick:.1f}", fill=MUTED, font=small, anchor="rm")
    draw.line([(left, top), (left, top + plot_h)], fill=MUTED)
    draw.line([(left, top + plot_h), (left + plot_w, top + plot_h)], fill=MUTED)

    slot = plot_w / NUM_CLASSES
    for j, length in enumerate(np.clip(lengths, 0.0, 1.0)):
        x0, x1 = left + j * slot + slot * 0.18, left + (j + 1) * slot - slot * 0.18
        colour = WINNER if j == prediction else BAR
        draw.rectangle([x0, y_of(length), x1, top + plot_h], fill=colour)
        draw.text(((x0 + x1) / 2, y_of(length) - 3), f"{length:.2f}", fill=INK, font=small, anchor="md")
        draw.text(((x0 + x1) / 2, top + plot_h + 6), str(j), fill=INK, font=label, anchor="mt")

    for margin, name in ((M_PLUS, "m+"), (M_MINUS, "m-")):
        y = y_of(margin)
        for x in range(left, left + plot_w, 10):  # dashed
            draw.line([(x, y), (min(x + 5, left + plot_w), y)], fill=(37, 99, 235), width=2)
        draw.text((left + plot_w + 6, y), f"{name} = {margin:g}", fill=(37, 99, 235), font=small, anchor="lm")
    return image


def routing_heatmaps(maps: np.ndarray, lengths: np.ndarray, order: list[int], cell: int = 20) -> Image.Image:
    """The per-class 6x6 routing maps as heat tiles in the given order, on one shared scale.

    One scale for all classes keeps them comparable: the digit that received the votes is bright,
    the others stay dark. Each tile is labelled with its digit and capsule length.
    """
    maps = np.asarray(maps, dtype=np.float32)
    scaled = maps / max(float(maps.max()), 1e-12)
    grid = maps.shape[-1]
    tile, gap, caption = grid * cell, 14, 28
    columns = (len(order) + 1) // 2
    image = Image.new("RGB", (columns * (tile + gap) + gap, 2 * (tile + caption + gap) + gap), PAPER)
    draw = ImageDraw.Draw(image)
    for k, j in enumerate(order):
        x, y = gap + (k % columns) * (tile + gap), gap + (k // columns) * (tile + caption + gap)
        pixels = np.kron(heat(scaled[j]), np.ones((cell, cell, 1), dtype=np.uint8))
        image.paste(Image.fromarray(pixels, mode="RGB"), (x, y + caption))
        colour = WINNER if k == 0 else INK
        draw.text((x, y + caption - 6), str(j), fill=colour, font=font(22), anchor="ls")
        draw.text((x + tile, y + caption - 6), f"{lengths[j]:.2f}", fill=MUTED, font=font(18), anchor="rs")
    return image


def fig4_grid(tiles: np.ndarray, offsets: np.ndarray, scale: int = 2) -> Image.Image:
    """The paper's Fig. 4: tiles (dims, steps, 28, 28) as one picture, rows = capsule dimensions.

    Column headers are the perturbation added to that dimension; row labels are dimension numbers
    counted from 1.
    """
    dims, steps, size, _ = tiles.shape
    side = size * scale
    left, top, gap = 52, 24, 2
    image = Image.new("RGB", (left + steps * (side + gap), top + dims * (side + gap)), PAPER)
    draw = ImageDraw.Draw(image)
    for c, offset in enumerate(offsets):
        draw.text((left + c * (side + gap) + side / 2, top - 6), f"{offset:+.2f}", fill=MUTED, font=font(11), anchor="ms")
    for r in range(dims):
        draw.text((left - 8, top + r * (side + gap) + side / 2), f"dim {r + 1}", fill=INK, font=font(12), anchor="rm")
        for c in range(steps):
            image.paste(digit(tiles[r, c], scale), (left + c * (side + gap), top + r * (side + gap)))
    return image
