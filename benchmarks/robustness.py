"""Robustness suite: digits as people send them, read through the real preprocessing and the shipped model.

$ python -m benchmarks.robustness                          # every kind, 200 images each, seed 0
$ python -m benchmarks.robustness --n 50 --kinds photo,thick --save data/robustness
$ python -m benchmarks.robustness --n 6 --photo-size 384x288 --save tests/fixtures/robustness  # the tests' sample
$ python -m benchmarks.robustness --url http://localhost:8000   # the same images through HTTP /predict
$ python -m benchmarks.robustness --mnist                  # the 10,000 MNIST test digits as 28x28 PNGs
$ python -m benchmarks.robustness --optdigits              # scikit-learn's 8x8 UCI digits, upscaled to 64x64
$ taskset -c 0 python -m benchmarks.robustness --time   # preprocessing time of a 1 MP photo and a 28x28 PNG, one core
$ python -m benchmarks.robustness --strokes                # MNIST's stroke widths (contract.STROKE_RANGE)

Every image is made from an MNIST *test* digit (never seen in training) or a glyph of a font installed
on this machine (Debian's fonts-dejavu, fonts-liberation, fonts-freefont-ttf for typeset digits;
fonts-dkg-handwriting, fonts-breip, fonts-femkeklaver, fonts-humor-sans, fonts-comic-neue for
handwriting-like ones; missing fonts are skipped and the list used is in the result). Kinds:

  clean        black ink on a white 280x280 canvas, as drawn with a mouse
  inverted     white ink on black
  dark-theme   light ink on the dark theme's #333333 canvas (RGB)
  transparent  ink in the alpha channel of an RGBA PNG (the demo's drawing pad)
  thick        a marker: strokes 1.4-2x MNIST's width
  thin         a fine pen: strokes 0.3-0.5x MNIST's width
  off-centre   a small digit somewhere on an 800x600 canvas
  photo        a 1152x864 JPEG of ink on paper: uneven light, blur, sensor noise, dust, quality 40-85
  typeset      digits of typeset fonts (sans, serif with footed 1s, mono; bold, italic)
  handwriting  digits of handwriting fonts: not MNIST's writers
  lowres       a low-resolution scan, thumbnail or webcam crop: the digit at 8x8 or 16x16 upscaled to
               64-128 px (bilinear or bicubic), blurred (Gaussian), or cropped tight (ink touching the
               border); white on black or black on white, a third of them JPEG (quality 70-95)

Deterministic for a seed (numpy's PCG64; JPEG and font rendering by the installed Pillow/FreeType).
Writes benchmarks/results/robustness.json and .md (per-kind accuracy and every error). Not a test.
"""

import argparse
import io
import json
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from scipy import ndimage

from model import contract

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
MNIST_DIR = REPO / "data" / "mnist"
# -----------------------------------------------------------------------------------------------
N_PER_KIND = 200
PHOTO_SIZE = (864, 1152)  # (H, W): 1 megapixel
SEED = 0
MNIST_STROKE = 0.12  # pen width / the digit's longer side for MNIST-like strokes (contract.STROKE_RANGE: median 0.125)
TYPESET_FONTS = (
    "dejavu/DejaVuSans.ttf",
    "dejavu/DejaVuSans-Bold.ttf",
    "dejavu/DejaVuSerif.ttf",
    "dejavu/DejaVuSerif-Bold.ttf",
    "dejavu/DejaVuSansMono.ttf",
    "dejavu/DejaVuSans-Oblique.ttf",
    "dejavu/DejaVuSans-ExtraLight.ttf",
    "liberation/LiberationSerif-Regular.ttf",
    "liberation/LiberationSans-Regular.ttf",
    "liberation/LiberationMono-Regular.ttf",
    "freefont/FreeSerif.ttf",
    "freefont/FreeSansBold.ttf",
    "freefont/FreeSerifItalic.ttf",
)
HANDWRITING_FONTS = (
    "fifthhorseman/dkg.ttf",
    "fifthhorseman/dkgBd.ttf",
    "breip/Breip.ttf",
    "femkeklaver/femkeklaver.ttf",
    "humor-sans/Humor-Sans.ttf",
    "comic-neue/ComicNeue-Regular.otf",
    "comic-neue/ComicNeue-Bold.otf",
    "comic-neue/ComicNeue-Italic.otf",
)
FONT_ROOTS = (Path("/usr/share/fonts/truetype"), Path("/usr/share/fonts/opentype"))
LOWRES_GRIDS = (8, 16)  # the low-resolution digits' sides (px): optdigits' 8x8 (UCI), a 16x16 thumbnail
LOWRES_SIDE = (64, 129)  # the side (px) low-resolution digits are upscaled to, a range
OPTDIGITS_SIDE = 64  # --optdigits: the 8x8 images' side once upscaled (bicubic)
# -----------------------------------------------------------------------------------------------


