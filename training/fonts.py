"""Digits typeset in fonts Debian ships, drawn as MNIST's digits look: a training-only supplement.

MNIST's writers never made a serif 1 with a flag and a foot, a 6 of a typeface or a digit drawn as its
outline, and no preprocessing turns those into MNIST's shapes; training on them can. Each digit is
typed in one of FONTS, thickened or drawn as its outline, slanted and turned, then made the way
LeCun made MNIST (http://yann.lecun.com/exdb/mnist/): its ink box fitted into 20x20 keeping its aspect,
anti-aliased, its centre of mass at (14, 14) of 28x28, white on black (mnist_frame: the service's own
step, app.imaging.digit.fit_and_centre, made with Pillow).

FONTS are for training only and held apart from the robustness suite's (benchmarks/robustness.py
TYPESET_FONTS and HANDWRITING_FONTS), so that the suite still measures fonts the model never saw:
no file of the suite's packages (fonts-dejavu, fonts-liberation, fonts-freefont-ttf,
fonts-dkg-handwriting, fonts-breip, fonts-femkeklaver, fonts-humor-sans, fonts-comic-neue), nor
the designs those are made from: URW's Nimbus Roman and Nimbus Sans (FreeSerif and FreeSans are
derived from them), Croscore's Arimo, Tinos and Cousine (Liberation 2's sources) and Hack (DejaVu
Sans Mono's) are left out. Install them with

    apt-get install fonts-urw-base35 fonts-crosextra-carlito fonts-crosextra-caladea fonts-open-sans \
        fonts-lato fonts-cantarell fonts-linuxlibertine fonts-ebgaramond fonts-noto-core fonts-paratype \
        fonts-gfs-neohellenic fonts-quicksand fonts-inconsolata fonts-firacode fonts-jetbrains-mono \
        fonts-bwht fonts-dancingscript fonts-kristi fonts-klee

Missing fonts are skipped (available()). Deterministic for a seed (numpy's PCG64; glyphs as the
installed Pillow/FreeType draw them).
"""

from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from model import contract

