"""What each capsule dimension does (training/dimensions.py): the measures on drawings whose answer is
known, the labels they give, and the shipped cards' sections against a recomputation on the fixture."""

import json

import numpy as np
import pytest

from model import contract
from model.card import read_dimensions
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


def test_a_label_two_dimensions_share_is_followed_by_each_ones_next_effect():
    """Sliders that would say the same words say how they differ, by effects of at least QUALIFIER_SCORE; a
    label no other dimension has, dimensions that differ by traces alone, and little change stay as they are."""
    norm = {k: dimensions.Norm(centre=0.0, spread=1.0) for k in dimensions.EFFECTS}
    zero = {**dict.fromkeys(dimensions.EFFECTS, 0.0), "local_ink": 0.0, "local_x": 0.0, "local_y": 0.0, "change": 1.0}
    measured = [
        {**zero, "height": 2.0, "ink": 1.0, "slant": -0.5},  # taller, then thicker
        {**zero, "height": 3.0, "ink": 0.2, "slant": -1.5},  # taller, then slants left
        {**zero, "height": 1.0, "local": 0.8, "local_ink": 0.6, "local_y": -6.0},  # taller, then a part: no "local: "
        {**zero, "x": -1.0},  # moves left: alone
        {**zero, "change": 0.0},  # little change
        {**zero, "change": 0.0, "y": 1.0},  # little change too
        {**zero, "y": 3.0, "slant": -2.0, "width": -1.0},  # moves down, slants left, then narrower
        {**zero, "y": 2.0, "slant": -1.5, "ink": -1.0},  # moves down, slants left, then thinner
        {**zero, "x": 2.0, "ink": 0.4},  # moves right, and a trace thicker: no more than that
        {**zero, "x": 1.5, "ink": -0.4, "slant": 0.3},  # moves right, and traces
        {**zero, "width": 2.0, "height": 1.0, "ink": 0.2},  # wider, taller, then a trace: it stops there
        {**zero, "width": 1.5, "height": 0.8, "ink": -0.3},  # wider, taller, the same
    ]
    entries = [dimensions.dominant(d, m, norm, quiet_below=0.5, kind="digit") for d, m in enumerate(measured)]
    labels = [e.label for e in dimensions.distinct(entries, norm, "digit")]
    assert labels == [
        "taller, thicker stroke",
        "taller, slants left",
        "taller, adds ink top",
        "moves left",
        dimensions.QUIET_LABEL,
        dimensions.QUIET_LABEL,
        "moves down, slants left, narrower",
        "moves down, slants left, thinner stroke",
        "moves right",
        "moves right",
        "wider, taller",
        "wider, taller",
    ]
    assert [e.effect for e in dimensions.distinct(entries, norm, "digit")] == [e.effect for e in entries]


# --- the shipped cards ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cards() -> dict[str, dict]:
    return {name: json.loads((d / contract.MODEL_CARD).read_text()) for name, d in contract.SHIPPED.items()}


@pytest.mark.parametrize("name", list(contract.SHIPPED))
def test_every_shipped_card_labels_every_dimension_of_every_class(cards, name):
    """The section is complete, and each label is what its own measures and norms give (dominant, distinct)."""
    card = cards[name]
    dims = read_dimensions(card)
    assert dims is not None and list(dims.classes) == card[contract.SERVING]["classes"]
    assert dims.perturbation == (-contract.PERTURB_LIMIT, contract.PERTURB_LIMIT)
    assert set(dims.examples_per_class.values()) == {dimensions.EXAMPLES}
    kind = card[contract.SERVING]["preprocessing"]["kind"]
    for entries in dims.classes.values():
        assert [e.dim for e in entries] == list(range(contract.CAPSULE_DIM))
    assert dims == dimensions.labelled(dims, kind)


def test_docs_and_readme_say_what_the_cards_say():
    assert dimensions.main(["--check"]) == 0


def first_read_right(mnist_fixture, digit: int) -> np.ndarray:
    """The MNIST model's capsules of the first EXAMPLES fixture images of `digit` it reads right: the
    card's own examples where the fixture (the first 1,000 test images) holds that many."""
    images, labels = mnist_fixture
    mine = labels == digit
    capsnet = dimensions.session(contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX)
    found = dimensions.read_right(capsnet, images[mine], labels[mine, None], dimensions.EXAMPLES)[digit]
    assert len(found) == dimensions.EXAMPLES  # 126 ones and 107 threes among the first 1,000
    return found


@pytest.mark.parametrize("digit", [1, 3])
def test_the_mnist_cards_thickness_and_local_dimensions_recompute_from_the_fixture(cards, mnist_fixture, digit):
    """The fixture holds the card's very examples of 1 and 3, so the same graphs give the same measures:
    up to the card's 4 decimals, and to graphs re-exported with the same weights (outputs within
    graphs.PARITY_TOL): a tolerance of 1e-3, where the measures' spreads are 0.06 to 20."""
    section = read_dimensions(cards["mnist"])
    assert section is not None
    entries = [e for e in section.classes[str(digit)] if e.effect in ("ink", "local")]
    assert entries, f"the card names no thickness or local dimension of {digit}"
    decoder = dimensions.session(contract.SHIPPED["mnist"] / contract.DECODER_ONNX)
    again = dimensions.class_changes(decoder, first_read_right(mnist_fixture, digit), digit, [e.dim for e in entries])
    for e, measures in zip(entries, again, strict=True):
        for k, v in e.measures.items():
            assert measures[k] == pytest.approx(v, abs=1e-3), (digit, e.dim, k)


def test_the_threes_thickness_dimensions_change_the_ink_of_nearly_every_drawing(cards, mnist_fixture):
    """Not only on average: a dimension labelled thicker (thinner) stroke gives at least 95 of the 100
    drawings more (less) ink at +0.25 than at -0.25."""
    section = read_dimensions(cards["mnist"])
    assert section is not None
    entries = [e for e in section.classes["3"] if e.effect == "ink"]
    said = {e.dim: e.label.split(", ")[0] for e in entries}  # the dominant effect's words, before any next one
    assert set(said.values()) <= set(dimensions.LABELS["ink"]) and entries
    capsules = first_read_right(mnist_fixture, 3)
    decoder = dimensions.session(contract.SHIPPED["mnist"] / contract.DECODER_ONNX)
    for e in entries:
        batch = np.zeros((2, len(capsules), contract.NUM_CLASSES, contract.CAPSULE_DIM), np.float32)
        batch[:, :, 3] = capsules
        batch[:, :, 3, e.dim] += np.array([-1, 1])[:, None] * contract.PERTURB_LIMIT
        (drawings,) = decoder.run(None, {contract.CAPSULES: batch.reshape(-1, *batch.shape[2:])})
        minus, plus = drawings.reshape(2, len(capsules), -1).sum(-1)
        thicker = said[e.dim] == dimensions.LABELS["ink"][0]
        assert ((plus > minus) == thicker).sum() >= 95, (e.dim, e.label)
