"""Pictures for the demo, drawn with numpy and Pillow (no matplotlib in the demo image).

Each function takes plain arrays from the API and returns one PIL image:
`digit` (a model's square input or reconstruction, 28x28, 36x36 or 40x40, upscaled without blur, grey or
tinted), `lengths_chart` (the 10 capsule lengths with the margin-loss lines m+ and m-),
`routing_heatmaps` (the per-class routing maps on the primary grid, 6x6 to 12x12) and `fig4_grid`
(the paper's Fig. 4: one row per capsule dimension, one column per perturbation).
"""

import math
from collections.abc import Sequence
from functools import cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont, ImageOps

from model.contract import M_MINUS, M_PLUS, NUM_CLASSES

RGB = tuple[int, int, int]
PAPER = (255, 255, 255)
INK = (40, 40, 48)
MUTED = (120, 120, 130)
BAR = (148, 163, 184)
MARGIN = (37, 99, 235)  # the m+ and m- lines
WINNER = (234, 88, 12)  # the predicted class, in the demo's accent colour
PAIR_COLOURS = ((239, 68, 68), (34, 197, 94))  # the two digits of a pair: red and green, as in the API's overlay
DIGITS = tuple(str(j) for j in range(NUM_CLASSES))  # class names of the digit models
SCALE = 8  # screen pixels per model pixel
TILT = 40  # degrees: class names too wide for their bar are drawn slanted
TITLE_ROOM = 26  # px above a chart's plot for its title
TILE_GAP, TILE_CAPTION = 14, 28  # px between routing_heatmaps' tiles, and above each for its label
# Anchor colours of a dark-to-bright heat scale (black, purple, red, orange, pale yellow).
HEAT = np.array([(0, 0, 4), (81, 18, 124), (183, 55, 121), (252, 137, 97), (252, 253, 191)], dtype=np.float32)


@cache
def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Pillow's bundled font at `size` px, loaded once (loading it costs more than drawing a chart)."""
    return ImageFont.load_default(size=size)


def fitting_font(
    texts: Sequence[str], width: float, largest: int, smallest: int = 10
) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """The largest font, from `largest` down to `smallest` px, in which every text is at most `width` wide."""
    size = largest
    while size > smallest and max(font(size).getlength(t) for t in texts) > width:
        size -= 1
    return font(size)


def wrapped(text: str, fnt: ImageFont.FreeTypeFont | ImageFont.ImageFont, width: float) -> list[str]:
    """`text` in lines at most `width` wide in `fnt`, broken after its commas, and between the words of a
    part too wide for a line of its own (a word wider than that alone on its line)."""
    lines: list[str] = []
    for part in text.replace(", ", ",\n").split("\n"):
        for piece in [part] if fnt.getlength(part) <= width else part.split():
            if lines and fnt.getlength(f"{lines[-1]} {piece}") <= width:
                lines[-1] = f"{lines[-1]} {piece}"
            else:
                lines.append(piece)
    return lines


def caption_font(
    texts: Sequence[str], width: float, largest: int, smallest: int, lines: int = 2
) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """The largest font, from `largest` down to `smallest` px, in which every text takes at most `lines`
    lines `width` wide (wrapped)."""
    size = largest
    while size > smallest and max(len(wrapped(t, font(size), width)) for t in texts) > lines:
        size -= 1
    return font(size)


def enlarge(image: Image.Image, scale: int = SCALE) -> Image.Image:
    """`scale` times larger, each pixel a crisp square (no blur)."""
    return image.resize((image.width * scale, image.height * scale), Image.Resampling.NEAREST)


def digit(pixels: np.ndarray, scale: int = SCALE, colour: RGB | None = None) -> Image.Image:
    """A square image (any side), floats in [0, 1] or uint8, as a picture `scale` times larger:
    grey, or ink of `colour` on black."""
    x = np.asarray(pixels)
    if x.dtype != np.uint8:
        x = (np.clip(x, 0.0, 1.0) * 255).round().astype(np.uint8)
    image = Image.fromarray(x, mode="L")
    if colour is not None:
        image = ImageOps.colorize(image, black=(0, 0, 0), white=colour)
    return enlarge(image, scale)


def heat(values: np.ndarray) -> np.ndarray:
    """Values in [0, 1] (any shape) to RGB uint8 (shape + (3,)) on the HEAT scale."""
    x = np.clip(values, 0.0, 1.0) * (len(HEAT) - 1)
    low = np.floor(x).astype(int).clip(0, len(HEAT) - 2)
    t = (x - low)[..., None]
    return ((1 - t) * HEAT[low] + t * HEAT[low + 1]).round().astype(np.uint8)


