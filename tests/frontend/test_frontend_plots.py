"""The demo's charts can be read: the capsule lengths' numbers (none under the title, none crossed by a line),
the routing maps' scale, and every word beside a sweep (each dimension's label over its own chart, the legend
within its image)."""

import json

import numpy as np
import pytest

from frontend import plots
from model import contract
from model.contract import M_MINUS, M_PLUS, NUM_CLASSES


def coloured(image, colour, tolerance: int = 0) -> np.ndarray:
    """(H, W) mask of the pixels within `tolerance` (summed over RGB) of `colour` (0: the bars' and lines'
    solid fills, not text's anti-aliased edges)."""
    return np.abs(np.asarray(image, np.int32) - np.array(colour)).sum(axis=-1) <= tolerance


def bar_columns(mask: np.ndarray) -> list[np.ndarray]:
    """The columns of each bar, left to right, from a mask of the bars' colour (bars are runs of columns)."""
    columns = np.flatnonzero(mask.any(axis=0))
    return np.split(columns, np.flatnonzero(np.diff(columns) > 1) + 1)


def test_a_full_bar_has_its_length_written_below_the_title():
    chart = plots.lengths_chart(np.ones(NUM_CLASSES, np.float32), {0: plots.WINNER})
    winner = coloured(chart, plots.WINNER)
    (columns,) = bar_columns(winner)
    bar_top = np.flatnonzero(winner[:, columns].any(axis=1))[0]
    ink = coloured(chart, plots.INK, 120)[:bar_top, columns].any(axis=1)  # the title's and the length's rows
    rows = np.flatnonzero(ink)
    gaps = np.flatnonzero(np.diff(rows) > 1)
    assert len(gaps) == 1, "the title and the bar's length are two lines of text, apart"
    assert rows[0] > 0 and rows[gaps[0] + 1] > plots.TITLE_ROOM // 2  # neither cut by the image's top


@pytest.mark.parametrize("length", [M_MINUS / 2, M_MINUS, M_PLUS - 0.01])
def test_no_bars_length_is_written_on_a_margin_line(length):
    """Bars whose lengths would be written where a margin line runs (under m-, at m-, just under m+): each is
    written just above the line, clear of it (its dashes either side would read as a minus sign)."""
    chart = plots.lengths_chart(np.full(NUM_CLASSES, length, np.float32), {})
    line, bars = coloured(chart, plots.MARGIN), coloured(chart, plots.BAR)
    top = np.flatnonzero(bars.any(axis=1))[0]
    rows = np.flatnonzero(line[: top + 3].sum(axis=1) > 50)  # the dashed line nearest the bars' tops
    y = rows[rows >= rows[-1] - 2][0]  # its upper row (it is 2 px thick)
    text = coloured(chart, plots.INK, 120)
    for columns in bar_columns(bars):
        written = np.flatnonzero(text[y - 30 : top, columns[0] - 4 : columns[-1] + 5].any(axis=1)) + y - 30
        assert written.size, "each bar has its length written above it"
        assert y - 12 < written[-1] < y - 1, f"the length's lowest row {written[-1]}, the line's {y}"
    between = bar_columns(bars)[0][-1] + 3
    assert line[y : y + 2, between : between + 8].any()  # the line itself is there, between bars


def test_routing_maps_are_drawn_on_a_square_root_scale_up_to_top():
    maps = np.zeros((NUM_CLASSES, 6, 6), np.float32)
    maps[0, 0, 0], maps[0, 0, 1] = 1.0, 0.25
    gap, caption = plots.TILE_GAP, plots.TILE_CAPTION  # the first tile's first row of cells
    cell = 120 // 6  # routing_heatmaps' tile of 120 px

    def first_row(image) -> np.ndarray:
        pixels = np.asarray(image)
        return pixels[gap + caption + cell // 2, [gap + cell // 2, gap + cell + cell // 2]]

    order = list(range(NUM_CLASSES))
    lengths = np.zeros(NUM_CLASSES, np.float32)
    assert np.array_equal(first_row(plots.routing_heatmaps(maps, lengths, order, {})), plots.heat(np.array([1, 0.5])))
    dimmer = first_row(plots.routing_heatmaps(maps, lengths, order, {}, top=4.0))
    assert np.array_equal(dimmer, plots.heat(np.array([0.5, 0.25])))


def test_a_dimension_label_is_wrapped_at_its_commas_within_its_chart():
    fnt, width = plots.font(12), 150
    text = "dim 4: moves right, slants right, narrower"
    lines = plots.wrapped(text, fnt, width)
    assert lines == ["dim 4: moves right,", "slants right, narrower"]
    assert all(fnt.getlength(line) <= width for line in lines)
    long = "a " + "x" * 60 + " b"  # a word wider than the chart: alone on its line
    assert plots.wrapped(long, fnt, width) == ["a", "x" * 60, "b"]


def test_the_dimensions_charts_labels_stay_over_their_own_chart():
    """The longest labels of the shipped cards (two qualifiers) on every chart: the columns between the
    charts hold no pixel of a label or a line, and every label is written whole (two lines, each inside its
    chart)."""
    labels = [f"dim {d}: local: removes ink top, moves down, thinner stroke" for d in range(16)]
    capsules = np.sin(np.linspace(0, 3, 19))[:, None] * np.linspace(0.01, 0.3, 16)[None]
    (w, h), gap = (150, 70), 10
    image = np.asarray(plots.sweep_dimensions(np.linspace(-45, 45, 19), capsules, 3, labels, panel=(w, h)))
    for column in range(1, 4):  # the gap left of each chart but the first
        x = gap + column * (w + gap)
        assert (image[:, x - gap + 1 : x] == plots.PAPER).all(), f"a label or a line crosses into chart {column}'s"
    fnt = plots.caption_font(labels, w, largest=12, smallest=10)
    assert fnt.size >= 10 and len(plots.wrapped(labels[0], fnt, w)) == 2


def test_the_sweep_legend_names_every_class_whole():
    """The legend beside the lengths along a sweep: a model's name and its longest class names (Fashion-MNIST's)
    wrap within the image; nothing is cut at its right edge."""
    card = json.loads((contract.SHIPPED["fashion-mnist"] / contract.MODEL_CARD).read_text())
    classes = card["serving"]["classes"]
    values = np.linspace(-30, 30, 13)
    lengths = np.full((13, 10), 0.05, np.float32)
    for j, name in enumerate(classes):
        series = [("fashion-mnist", lengths, plots.WINNER), ("affine", lengths, plots.PAIR_COLOURS[1])]
        chart = np.asarray(plots.sweep_lengths(values, series, j, 6, classes))
        assert (chart[:, -4:] == plots.PAPER).all(), f"the legend of {name!r} runs off the chart"