class Sample(NamedTuple):
    name: str  # file name: <kind>-<index>-<label>.<ext>
    label: int
    data: bytes


def encode(image: Image.Image, fmt: str = "PNG", **args) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **args)
    return buffer.getvalue()


def u8(x: np.ndarray) -> np.ndarray:
    return np.round(np.clip(x, 0.0, 1.0) * 255).astype(np.uint8)


# --- drawing an MNIST digit large ---------------------------------------------------------------
def upscale(digit: np.ndarray, side: int) -> np.ndarray:
    """An MNIST digit (28x28 uint8) cropped to its ink and scaled so its longer side is `side` px,
    with crisp pen edges (the bicubic ramp steepened around half intensity), floats in [0, 1]."""
    rows, cols = np.flatnonzero(digit.any(1)), np.flatnonzero(digit.any(0))
    crop = Image.fromarray(digit[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1])
    scale = side / max(crop.size)
    size = (max(1, round(crop.width * scale)), max(1, round(crop.height * scale)))
    big = np.asarray(crop.resize(size, Image.Resampling.BICUBIC), np.float32) / 255
    return np.clip((big - 0.3) / 0.4, 0.0, 1.0)


def restroke(ink: np.ndarray, width: float) -> np.ndarray:
    """The same digit redrawn with a round pen `width` px wide along its medial axis (the ridge of
    the distance transform), anti-aliased."""
    mask = np.pad(ink > 0.5, 2)
    distance = ndimage.distance_transform_edt(mask)
    ridge = mask & (distance >= ndimage.maximum_filter(distance, size=3) - 0.75)  # 1-2 px wide, unbroken
    pen = ndimage.distance_transform_edt(~ridge) <= width / 2
    return ndimage.gaussian_filter(pen.astype(np.float32), 0.7)[2:-2, 2:-2]


def paste(ink: np.ndarray, size: tuple[int, int], rng: np.random.Generator, centred: bool = True) -> np.ndarray:
    """Ink placed on an empty (H, W) canvas, centred or anywhere it fits."""
    canvas = np.zeros(size, np.float32)
    h, w = ink.shape
    if centred:
        top, left = (size[0] - h) // 2, (size[1] - w) // 2
    else:
        top, left = rng.integers(0, size[0] - h + 1), rng.integers(0, size[1] - w + 1)
    canvas[top : top + h, left : left + w] = ink
    return canvas


def drawn(digit: np.ndarray, rng: np.random.Generator, canvas: int = 280) -> np.ndarray:
    """A digit drawn on a square canvas, its longer side 55-80% of the canvas's."""
    return paste(upscale(digit, int(canvas * rng.uniform(0.55, 0.8))), (canvas, canvas), rng)