def slanted_text(
    image: Image.Image, xy: tuple[float, float], text: str, fnt: ImageFont.FreeTypeFont | ImageFont.ImageFont, fill: RGB
) -> None:
    """Draw `text` rising at TILT degrees, its end at `xy` (the top right of the slanted text)."""
    right, bottom = fnt.getbbox(text)[2:]
    label = Image.new("RGBA", (int(right) + 2, int(bottom) + 2), (0, 0, 0, 0))  # whole pixels, as Pillow's are
    ImageDraw.Draw(label).text((0, 0), text, font=fnt, fill=fill)
    label = label.rotate(TILT, expand=True, resample=Image.Resampling.BICUBIC)
    image.paste(label, (round(xy[0] - label.width), round(xy[1])), label)


def lengths_chart(
    lengths: np.ndarray, marks: dict[int, RGB], names: Sequence[str] = DIGITS, width: int = 560, height: int = 290
) -> Image.Image:
    """Bar chart of the 10 capsule lengths ||v_j|| with the margin-loss lines m+ and m-, under its title.

    A present class is trained to a length above m+ and an absent one below m- (paper, Eq. 4). `marks`
    colours the answer's bars (class -> colour); `names` label the bars, slanted where they are wider
    than a bar's slot. Each bar's length is written above it, just above a margin line it would sit on, and
    a full bar's leaves room for the title above it.
    """
    title_font, small, label = font(17), font(14), font(16)
    left, right = 44, 70
    top = TITLE_ROOM + round(small.getbbox("0.00")[3]) + 6  # the title, then a full bar's length
    plot_w = width - left - right
    slot = plot_w / NUM_CLASSES
    widest = max(label.getlength(name) for name in names)
    slanted = widest > slot
    bottom = round(widest * math.sin(math.radians(TILT))) + 24 if slanted else 30
    plot_h = height - top - bottom
    image = Image.new("RGB", (width, height), PAPER)
    draw = ImageDraw.Draw(image)
    draw.text((8, 6), "Capsule lengths", fill=INK, font=title_font, anchor="lt")

    def y_of(value: float) -> float:
        return top + plot_h * (1.0 - value)

    for tick in (0.0, 0.5, 1.0):
        draw.text((left - 8, y_of(tick)), f"{tick:.1f}", fill=MUTED, font=small, anchor="rm")
    draw.line([(left, top), (left, top + plot_h)], fill=MUTED)
    draw.line([(left, top + plot_h), (left + plot_w, top + plot_h)], fill=MUTED)

    bars = []
    for j, length in enumerate(np.clip(lengths, 0.0, 1.0)):
        x0, x1 = left + j * slot + slot * 0.18, left + (j + 1) * slot - slot * 0.18
        draw.rectangle([x0, y_of(length), x1, top + plot_h], fill=marks.get(j, BAR))
        bars.append(((x0 + x1) / 2, y_of(length) - 3, f"{length:.2f}"))
        if slanted:
            slanted_text(image, ((x0 + x1) / 2 + 6, top + plot_h + 4), names[j], label, INK)
        else:
            draw.text(((x0 + x1) / 2, top + plot_h + 6), names[j], fill=INK, font=label, anchor="mt")

    lines = []
    for margin, name in ((M_PLUS, "m+"), (M_MINUS, "m-")):
        y = y_of(margin)
        lines.append(y)
        for x in range(left, left + plot_w, 10):  # dashed
            draw.line([(x, y), (min(x + 5, left + plot_w), y)], fill=MARGIN, width=2)
        draw.text((left + plot_w + 6, y), f"{name} = {margin:g}", fill=MARGIN, font=small, anchor="lm")
    for centre, baseline, text in bars:
        _, upper, _, lower = draw.textbbox((centre, baseline), text, font=small, anchor="md")
        for y in lines:  # on a line, its dashes either side would read as a minus sign: just above it instead
            if upper - 2 <= y <= lower + 2:
                shift = lower - y + 4
                baseline, upper, lower = baseline - shift, upper - shift, lower - shift
        draw.text((centre, baseline), text, fill=INK, font=small, anchor="md")
    return image