FONT_ROOTS = (Path("/usr/share/fonts/truetype"), Path("/usr/share/fonts/opentype"))  # Debian's
FONTS = (
    # serif: flagged and footed 1s, old-style figures, bold and italic
    "urw-base35/C059-Roman.otf",
    "urw-base35/C059-Bold.otf",
    "urw-base35/C059-Italic.otf",
    "urw-base35/C059-BdIta.otf",
    "urw-base35/P052-Roman.otf",
    "urw-base35/P052-Bold.otf",
    "urw-base35/P052-Italic.otf",
    "urw-base35/URWBookman-Light.otf",
    "urw-base35/URWBookman-Demi.otf",
    "urw-base35/URWBookman-LightItalic.otf",
    "crosextra/Caladea-Regular.ttf",
    "crosextra/Caladea-Bold.ttf",
    "crosextra/Caladea-Italic.ttf",
    "linux-libertine/LinLibertine_R.otf",
    "linux-libertine/LinLibertine_RB.otf",
    "linux-libertine/LinLibertine_RI.otf",
    "ebgaramond/EBGaramond12-Regular.otf",
    "noto/NotoSerif-Regular.ttf",
    "noto/NotoSerif-Bold.ttf",
    "noto/NotoSerif-Italic.ttf",
    "paratype/PTF55F.ttf",
    "paratype/PTF75F.ttf",
    "paratype/PTF56F.ttf",
    "neohellenic/GFSNeohellenic.otf",
    # sans: hairline to black
    "noto/NotoSans-Regular.ttf",
    "noto/NotoSans-Bold.ttf",
    "noto/NotoSans-Italic.ttf",
    "open-sans/OpenSans-Light.ttf",
    "open-sans/OpenSans-Regular.ttf",
    "open-sans/OpenSans-ExtraBold.ttf",
    "open-sans/OpenSans-Italic.ttf",
    "lato/Lato-Hairline.ttf",
    "lato/Lato-Light.ttf",
    "lato/Lato-Regular.ttf",
    "lato/Lato-Black.ttf",
    "lato/Lato-Italic.ttf",
    "crosextra/Carlito-Regular.ttf",
    "crosextra/Carlito-Bold.ttf",
    "cantarell/Cantarell-Thin.otf",
    "cantarell/Cantarell-Regular.otf",
    "cantarell/Cantarell-ExtraBold.otf",
    "quicksand/Quicksand-Light.ttf",
    "quicksand/Quicksand-Bold.ttf",
    "urw-base35/URWGothic-Book.otf",
    "urw-base35/URWGothic-Demi.otf",
    "linux-libertine/LinBiolinum_R.otf",
    "linux-libertine/LinBiolinum_RB.otf",
    "paratype/PTS55F.ttf",
    "paratype/PTS75F.ttf",
    "paratype/PTS56F.ttf",
    "paratype/PTN57F.ttf",
    # monospaced: footed 1s, slashed and dotted 0s
    "urw-base35/NimbusMonoPS-Regular.otf",
    "urw-base35/NimbusMonoPS-Bold.otf",
    "inconsolata/Inconsolata.otf",
    "firacode/FiraCode-Light.ttf",
    "firacode/FiraCode-Bold.ttf",
    "jetbrains-mono/JetBrainsMono-Thin.ttf",
    "jetbrains-mono/JetBrainsMono-Regular.ttf",
    "jetbrains-mono/JetBrainsMono-ExtraBold.ttf",
    "jetbrains-mono/JetBrainsMono-Italic.ttf",
    "paratype/PTM55F.ttf",
    # handwriting and script
    "bwht/BecauseWeBuild-Regular.otf",
    "bwht/BecauseWeConnect-Regular.otf",
    "bwht/BecauseWeCreate-Regular.otf",
    "bwht/BecauseWeLearn-Regular.otf",
    "bwht/BecauseWeMentor-Regular.otf",
    "bwht/BecauseWeOrganize-Regular.otf",
    "dancingscript/DancingScript-Regular.otf",
    "dancingscript/DancingScript-Bold.otf",
    "kristi/Kristi.ttf",
    "klee/KleeOne-Regular.ttf",
    "klee/KleeOne-SemiBold.ttf",
    "urw-base35/Z003-MediumItalic.otf",
)
# -----------------------------------------------------------------------------------------------
EM = 112  # px: the type size drawn; a digit's ~80 px ink box shrinks ~4x into the 20 px box (anti-aliased)
ROTATION = 8.0  # degrees either way, as a page or a photo is turned
SLANT = (-0.1, 0.3)  # horizontal shear (x += slant * height above the centre): mostly rightward, as writing leans
OUTLINE = 0.25  # share of digits drawn as their outline (hollow strokes), as an outline font draws them
OUTLINE_WIDTH = (0.025, 0.07)  # the outline's width, fraction of EM (~0.6-1.7 px once at 20 px)
BOLDER = 0.3  # share of filled digits thickened by a stroke around the glyph
BOLDER_WIDTH = (0.01, 0.04)  # that stroke's width, fraction of EM
# -----------------------------------------------------------------------------------------------


def available(names: tuple[str, ...] = FONTS) -> list[Path]:
    """The installed files of names (paths under FONT_ROOTS), in the order of names."""
    return [root / name for name in names for root in FONT_ROOTS if (root / name).exists()]


@cache
def face(path: Path) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(str(path), EM)


