"""training/fonts.py: training-only fonts held apart from the robustness suite's, and digits drawn as
MNIST's look (every class, 20 px ink box, centre of mass at the centre), the same for a seed."""

from pathlib import Path

import matplotlib
import numpy as np
import pytest

from app.imaging.digit import fit_and_centre
from benchmarks.robustness import HANDWRITING_FONTS, TYPESET_FONTS
from training import fonts

# Designs the suite's fonts are made from: FreeSerif and FreeSans (URW's Nimbus Roman and Nimbus Sans),
# Liberation 2 (Croscore's Arimo, Tinos, Cousine), DejaVu Sans Mono (Hack is made from it).
SUITE_DESIGNS = ("urw-base35/NimbusRoman", "urw-base35/NimbusSans", "croscore/", "hack/")


def test_training_fonts_are_not_the_suites():
    suite = set(TYPESET_FONTS) | set(HANDWRITING_FONTS)
    assert not set(fonts.FONTS) & suite
    assert not {name.split("/")[0] for name in fonts.FONTS} & {name.split("/")[0] for name in suite}
    assert not [name for name in fonts.FONTS if name.startswith(SUITE_DESIGNS)]
    assert len(set(fonts.FONTS)) == len(fonts.FONTS)


@pytest.fixture(scope="module")
def font_files() -> list[Path]:
    """A few training fonts, or where none is installed matplotlib's own DejaVu Sans (for the drawing only)."""
    return fonts.available()[:3] or [Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"]


def test_render_draws_every_class_as_mnist_digits_look(font_files):
    images, labels = fonts.render(30, seed=0, fonts=font_files)
    assert images.shape == (30, 28, 28) and images.dtype == np.uint8
    assert labels.tolist() == list(range(10)) * 3
    ys, xs = np.indices((28, 28))
    for x in images.astype(np.float64):
        rows, cols = np.flatnonzero(x.any(1)), np.flatnonzero(x.any(0))
        assert max(rows[-1] - rows[0], cols[-1] - cols[0]) + 1 in (20, 21)  # the ink box (and Lanczos' fringe)
        assert x.max() == 255 and x[0].max() == x[-1].max() == x[:, 0].max() == x[:, -1].max() == 0
        assert abs((ys * x).sum() / x.sum() - 14) <= 1 and abs((xs * x).sum() / x.sum() - 14) <= 1


def test_mnist_frame_is_the_services_step(font_files):
    """Training frames a font digit as the service frames a drawn one (app.imaging.digit.fit_and_centre),
    without importing the service: the same Lanczos weights, up to float32 rounding."""
    for digit, slant, angle in ((1, 0.0, 0.0), (4, 0.2, -10.0), (8, -0.1, 15.0)):
        ink = fonts.glyph(font_files[0], digit, outline=0, bolder=0, slant=slant, angle=angle)
        np.testing.assert_allclose(fonts.mnist_frame(ink), fit_and_centre(ink), rtol=0, atol=1e-4)


def test_render_is_the_same_for_a_seed(font_files):
    first, second = fonts.render(10, seed=1, fonts=font_files)[0], fonts.render(10, seed=1, fonts=font_files)[0]
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, fonts.render(10, seed=2, fonts=font_files)[0])


def test_outline_is_hollow(font_files):
    filled = fonts.glyph(font_files[0], 0, outline=0, bolder=0, slant=0.0, angle=0.0)
    hollow = fonts.glyph(font_files[0], 0, outline=4, bolder=0, slant=0.0, angle=0.0)
    inside = filled > 0.99  # the glyph's own strokes: black inside the outline
    assert hollow[inside].mean() < 0.1 and hollow.sum() > 0


def test_no_font_is_an_error_that_says_what_to_install():
    with pytest.raises(FileNotFoundError, match=r"training/fonts\.py"):
        fonts.render(10, fonts=[])