def with_stroke(digit: np.ndarray, rng: np.random.Generator, factor: tuple[float, float]) -> np.ndarray:
    """A drawn digit whose stroke is `factor` (a range) times MNIST's width."""
    side = int(280 * rng.uniform(0.55, 0.8))
    ink = restroke(np.pad(upscale(digit, side), side // 4), MNIST_STROKE * side * rng.uniform(*factor))
    rows, cols = np.flatnonzero(ink.max(1) > 0.05), np.flatnonzero(ink.max(0) > 0.05)
    ink = ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    scale = min(1.0, 260 / max(ink.shape))
    if scale < 1.0:
        ink = np.asarray(
            Image.fromarray(ink).resize(
                (round(ink.shape[1] * scale), round(ink.shape[0] * scale)), Image.Resampling.BILINEAR
            )
        )
    return paste(ink, (280, 280), rng)


def photographed(ink: np.ndarray, rng: np.random.Generator) -> bytes:
    """Ink on paper as a phone sees it: grey tinted paper lit unevenly (a linear gradient and
    vignetting), dark grey ink, lens blur, sensor noise, a few dust specks, JPEG compression."""
    h, w = ink.shape
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (xs / w - 0.5) * np.cos(angle) + (ys / h - 0.5) * np.sin(angle)
    vignette = (xs / w - 0.5) ** 2 + (ys / h - 0.5) ** 2
    paper = rng.uniform(0.55, 0.85) + rng.uniform(0.1, 0.3) * ramp - rng.uniform(0.0, 0.3) * vignette
    specks = np.zeros_like(ink)
    for _ in range(rng.integers(0, 25)):
        y, x, r = rng.integers(0, h), rng.integers(0, w), rng.uniform(0.5, 3.0)
        specks[max(0, int(y - r)) : int(y + r) + 1, max(0, int(x - r)) : int(x + r) + 1] = rng.uniform(0.2, 0.7)
    darkness = np.maximum(ink, specks)
    grey = paper - darkness * (paper - rng.uniform(0.05, 0.3))
    grey = ndimage.gaussian_filter(grey, rng.uniform(0.8, 2.0))
    tint = 1.0 + rng.uniform(-0.06, 0.06, size=3)
    rgb = grey[..., None] * tint + rng.normal(0, rng.uniform(0.02, 0.06), size=(h, w, 3))
    return encode(Image.fromarray(u8(rgb), "RGB"), "JPEG", quality=int(rng.integers(40, 86)))


# --- the kinds ----------------------------------------------------------------------------------
def mnist_kind(make: Callable[[np.ndarray, np.random.Generator], tuple[bytes, str]]):
    """A kind made of MNIST test digits: make(digit, rng) -> (file bytes, extension)."""

    def kind(images: np.ndarray, labels: np.ndarray, n: int, rng: np.random.Generator) -> Iterator[tuple]:
        for index in rng.choice(len(images), size=n, replace=False):
            data, ext = make(images[index], rng)
            yield int(index), int(labels[index]), data, ext

    return kind


def _clean(d, rng):
    return encode(Image.fromarray(u8(1 - drawn(d, rng)))), "png"


def _inverted(d, rng):
    return encode(Image.fromarray(u8(drawn(d, rng)))), "png"


def _dark_theme(d, rng):
    ink = drawn(d, rng)
    return encode(Image.fromarray(u8(0.2 + 0.8 * ink)).convert("RGB")), "png"


def _transparent(d, rng):
    rgba = np.zeros((280, 280, 4), np.uint8)
    rgba[..., 3] = u8(drawn(d, rng))
    return encode(Image.fromarray(rgba, "RGBA")), "png"


def _thick(d, rng):
    return encode(Image.fromarray(u8(1 - with_stroke(d, rng, (1.4, 2.0))))), "png"


def _thin(d, rng):
    return encode(Image.fromarray(u8(1 - with_stroke(d, rng, (0.3, 0.5))))), "png"


def _off_centre(d, rng):
    ink = paste(upscale(d, int(rng.integers(30, 80))), (600, 800), rng, centred=False)
    return encode(Image.fromarray(u8(1 - ink))), "png"


def _photo(d, rng, size=PHOTO_SIZE):
    side = int(size[0] * rng.uniform(0.15, 0.5))
    ink = restroke(np.pad(upscale(d, side), 4), MNIST_STROKE * side * rng.uniform(0.4, 1.2))
    return photographed(paste(ink, size, rng, centred=False), rng), "jpg"


def tight(ink: np.ndarray) -> np.ndarray:
    """Ink cropped to its box: it touches all four borders."""
    rows, cols = np.flatnonzero(ink.max(1) > 0.05), np.flatnonzero(ink.max(0) > 0.05)
    return ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]


def square(ink: np.ndarray) -> np.ndarray:
    """Ink cropped to its box and padded to a square around it: it touches two borders."""
    ink = tight(ink)
    h, w = ink.shape
    side = max(h, w)
    return np.pad(ink, (((side - h) // 2, (side - h + 1) // 2), ((side - w) // 2, (side - w + 1) // 2)))


def resized(ink: np.ndarray, side: int, method: Image.Resampling) -> np.ndarray:
    """Ink resized with `method` so that its longer side is `side` px (aspect kept), clipped to [0, 1]."""
    scale = side / max(ink.shape)
    size = (max(1, round(ink.shape[1] * scale)), max(1, round(ink.shape[0] * scale)))
    return np.clip(np.asarray(Image.fromarray(ink).resize(size, method)), 0.0, 1.0)


def low_resolution(digit: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An MNIST digit as a low-resolution source shows it, upscaled to LOWRES_SIDE px (bilinear or
    bicubic): box-reduced to 8x8 or 16x16 first (as optdigits was made from 32x32 bitmaps); or
    Gaussian blurred (sigma 3-8% of the side); or cropped tight, ink touching every border."""
    ink = upscale(digit, 128)
    side = int(rng.integers(*LOWRES_SIDE))
    method = (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC)[rng.integers(2)]
    way = rng.integers(3)
    if way == 0:
        return resized(resized(square(ink), int(rng.choice(LOWRES_GRIDS)), Image.Resampling.BOX), side, method)
    if way == 1:
        blurred = resized(np.pad(square(ink), int(rng.integers(0, 32))), side, method)
        return ndimage.gaussian_filter(blurred, side * rng.uniform(0.03, 0.08))
    return resized(tight(ink), side, method)


def _lowres(d, rng):
    ink = low_resolution(d, rng)
    image = Image.fromarray(u8(ink if rng.integers(2) else 1 - ink))
    if rng.integers(3) == 0:
        return encode(image, "JPEG", quality=int(rng.integers(70, 96))), "jpg"
    return encode(image), "png"


def fonts(names: tuple[str, ...]) -> list[Path]:
    return [root / name for name in names for root in FONT_ROOTS if (root / name).exists()]


def glyph(font: Path, digit: int, rng: np.random.Generator) -> np.ndarray:
    """A digit typed in `font`, 120-220 px, turned up to ±8°, on a 400x400 canvas, ink in [0, 1]."""
    canvas = Image.new("L", (400, 400), 0)
    face = ImageFont.truetype(str(font), int(rng.integers(120, 221)))
    draw = ImageDraw.Draw(canvas)
    left, top, right, bottom = draw.textbbox((0, 0), str(digit), font=face)
    draw.text(((400 - (right - left)) / 2 - left, (400 - (bottom - top)) / 2 - top), str(digit), fill=255, font=face)
    canvas = canvas.rotate(rng.uniform(-8, 8), Image.Resampling.BICUBIC)
    return np.asarray(canvas, np.float32) / 255


def font_kind(names: tuple[str, ...]):
    def kind(images, labels, n, rng) -> Iterator[tuple]:
        found = fonts(names)
        if not found:
            return
        for i in range(n):
            font, digit = found[(i // 10) % len(found)], i % 10  # every digit of a font, then the next font
            yield i, digit, encode(Image.fromarray(u8(1 - glyph(font, digit, rng)))), "png"

    return kind


KINDS = {
    "clean": mnist_kind(_clean),
    "inverted": mnist_kind(_inverted),
    "dark-theme": mnist_kind(_dark_theme),
    "transparent": mnist_kind(_transparent),
    "thick": mnist_kind(_thick),
    "thin": mnist_kind(_thin),
    "off-centre": mnist_kind(_off_centre),
    "photo": mnist_kind(_photo),
    "typeset": font_kind(TYPESET_FONTS),
    "handwriting": font_kind(HANDWRITING_FONTS),
    "lowres": mnist_kind(_lowres),  # last: a kind's stream of the seed is its place here
}


def generate(
    kinds: list[str], n: int, seed: int, photo_size=PHOTO_SIZE, mnist_dir: Path = MNIST_DIR
) -> Iterator[tuple[str, Sample]]:
    """(kind, Sample) for every image of the suite, made from mnist_dir's test digits; each kind has its
    own stream of the seed. A smaller photo_size makes smaller photos of the same kind (the tests' committed
    sample)."""
    from training.data import load  # the benchmark may use torch; the serving path may not

    test = load(mnist_dir, val_size=0)["test"]
    images, labels = test.images.numpy(), test.labels.numpy()
    for _k, kind in enumerate(kinds):
        rng = np.random.default_rng([seed, list(KINDS).index(kind)])
        make = mnist_kind(partial(_photo, size=photo_size)) if kind == "photo" else KINDS[kind]
        for index, label, data, ext in make(images, labels, n, rng):
            yield kind, Sample(f"{kind}-{index:05d}-{label}.{ext}", label, data)


# --- reading them -------------------------------------------------------------------------------
class LocalReader:
    """app.imaging's preprocessing and the shipped graph in this process, one image at a time."""

    def __init__(self, model_dir: Path):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(model_dir / contract.CAPSNET_ONNX), options, providers=["CPUExecutionProvider"]
        )

    def __call__(self, data: bytes) -> int:
        from app import imaging

        x = imaging.preprocess(imaging.decode(data, contract.MAX_PIXELS), "digit").image
        (lengths,) = self.session.run([contract.LENGTHS], {contract.IMAGE: x[None, None]})
        return int(lengths[0].argmax())


class HttpReader:
    """POST /predict of a running service (include nothing but the answer)."""

    def __init__(self, url: str):
        import httpx

        self.http = httpx.Client(base_url=url, timeout=30.0)

    def __call__(self, data: bytes) -> int:
        response = self.http.post("/predict", params={"include": ""}, files={"file": ("digit", data)})
        return int(response.json()["prediction"]) if response.status_code == 200 else -1


def answer(read: Callable[[bytes], int], data: bytes) -> int:
    """The digit read, -1 for an image refused (the service's 4xx) or -2 for a crash (its 500)."""
    try:
        return read(data)
    except ValueError:  # app.imaging.ImageError
        return -1
    except Exception:  # a bug of the preprocessing
        return -2


def run(
    kinds: list[str],
    n: int,
    seed: int,
    read: Callable[[bytes], int],
    save: Path | None,
    photo_size=PHOTO_SIZE,
    mnist_dir: Path = MNIST_DIR,
) -> dict:
    per_kind: dict[str, dict] = {k: {"n": 0, "correct": 0, "errors": []} for k in kinds}
    for kind, sample in generate(kinds, n, seed, photo_size, mnist_dir):
        if save:
            (save / kind).mkdir(parents=True, exist_ok=True)
            (save / kind / sample.name).write_bytes(sample.data)
        predicted = answer(read, sample.data)
        row = per_kind[kind]
        row["n"] += 1
        row["correct"] += predicted == sample.label
        if predicted != sample.label:
            row["errors"].append([sample.name, predicted])
    for row in per_kind.values():
        row["accuracy"] = row["correct"] / row["n"] if row["n"] else None
    total = sum(r["n"] for r in per_kind.values())
    return {"kinds": per_kind, "overall": sum(r["correct"] for r in per_kind.values()) / total, "images": total}


def mnist_test(model_dir: Path) -> dict:
    """The 10,000 MNIST test digits sent as 28x28 PNGs with preprocess=mnist: the accuracy the
    preprocessing keeps of the card's (which is measured on the raw tensors)."""
    from training.data import read_idx

    images = read_idx(MNIST_DIR / "t10k-images-idx3-ubyte.gz")
    labels = read_idx(MNIST_DIR / "t10k-labels-idx1-ubyte.gz")
    read = LocalReader(model_dir)
    wrong = [i for i, (x, y) in enumerate(zip(images, labels, strict=True)) if read(encode(Image.fromarray(x))) != y]
    return {"n": len(images), "errors": len(wrong), "accuracy": 1 - len(wrong) / len(images), "misclassified": wrong}


def mnist_strokes(n: int = 2000) -> dict:
    """Stroke widths of the first n MNIST *training* digits as app.imaging measures them (fraction of
    the digit's longer side): the percentiles that model/contract.py's STROKE_RANGE holds."""
    from app.imaging.digit import NORM_BOX, at_norm_box, digit_ink, stroke_width
    from app.imaging.ink import locate, source
    from training.data import read_idx

    images = read_idx(MNIST_DIR / "train-images-idx3-ubyte.gz")[:n]
    widths = []
    for x in images:
        picture, light_ink = source(Image.fromarray(x))
        ink, side, _ = digit_ink(picture, *locate(picture, light_ink))
        widths.append(stroke_width(at_norm_box(ink, side)) / NORM_BOX)
    percents = (1, 2, 5, 10, 50, 90, 95, 98, 99)
    return {
        "n": n,
        **{f"p{q}": round(float(w), 3) for q, w in zip(percents, np.percentile(widths, percents), strict=True)},
    }


def timed(data: bytes, repeats: int) -> dict:
    """Milliseconds to decode, and then to preprocess, one image: median and 90th percentile of
    `repeats`, as wall time and as this process's CPU time (which other processes on a shared machine
    do not inflate)."""
    from app import imaging

    times: dict[str, list[float]] = {
        name: [] for name in ("decode_wall", "decode_cpu", "preprocess_wall", "preprocess_cpu")
    }
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        image = imaging.decode(data, contract.MAX_PIXELS)
        times["decode_wall"].append(time.perf_counter() - wall)
        times["decode_cpu"].append(time.process_time() - cpu)
        wall, cpu = time.perf_counter(), time.process_time()
        imaging.preprocess(image, "digit")
        times["preprocess_wall"].append(time.perf_counter() - wall)
        times["preprocess_cpu"].append(time.process_time() - cpu)
    opened = Image.open(io.BytesIO(data))
    return {
        "image": f"{opened.width}x{opened.height} {opened.format}, {len(data):,} bytes",
        **{
            f"{name}_ms_p{q}": round(1000 * float(np.percentile(t, q)), 2)
            for name, t in times.items()
            for q in (50, 90)
        },
    }


def preprocess_time(repeats: int = 200) -> dict:
    """timed() of the suite's first 1-megapixel photo and of MNIST's first test digit as a 28x28 PNG.
    Run it under `taskset -c 0` for one core."""
    from training.data import read_idx

    _, sample = next(generate(["photo"], 1, SEED))
    digit = encode(Image.fromarray(read_idx(MNIST_DIR / "t10k-images-idx3-ubyte.gz")[0]))
    return {"repeats": repeats, "photo": timed(sample.data, repeats), "mnist": timed(digit, repeats)}


def optdigits_set() -> tuple[np.ndarray, np.ndarray] | None:
    """scikit-learn's load_digits, the UCI optdigits test set: 1,797 handwritten digits, 8x8, grey
    levels 0-16 (images, labels); None when scikit-learn is not installed (it is no dependency)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        return None
    digits = load_digits()
    return digits.images, digits.target


def optdigits(read: Callable[[bytes], int], images: np.ndarray, labels: np.ndarray) -> dict:
    """The optdigits images, each upscaled to OPTDIGITS_SIDE px (bicubic) and sent as a white-on-black
    PNG: real handwriting at a low resolution."""
    wrong, refused = [], 0
    for i, (x, label) in enumerate(zip(images, labels, strict=True)):
        small = Image.fromarray(np.round(x * 255 / 16).astype(np.uint8))
        predicted = answer(read, encode(small.resize((OPTDIGITS_SIDE, OPTDIGITS_SIDE), Image.Resampling.BICUBIC)))
        refused += predicted == -1
        if predicted != label:
            wrong.append([i, predicted])
    return {
        "n": len(images),
        "side": OPTDIGITS_SIDE,
        "errors": len(wrong),
        "refused": refused,
        "accuracy": 1 - len(wrong) / len(images),
        "misread": wrong,
    }


def table(result: dict) -> str:
    lines = ["| kind | images | accuracy % |", "|---|---:|---:|"]
    lines += [f"| {k} | {r['n']} | {100 * r['accuracy']:.1f} |" for k, r in result["kinds"].items() if r["n"]]
    lines.append(f"| **all** | {result['images']} | **{100 * result['overall']:.1f}** |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.robustness", description=__doc__.splitlines()[0])
    p.add_argument("--kinds", default=",".join(KINDS), help="comma list of kinds")
    p.add_argument("--n", type=int, default=N_PER_KIND, help="images per kind")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--model-dir", type=Path, default=contract.SHIPPED["mnist"])
    p.add_argument("--mnist-dir", type=Path, default=MNIST_DIR, help="the MNIST IDX files the suite's digits come from")
    p.add_argument("--url", default=None, help="read through this service's /predict instead of in-process")
    p.add_argument("--save", type=Path, default=None, help="also write every image under this folder")
    p.add_argument("--photo-size", default="1152x864", help="WxH of the photos (the tests' sample: 384x288)")
    p.add_argument("--mnist", action="store_true", help="the MNIST test set as 28x28 PNGs instead")
    p.add_argument("--strokes", action="store_true", help="only measure MNIST's stroke widths (training digits)")
    p.add_argument(
        "--optdigits",
        action="store_true",
        help="scikit-learn's 8x8 digits upscaled instead (needs scikit-learn, not a dependency)",
    )
    p.add_argument("--time", action="store_true", help="only time the preprocessing of a 1 MP photo and a 28x28 PNG")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default benchmarks/results/robustness[_mnist|_optdigits|_time].json; --strokes prints only)",
    )
    args = p.parse_args(argv)
    started = time.perf_counter()
    if args.strokes:
        result = mnist_strokes()
    elif args.time:
        result = preprocess_time()
    elif args.mnist:
        result = mnist_test(args.model_dir)
        print(f"MNIST test through preprocess=mnist: {result['accuracy']:.4f} ({result['errors']} errors)")
    elif args.optdigits:
        found = optdigits_set()
        if found is None:
            print("--optdigits skipped: scikit-learn is not installed (pip install scikit-learn; it is no dependency)")
            return {}
        result = optdigits(HttpReader(args.url) if args.url else LocalReader(args.model_dir), *found)
        result.update(via=args.url or "in-process")
        print(
            f"optdigits ({result['n']} images at {OPTDIGITS_SIDE}x{OPTDIGITS_SIDE}): {result['accuracy']:.4f} "
            f"({result['errors']} errors, {result['refused']} refused)"
        )
    else:
        kinds = [k.strip() for k in args.kinds.split(",")]
        unknown = set(kinds) - set(KINDS)
        if unknown:
            p.error(f"unknown kinds {', '.join(sorted(unknown))}; choose from {', '.join(KINDS)}")
        read = HttpReader(args.url) if args.url else LocalReader(args.model_dir)
        width, height = (int(side) for side in args.photo_size.split("x"))
        result = run(kinds, args.n, args.seed, read, args.save, (height, width), mnist_dir=args.mnist_dir)
        result.update(
            seed=args.seed,
            n_per_kind=args.n,
            photo_size=args.photo_size,
            via=args.url or "in-process",
            typeset_fonts=[str(f) for f in fonts(TYPESET_FONTS)],
            handwriting_fonts=[str(f) for f in fonts(HANDWRITING_FONTS)],
        )
        print(table(result))
    if args.strokes or args.time:
        print(json.dumps(result))
    if args.strokes:
        return result
    from training.fit import cpu_model

    result.update(
        seconds=round(time.perf_counter() - started, 1), machine=cpu_model(), cpus=len(os.sched_getaffinity(0))
    )
    suffix = "_mnist" if args.mnist else "_optdigits" if args.optdigits else "_time" if args.time else ""
    out = args.out or RESULTS / f"robustness{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    if not (args.mnist or args.optdigits or args.time):
        out.with_suffix(".md").write_text(table(result) + "\n")
    return result


if __name__ == "__main__":
    main()
