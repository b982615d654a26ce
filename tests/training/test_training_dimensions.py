"""What each capsule dimension does (training/dimensions.py): the measures on drawings whose answer is
known, the labels they give, and the shipped cards' sections against a recomputation on the fixture."""

import numpy as np
import pytest

from model import contract
from training import dimensions

S = contract.IMAGE_SIZE
YS, XS = np.mgrid[0:S, 0:S].astype(np.float64)


def ring(thickness: float, radius: float = 7.0, cx: float = 14.0, cy: float = 14.0) -> np.ndarray:
    """A 0 drawn with a pen `thickness` px wide, soft at its edges: (1, S, S)."""
    distance = np.abs(np.hypot(XS - cx, YS - cy) - radius)
    return np.clip(thickness / 2 + 0.5 - distance, 0, 1)[None]


def bar(shear: float = 0.0, length: float = 16.0) -> np.ndarray:
    """A vertical bar 3 px wide whose top is moved right by shear px per px of height: (1, S, S)."""
    centre = 14.0 + shear * (14.0 - YS)  # y grows downwards: the top (small y) goes right
    inside = (np.abs(XS - centre) <= 1.5) & (np.abs(YS - 14.0) <= length / 2)
    return inside.astype(np.float64)[None]


def blob(cx: float, cy: float = 14.0, sigma: float = 2.0) -> np.ndarray:
    return np.exp(-((XS - cx) ** 2 + (YS - cy) ** 2) / (2 * sigma**2))[None]


def test_a_thicker_pen_adds_ink_without_moving_or_slanting_the_digit():
    change = dimensions.changes(ring(2), ring(2), ring(4))
    assert change["ink"] > np.log(1.5)  # twice the pen: about twice the ink
    assert abs(change["width"]) < change["ink"] / 5 and abs(change["height"]) < change["ink"] / 5
    assert abs(change["x"]) < 1e-6 and abs(change["y"]) < 1e-6 and abs(change["slant"]) < 1e-6
    assert change["local"] < 0.1  # the change follows the whole stroke


@pytest.mark.parametrize("shear", [0.2, -0.3])
def test_a_sheared_bar_slants_its_way_by_the_shear_angle(shear):
    change = dimensions.changes(bar(), bar(), bar(shear))
    assert change["slant"] == pytest.approx(np.degrees(np.arctan(shear)), abs=2.0)
    assert dimensions.label_of("slant", change, "digit") == ("slants right" if shear > 0 else "slants left")
    assert abs(change["x"]) < 0.2 and abs(change["y"]) < 1e-6


def test_a_shifted_blob_moves_by_the_shift():
    change = dimensions.changes(blob(12.0), blob(12.0), blob(15.0))
    assert change["x"] == pytest.approx(3.0, abs=1e-3) and abs(change["y"]) < 1e-6
    assert abs(change["ink"]) < 1e-3 and abs(change["width"]) < 1e-3 and abs(change["slant"]) < 1e-6
    assert dimensions.label_of("x", change, "digit") == "moves right"
    assert dimensions.label_of("y", dimensions.changes(blob(14, 16), blob(14, 16), blob(14, 12)), "digit") == "moves up"


def test_a_change_in_one_corner_is_local_and_named_by_where_it_is():
    plus = ring(2).copy()
    plus[0, 2:6, 2:6] += 1.0  # ink added top left of the 0, nowhere else
    change = dimensions.changes(ring(2), ring(2), plus)
    assert change["local"] == pytest.approx(1.0, abs=1e-6)  # all of the change in one window
    assert change["local_x"] < -dimensions.WINDOW / 2 and change["local_y"] < -dimensions.WINDOW / 2
    assert dimensions.label_of("local", change, "digit") == "local: adds ink top left"
    ticked, moved = ring(2), ring(2)
    ticked[0, 4:6, 22:26], moved[0, 2:4, 22:26] = 1.0, 1.0  # a tick top right, moved up by 2 px
    assert (
        dimensions.label_of("local", dimensions.changes(ticked, ticked, moved), "digit") == "local: reshapes top right"
    )


def test_windows_are_the_sums_of_every_window():
    images = np.random.default_rng(0).random((2, 9, 11))
    sums = dimensions.windows(images, 4).reshape(2, 6, 8)
    assert sums[1, 2, 5] == pytest.approx(images[1, 2:6, 5:9].sum())
    assert sums[0, 5, 7] == pytest.approx(images[0, 5:9, 7:11].sum())


def test_the_dominant_effect_is_the_largest_score_whatever_its_unit():
    norm = dimensions.norms(
        [
            {**dict.fromkeys(dimensions.EFFECTS, 0.0), "ink": 0.5, "slant": 10.0, "local": 0.1},
            {**dict.fromkeys(dimensions.EFFECTS, 0.0), "ink": -0.5, "slant": -10.0, "x": 1.0, "local": -0.1},
        ]
    )
    measures = {**dict.fromkeys(dimensions.EFFECTS, 0.0), "ink": 0.25, "slant": -20.0, "change": 1.0}
    entry = dimensions.dominant(3, measures, norm, quiet_below=0.5, kind="digit")
    assert (entry.effect, entry.label) == ("slant", "slants left")  # 20° is 2 of slant's spread; 0.25 half of ink's
    assert entry.share == pytest.approx(4 / (4 + 0.25), abs=1e-3)  # the squared scores: slant 4, ink 0.25, others 0
    assert dimensions.dominant(3, {**measures, "change": 0.1}, norm, 0.5, "digit").label == dimensions.QUIET_LABEL
    assert dimensions.label_of("ink", measures, "garment") == "more ink"