def glyph(path: Path, digit: int, outline: int, bolder: int, slant: float, angle: float) -> np.ndarray:
    """A digit typed in a font on a black canvas, ink in [0, 1] (H, W).

    Args:
        outline: px width of the outline when the digit is drawn hollow (0: filled). Pillow strokes the
            glyph's edge in ink and then fills the glyph itself in black, leaving the outline.
        bolder: px of ink stroked around a filled glyph (0: as the font draws it).
        slant: horizontal shear, x += slant * (the canvas's centre row - y).
        angle: degrees, anticlockwise.
    """
    canvas = Image.new("L", (3 * EM, 3 * EM), 0)
    draw = ImageDraw.Draw(canvas)
    width = outline or bolder
    left, top, right, bottom = draw.textbbox((0, 0), str(digit), font=face(path), stroke_width=width)
    origin = ((canvas.width - (right - left)) / 2 - left, (canvas.height - (bottom - top)) / 2 - top)
    draw.text(origin, str(digit), fill=0 if outline else 255, font=face(path), stroke_width=width, stroke_fill=255)
    centre = canvas.height / 2
    canvas = canvas.transform(
        canvas.size, Image.Transform.AFFINE, (1, slant, -slant * centre, 0, 1, 0), Image.Resampling.BICUBIC
    )
    canvas = canvas.rotate(angle, Image.Resampling.BICUBIC)
    return np.asarray(canvas, np.float32) / 255


def mnist_frame(ink: np.ndarray) -> np.ndarray:
    """Ink (H, W) in [0, 1] -> (28, 28) as LeCun made MNIST's digits: cropped to its ink, fitted into the
    INK_BOX x INK_BOX box keeping its aspect (anti-aliased, Lanczos), brought to full intensity, its
    centre of mass at the frame's centre (14, 14). What the service does to a drawn digit
    (app/imaging/digit.py), made here with Pillow so that training needs nothing of the service."""
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    ink = ink[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    scale = contract.INK_BOX / max(ink.shape)
    height, width = (max(1, round(side * scale)) for side in ink.shape)
    small = np.asarray(Image.fromarray(ink, "F").resize((width, height), Image.Resampling.LANCZOS)).clip(0, None)
    small = np.clip(small / small.max(), 0.0, 1.0)
    ys, xs = np.indices(small.shape)
    size, mass = contract.IMAGE_SIZE, small.sum()
    top = min(max(int(np.floor(size // 2 - (ys * small).sum() / mass + 0.5)), 0), size - height)
    left = min(max(int(np.floor(size // 2 - (xs * small).sum() / mass + 0.5)), 0), size - width)
    frame = np.zeros((size, size), np.float32)
    frame[top : top + height, left : left + width] = small
    return frame


def render(n: int, seed: int = 0, fonts: list[Path] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """n digits as MNIST's look: uint8 images (n, 28, 28), white on black, and their labels (n,) int64.

    Classes are balanced (label i % 10) and the fonts taken in turn (every digit of a font, then the
    next); each digit gets its own outline or thickening, slant and turn from the seed's stream.

    Args:
        fonts: font files (default: available(), the training fonts installed here).
    """
    fonts = available() if fonts is None else fonts
    if not fonts:
        raise FileNotFoundError(
            f"none of the training fonts is installed under {', '.join(map(str, FONT_ROOTS))}; "
            "see training/fonts.py for the packages"
        )
    rng = np.random.default_rng(seed)
    images = np.zeros((n, contract.IMAGE_SIZE, contract.IMAGE_SIZE), np.uint8)
    labels = np.arange(n, dtype=np.int64) % 10
    for i, digit in enumerate(labels):
        hollow = rng.random() < OUTLINE
        outline = round(EM * rng.uniform(*OUTLINE_WIDTH)) if hollow else 0
        bolder = round(EM * rng.uniform(*BOLDER_WIDTH)) if not hollow and rng.random() < BOLDER else 0
        ink = glyph(
            fonts[(i // 10) % len(fonts)],
            int(digit),
            outline,
            bolder,
            rng.uniform(*SLANT),
            rng.uniform(-ROTATION, ROTATION),
        )
        images[i] = np.round(mnist_frame(ink) * 255)
    return images, labels