def routing_heatmaps(
    maps: np.ndarray,
    lengths: np.ndarray,
    order: list[int],
    marks: dict[int, RGB],
    names: Sequence[str] = DIGITS,
    tile: int = 120,
    top: float | None = None,
) -> Image.Image:
    """The per-class routing maps (a square primary grid each) as heat tiles in the given order, on one
    shared square-root scale whose brightest value is `top` (default: the maps' largest).

    One scale for all classes (and, through `top`, for every routing iteration) keeps them comparable:
    after the last iteration the class that received the votes is brightest. The square root keeps the
    many modest votes visible beside the brightest cells, those of a few primary capsules whose couplings
    rise to about 0.5-0.9 and whose votes are long (several times the map's median). Each tile is labelled
    with its class name (in its `marks` colour, if any) and capsule length.
    """
    maps = np.asarray(maps, dtype=np.float32)
    scaled = np.sqrt(np.clip(maps / max(float(maps.max()) if top is None else top, 1e-12), 0.0, 1.0))
    cell = tile // maps.shape[-1]
    side, gap, caption = cell * maps.shape[-1], TILE_GAP, TILE_CAPTION
    name_font = fitting_font(names, side * 0.62, largest=22)
    columns = (len(order) + 1) // 2
    image = Image.new("RGB", (columns * (side + gap) + gap, 2 * (side + caption + gap) + gap), PAPER)
    draw = ImageDraw.Draw(image)
    for k, j in enumerate(order):
        x, y = gap + (k % columns) * (side + gap), gap + (k // columns) * (side + caption + gap)
        pixels = np.kron(heat(scaled[j]), np.ones((cell, cell, 1), dtype=np.uint8))
        image.paste(Image.fromarray(pixels, mode="RGB"), (x, y + caption))
        draw.text((x, y + caption - 6), names[j], fill=marks.get(j, INK), font=name_font, anchor="ls")
        draw.text((x + side, y + caption - 6), f"{lengths[j]:.2f}", fill=MUTED, font=font(18), anchor="rs")
    return image


def fig4_grid(tiles: np.ndarray, offsets: np.ndarray, scale: int = 2) -> Image.Image:
    """The paper's Fig. 4: tiles (dims, steps, size, size) as one picture, rows = capsule dimensions.

    Column headers are the perturbation added to that dimension; row labels are dimension numbers
    counted from 0, as the API's arrays and the model card count them.
    """
    dims, steps, size, _ = tiles.shape
    side = size * scale
    left, top, gap = 52, 24, 2
    image = Image.new("RGB", (left + steps * (side + gap), top + dims * (side + gap)), PAPER)
    draw = ImageDraw.Draw(image)
    for c, offset in enumerate(offsets):
        draw.text(
            (left + c * (side + gap) + side / 2, top - 6), f"{offset:+.2f}", fill=MUTED, font=font(11), anchor="ms"
        )
    for r in range(dims):
        draw.text((left - 8, top + r * (side + gap) + side / 2), f"dim {r}", fill=INK, font=font(12), anchor="rm")
        for c in range(steps):
            image.paste(digit(tiles[r, c], scale), (left + c * (side + gap), top + r * (side + gap)))
    return image


def _axis_range(values: np.ndarray) -> tuple[float, float]:
    low, high = float(np.min(values)), float(np.max(values))
    return (low, high) if high > low else (low - 1.0, high + 1.0)


def _polyline(draw: ImageDraw.ImageDraw, xs: np.ndarray, ys: np.ndarray, fill: RGB, width: int) -> None:
    draw.line(list(zip(xs.tolist(), ys.tolist(), strict=True)), fill=fill, width=width, joint="curve")


def sweep_lengths(
    values: np.ndarray,
    series: Sequence[tuple[str, np.ndarray, RGB]],
    followed: int,
    at: int,
    names: Sequence[str] = DIGITS,
    unit: str = "",
    width: int = 560,
    height: int = 280,
) -> Image.Image:
    """Capsule lengths along a sweep of one transform (POST /explain): the followed class's length for each
    model in `series` (name, lengths (steps, classes), colour), the first model's other classes in grey,
    the margin-loss lines m+ and m- (Eq. 4), and a marker at step `at` (the slider's)."""
    left, right, top, bottom = 44, 110, 14, 40
    plot_w, plot_h = width - left - right, height - top - bottom
    image = Image.new("RGB", (width, height), PAPER)
    draw = ImageDraw.Draw(image)
    small = font(12)
    low, high = _axis_range(values)
    xs = left + plot_w * (np.asarray(values, np.float64) - low) / (high - low)

    def y_of(length: np.ndarray | float) -> np.ndarray:
        return top + plot_h * (1.0 - np.clip(length, 0.0, 1.0))

    for tick in (0.0, 0.5, 1.0):
        draw.text((left - 8, float(y_of(tick))), f"{tick:.1f}", fill=MUTED, font=small, anchor="rm")
    draw.line([(left, top), (left, top + plot_h), (left + plot_w, top + plot_h)], fill=MUTED)
    for value in (low, (low + high) / 2, high):
        x = left + plot_w * (value - low) / (high - low)
        draw.text((x, top + plot_h + 6), f"{value:g}", fill=MUTED, font=small, anchor="mt")
    draw.text((left + plot_w / 2, height - 4), unit, fill=MUTED, font=small, anchor="mb")
    for margin, label in ((M_PLUS, "m+"), (M_MINUS, "m-")):
        y = float(y_of(margin))
        for x in range(left, left + plot_w, 10):  # dashed
            draw.line([(x, y), (min(x + 5, left + plot_w), y)], fill=MARGIN)
        draw.text((left + plot_w + 6, y), label, fill=MARGIN, font=small, anchor="lm")
    first = np.asarray(series[0][1], np.float32)
    for j in range(first.shape[1]):
        if j != followed:
            _polyline(draw, xs, y_of(first[:, j]), BAR, 1)
    x_at = float(xs[at])
    draw.line([(x_at, top), (x_at, top + plot_h)], fill=INK, width=1)
    line = round(small.getbbox("dA")[3]) + 3  # px from one legend line to the next
    y = top + plot_h * 0.3
    for k, (name, lengths, colour) in enumerate(series):
        ys = y_of(np.asarray(lengths, np.float32)[:, followed])
        _polyline(draw, xs, ys, colour, 3 - min(k, 1))
        draw.ellipse([x_at - 4, ys[at] - 4, x_at + 4, ys[at] + 4], fill=colour)
        for text in wrapped(f"{name}: {names[followed]}", small, right - 10):  # the legend, in the right margin
            draw.text((left + plot_w + 6, y), text, fill=colour, font=small)
            y += line
        y += 4
    return image


def sweep_dimensions(
    values: np.ndarray,
    capsules: np.ndarray,
    at: int,
    labels: Sequence[str],
    moving: int = 4,
    panel: tuple[int, int] = (150, 70),
) -> Image.Image:
    """The followed capsule's dimensions along a sweep, one small chart each on one shared scale (4 x 4
    for 16), a marker at step `at`: the `moving` dimensions that change most over the sweep in the
    accent colour (equivariance: they follow the transform), the others grey. Each chart's label is
    wrapped to its width, on as many lines as the longest label takes (two, in a font of 10 px or more)."""
    capsules = np.asarray(capsules, np.float32)  # (steps, dims)
    steps, dims = capsules.shape
    columns = 4
    rows = math.ceil(dims / columns)
    (w, h), gap = panel, 10
    label_font = caption_font(labels, w, largest=12, smallest=10)
    captions = [wrapped(label, label_font, w) for label in labels]
    line = round(label_font.getbbox("dA")[3]) + 2  # px from one line's baseline to the next
    caption = line * max(map(len, captions)) + 6
    image = Image.new("RGB", (columns * (w + gap) + gap, rows * (h + caption + gap) + gap), PAPER)
    draw = ImageDraw.Draw(image)
    reach = max(float(np.abs(capsules).max()), 1e-6)
    spread = np.ptp(capsules, axis=0)
    leaders = set(np.argsort(-spread)[:moving].tolist())
    xs_unit = np.linspace(0.0, 1.0, steps)
    for d in range(dims):
        x0 = gap + (d % columns) * (w + gap)
        y0 = gap + (d // columns) * (h + caption + gap) + caption
        colour = WINNER if d in leaders else BAR
        for k, text in enumerate(reversed(captions[d])):  # the last line just above the chart
            draw.text((x0, y0 - 4 - k * line), text, fill=INK if d in leaders else MUTED, font=label_font, anchor="ls")
        draw.rectangle([x0, y0, x0 + w, y0 + h], outline=(226, 232, 240))
        draw.line([(x0, y0 + h / 2), (x0 + w, y0 + h / 2)], fill=(226, 232, 240))
        xs = x0 + 4 + (w - 8) * xs_unit  # the step markers (radius 3) and the line inside the frame
        ys = y0 + h / 2 - (h / 2 - 3) * capsules[:, d] / reach
        _polyline(draw, xs, ys, colour, 2)
        draw.line([(xs[at], y0), (xs[at], y0 + h)], fill=INK)
        draw.ellipse([xs[at] - 3, ys[at] - 3, xs[at] + 3, ys[at] + 3], fill=colour)
    return image
