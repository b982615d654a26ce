"""The demo's handlers against the real API on loopback: predict, perturb, the Fig. 4 grid, and the
states a person must see in words (empty canvas, API down, API starting, a refused file); then the
Two digits (multimnist) and Fashion (fashion-mnist) tabs."""
import base64
import copy
import io
import re
import subprocess
import sys
from pathlib import Path

import gradio as gr
import httpx
import numpy as np
import pytest
from PIL import Image, ImageDraw

from frontend import plots
from frontend.app import (
    BRUSH_RADIUS,
    CANVAS,
    DRAW_A_DIGIT,
    DRAW_TWO_DIGITS,
    EXAMPLES,
    FASHION_EXAMPLES,
    FASHION_TAB,
    OFFSETS,
    PAIR_EXAMPLES,
    DIGIT_TAB,
    DRAWING,
    PAIR_TAB,
    SHOW_A_GARMENT,
    UPLOAD,
    ApiClient,
    PairView,
    Screen,
    capsule_choices,
    fig4,
    fig4_tiles,
    Panel,
    follow_up,
    model_footer,
    perturb,
    predict_drawing,
    predict_example,
    predict_upload,
    routing_view,
    shown,
)
from frontend.pad import PNG_DATA_URL
from model.contract import CAPSULE_DIM, IMAGE_SIZE, MULTIMNIST_SIZE, NUM_CLASSES, PERTURB_LIMIT, STROKE_RANGE

REPO = Path(__file__).resolve().parents[2]


def pad_value(canvas: Image.Image) -> str:
    """What the drawing pad sends for its canvas: a PNG data URL (frontend.pad)."""
    buffer = io.BytesIO()
    canvas.save(buffer, format="PNG")
    return PNG_DATA_URL + base64.b64encode(buffer.getvalue()).decode()


def drawing(digit: np.ndarray, size: int = CANVAS) -> str:
    """What the pad hands the handler for a digit drawn in black on its canvas: a transparent RGBA
    canvas whose alpha is the ink (the 28x28 digit scaled up to the canvas)."""
    canvas = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    canvas.putalpha(Image.fromarray(digit, mode="L").resize((size, size), Image.Resampling.BILINEAR))
    return pad_value(canvas)


@pytest.fixture(scope="module")
def seven(api_url, mnist_fixture) -> tuple[list[list[float]], int]:
    """Capsules (10x16) and prediction of the first test image (a 7), via the drawing handler."""
    view = predict_drawing(ApiClient(api_url, timeout_s=30.0), drawing(mnist_fixture[0][0]))
    return view.capsules, view.digit


def test_drawing_a_fixture_digit_yields_its_label(client, mnist_fixture):
    # Needs the trained model: the first test digit of each class, drawn on the canvas.
    images, labels = mnist_fixture
    firsts = [int(np.flatnonzero(labels == d)[0]) for d in range(NUM_CLASSES)]
    predicted = [predict_drawing(client, drawing(images[i])).digit for i in firsts]
    wrong = [(int(labels[i]), p) for i, p in zip(firsts, predicted) if p != labels[i]]
    assert len(wrong) <= 1, f"(label, predicted) for the misread digits: {wrong}"


def test_prediction_view_has_every_panel(client, mnist_fixture):
    view = predict_drawing(client, drawing(mnist_fixture[0][0]))
    assert f"Prediction: **{view.digit}**" in view.status
    assert view.input.size == view.reconstruction.size == (224, 224)
    assert view.lengths.size[0] > 0 and routing_view(client, view.answer).size[0] > 0
    assert np.asarray(view.capsules).shape == (NUM_CLASSES, CAPSULE_DIM)
    assert "version" in view.footer and "CPUExecutionProvider" in view.footer
    assert view.answer["prediction"] == view.digit  # the answer kept for the routing maps is this one


def test_routing_maps_put_the_answer_first(client, mnist_fixture):
    """The maps follow the answer in a second step: the predicted class's tile first, drawn in its colour."""
    view = predict_drawing(client, drawing(mnist_fixture[0][0]))
    maps = np.asarray(routing_view(client, view.answer), dtype=np.int64)
    first_label = maps[14:40, 14:50]  # the first tile's caption: the predicted class, in the winner's colour
    assert (np.abs(first_label - np.array(plots.WINNER)).sum(axis=-1) < 60).any()
    assert routing_view(client, None) is None  # nothing answered: no maps


def test_an_answer_shows_only_for_what_is_on_screen():
    """Screen: the newest prediction of what is on screen shows; an older one, or one for the input
    no longer on screen, does not (the race between a stroke's answer and the Predict click's)."""
    screen = copy.deepcopy(Screen(DRAWING))  # as gr.State gives each session its own
    stroke = screen.start()  # the first stroke's prediction starts...
    click = screen.start(DRAWING)  # ...and the click's, for the whole drawing, after it
    assert screen.shows(click, DRAWING) and not screen.shows(stroke, DRAWING)
    late_drawing = screen.start()  # a drawing's answer still on its way...
    example = screen.start(UPLOAD)  # ...when an example is picked: the example is on screen
    assert screen.shows(example, UPLOAD) and not screen.shows(late_drawing, DRAWING)
    assert screen.switch(UPLOAD) is None  # the Upload tab selected by the page's script: nothing new
    assert screen.shows(screen.switch(DRAWING), DRAWING)  # back to the Draw tab: the drawing answers


def test_an_event_keys_its_view_by_component_and_drops_stale_ones():
    outputs = [gr.Markdown(), gr.Markdown()]
    screen = Screen(DRAWING)
    run = shown(lambda text: (text, text.upper()), outputs, DRAWING, switch=True)
    assert run(screen, "a") == {outputs[0]: "a", outputs[1]: "A"}

    def overtaken(text):  # a newer prediction starts while this one waits for the API
        screen.start(DRAWING)
        return text, text
    assert all(value == gr.skip() for value in shown(overtaken, outputs, DRAWING)(screen, "b").values())


def test_an_answer_on_screen_is_followed_up_once():
    """The routing maps and Fig. 4 follow the answer that showed, once; a dropped answer has none."""
    screen, outputs = Screen(DRAWING), [gr.Markdown()]
    assert not screen.follow()  # nothing shown yet
    shown(lambda text: (text,), outputs, DRAWING)(screen, "a")
    assert screen.follow() and not screen.follow()

    def overtaken(text):
        screen.start(DRAWING)
        return (text,)
    shown(overtaken, outputs, DRAWING)(screen, "b")  # dropped: the answer on screen is still "a"'s
    assert not screen.follow()


def test_the_follow_up_draws_the_maps_then_the_perturbed_capsule_then_fig4(client):
    """Of the answer on screen, from the session's state: its maps, its prediction's capsule perturbed by the
    sliders, its Fig. 4; a pair's first digit. Nothing more once followed up."""
    routing, panel = gr.Image(), Panel(gr.Radio(), [gr.Slider() for _ in range(CAPSULE_DIM)], gr.Image(), gr.Image())
    deltas = [0.0] * CAPSULE_DIM
    deltas[2] = 0.25
    for tab, example in ((DIGIT_TAB, EXAMPLES[7]), (PAIR_TAB, PAIR_EXAMPLES[0])):
        screen, answer = Screen(DRAWING), client.predict(example.read_bytes(), tab.model)
        digit = int(answer["objects"][0]["digit"]) if tab is PAIR_TAB else 7
        shown(lambda: (None,), [gr.Markdown()], DRAWING)(screen)  # an answer shows
        parts = list(follow_up(client, tab, routing, panel, screen, answer, *deltas))
        assert [list(part) for part in parts] == [[routing], [panel.perturbed], [panel.grid]]
        assert np.array_equal(np.asarray(parts[0][routing]), np.asarray(routing_view(client, answer, tab)))
        expected = perturb(client, answer["capsules"], digit, *deltas, model=tab.model)
        assert np.array_equal(np.asarray(parts[1][panel.perturbed]), np.asarray(expected))
        assert parts[2][panel.grid].size == fig4(client, answer["capsules"], digit, tab.model).size
        again = list(follow_up(client, tab, routing, panel, screen, answer, *deltas))
        assert again == [{routing: gr.skip()}]  # followed up already


def split(items: tuple, at: int) -> tuple[tuple, tuple]:
    return items[:at], items[at:]


def test_an_example_is_shown_in_the_upload_and_answered(client):
    """A click on an example: the Upload tab selected where the tab has a pad beside it, the example's
    file for the upload, then the view of that file."""
    for tab in (DIGIT_TAB, PAIR_TAB, FASHION_TAB):
        shown_in, view = split(predict_example(client, 3, tab), -len(tab.view._fields))
        *selected, path = shown_in
        status = view[0]
        assert [tabs.selected for tabs in selected] == ([f"{tab.prefix}upload-tab"] if tab.canvas else [])
        assert path == str(tab.examples[3]) and status == predict_upload(client, path, tab).status
    _, path, status, *_ = predict_example(client, 7)  # the Upload tab, the file, the view
    assert Path(path).name.startswith("7_") and status.startswith("## Prediction: **7**")


# Digits as a mouse draws them: polylines (x, y) on the 400 px canvas, 250 px tall.
STROKES = {
    1: [[(180, 110), (210, 80), (210, 330)]],
    4: [[(230, 80), (130, 250), (270, 250)], [(230, 80), (230, 330)]],
    7: [[(120, 80), (280, 80), (170, 330)]],
}


def brushed(lines: list[list[tuple[int, int]]], radius: int = BRUSH_RADIUS) -> str:
    """The pad's value for polylines drawn with the demo's round pen (black, into alpha)."""
    layer = Image.new("RGBA", (CANVAS, CANVAS), (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    for line in lines:
        draw.line(line, fill=(0, 0, 0, 255), width=2 * radius, joint="curve")
        for x, y in line:
            draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=(0, 0, 0, 255))
    return pad_value(layer)


def test_the_brush_draws_mnist_like_strokes():
    """A pen 2 x BRUSH_RADIUS wide on a digit 40% to 95% of the canvas tall is within MNIST's widths
    (as a fraction of the digit's side; the API's stroke_width adds about a pixel in 80, hence 1/80)."""
    for height in (0.4 * CANVAS, 0.95 * CANVAS):
        assert STROKE_RANGE[0] <= 2 * BRUSH_RADIUS / height + 1 / 80 <= STROKE_RANGE[1], height


@pytest.mark.parametrize("digit", sorted(STROKES))
def test_digits_drawn_with_the_brush_are_read(client, digit):
    view = predict_drawing(client, brushed(STROKES[digit]))
    assert view.digit == digit, view.status


def test_warnings_are_shown(client):
    """Two digits side by side: the API says it left a shape out, and the demo says so."""
    seven = STROKES[7][0]
    left = [(x // 3, y) for x, y in seven]  # x 40-93
    right = [(x // 3 + 280, y) for x, y in seven]  # x 320-373, farther than half the digit's height
    view = predict_drawing(client, brushed([left, right], radius=7))
    assert "⚠️" in view.status and "shape" in view.status, view.status
    assert "⚠️" not in predict_drawing(client, brushed(STROKES[1])).status


def test_examples_predict_through_the_upload_handler(client):
    assert len(EXAMPLES) == NUM_CLASSES
    view = predict_upload(client, str(EXAMPLES[0]))
    assert view.status.startswith("## Prediction") and view.capsules is not None


def test_slider_deltas_change_the_reconstruction(client, seven):
    capsules, digit = seven
    zero = [0.0] * CAPSULE_DIM
    moved = [PERTURB_LIMIT] + zero[1:]
    before, after = (np.asarray(perturb(client, capsules, digit, *deltas)) for deltas in (zero, moved))
    assert before.shape == (224, 224)
    assert np.abs(after.astype(int) - before).max() > 0
    np.testing.assert_array_equal(np.asarray(perturb(client, capsules, digit, *zero)), before)  # reset


def test_any_digit_capsule_can_be_decoded(client, seven):
    capsules, digit = seven
    other = (digit + 3) % NUM_CLASSES
    zero = [0.0] * CAPSULE_DIM
    assert perturb(client, capsules, other, *zero).size == (224, 224)


def test_fig4_grid_has_16_by_11_tiles(client, seven):
    capsules, digit = seven
    capsule = np.asarray(capsules, dtype=np.float32)[digit]
    tiles = fig4_tiles(client, capsule, digit)
    assert tiles.shape == (CAPSULE_DIM, len(OFFSETS), IMAGE_SIZE, IMAGE_SIZE) == (16, 11, 28, 28)
    unperturbed = client.reconstruct([digit], capsule[None])[0]
    middle = list(OFFSETS).index(0.0)
    np.testing.assert_allclose(tiles[:, middle], np.broadcast_to(unperturbed, tiles[:, middle].shape), atol=1e-5)
    assert np.abs(tiles[:, 0] - tiles[:, -1]).max() > 0  # the ends of each row differ
    assert fig4(client, capsules, digit).size == (52 + 11 * 58, 24 + 16 * 58)  # labels + 2x tiles + gaps


def test_empty_canvas_asks_for_a_digit(client):
    for empty in (None, ""):  # what the pad sends with nothing drawn, and an empty value
        view = predict_drawing(client, empty)
        assert view.status == DRAW_A_DIGIT and view.capsules is None
    blank = predict_drawing(client, pad_value(Image.new("RGBA", (CANVAS, CANVAS))))  # a PNG with no ink
    assert "⚠️" in blank.status and "blank" in blank.status and blank.capsules is None


@pytest.mark.parametrize("value", ["data:image/jpeg;base64,/9j/4AAQ", "data:image/png;base64,not base64!",
                                   "<img src=x onerror=alert(1)>"])
def test_a_drawing_that_is_not_a_png_data_url_is_refused_in_words(client, value):
    """The pad's event is public (Gradio's API page): a value it would never send gets a sentence."""
    view = predict_drawing(client, value)
    assert view.status == "⚠️ The drawing did not arrive as a PNG image; draw it again." and view.capsules is None


def test_refused_file_shows_the_apis_words(client, tmp_path):
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("this is not a picture")
    view = predict_upload(client, str(not_an_image))
    assert view.status.startswith("⚠️") and view.capsules is None
    assert "Traceback" not in view.status


def test_api_down_is_a_message_not_a_traceback(unused_url):
    nobody = ApiClient(unused_url, timeout_s=2.0)
    view = predict_upload(nobody, str(EXAMPLES[0]))
    assert "not reachable" in view.status and "python -m app" in view.status
    assert "not reachable" in model_footer(nobody)
    assert perturb(nobody, [[0.0] * CAPSULE_DIM] * NUM_CLASSES, 3, *[0.0] * CAPSULE_DIM) is None


def test_api_starting_up_is_a_message():
    warming = httpx.MockTransport(lambda request: httpx.Response(503, json={"detail": "warming up"}))
    view = predict_upload(ApiClient("http://api", 2.0, transport=warming), str(EXAMPLES[0]))
    assert "starting up" in view.status and view.capsules is None


def test_import_loads_neither_torch_nor_the_api():
    code = "import sys, frontend.app; print(sorted({'torch', 'app', 'training'} & {m.split('.')[0] for m in sys.modules}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


# ---- the Two digits tab (multimnist, 36x36) and the Fashion tab (fashion-mnist) --------------------------
PAIR_SIDE = MULTIMNIST_SIZE * plots.SCALE  # 288 px on screen


def named_digits(status: str) -> list[str]:
    """The digits a pair's status names in bold on its first line: '## Digits: **3** and **7**'."""
    return re.findall(r"\*\*(\d)\*\*", status.splitlines()[0])


@pytest.fixture(scope="module")
def pair(api_url) -> PairView:
    """The Two digits tab's view of the first generated pair example."""
    return predict_upload(ApiClient(api_url, timeout_s=30.0), str(PAIR_EXAMPLES[0]), PAIR_TAB)


@pytest.mark.parametrize("path", PAIR_EXAMPLES, ids=lambda p: p.name)
def test_pair_examples_name_both_digits(client, path):
    """A generated pair's file name starts with its two digits; the tab names both, in either order."""
    view = predict_upload(client, str(path), PAIR_TAB)
    assert sorted(named_digits(view.status)) == sorted(path.name[:2]), view.status


@pytest.mark.parametrize("first, second", [(1, 7), (1, 4), (4, 7)])
def test_two_digits_drawn_over_each_other_are_both_named(client, first, second):
    lines = [[(x - 30, y) for x, y in line] for line in STROKES[first]]
    lines += [[(x + 30, y) for x, y in line] for line in STROKES[second]]
    view = predict_drawing(client, brushed(lines), PAIR_TAB)
    assert sorted(named_digits(view.status)) == sorted(f"{first}{second}"), view.status


def test_pair_view_shows_the_input_the_overlay_and_each_digit(client, pair):
    assert pair.status.startswith("## Digits: ") and "(red)" in pair.status and "(green)" in pair.status
    assert pair.input.size == pair.overlay.size == pair.first.size == pair.second.size == (PAIR_SIDE, PAIR_SIDE)
    assert pair.overlay.mode == pair.first.mode == pair.second.mode == "RGB"
    red, green = (np.asarray(image, dtype=np.int64).sum(axis=(0, 1)) for image in (pair.first, pair.second))
    assert red[0] > red[1] and green[1] > green[0]  # the first digit drawn in red, the second in green
    assert np.asarray(pair.capsules).shape == (NUM_CLASSES, CAPSULE_DIM)
    assert pair.digit == int(named_digits(pair.status)[0])  # the red digit's capsule is the one to perturb
    assert pair.lengths.size[0] > 0 and routing_view(client, pair.answer, PAIR_TAB).size[0] > 0
    assert "multimnist" in pair.footer


def test_either_pair_capsule_can_be_perturbed(client, pair):
    zero = [0.0] * CAPSULE_DIM
    moved = [PERTURB_LIMIT] + zero[1:]
    for digit in map(int, named_digits(pair.status)):
        before, after = (np.asarray(perturb(client, pair.capsules, digit, *deltas, model=PAIR_TAB.model))
                         for deltas in (zero, moved))
        assert before.shape == (PAIR_SIDE, PAIR_SIDE)
        assert np.abs(after.astype(int) - before).max() > 0, digit


def test_fig4_tiles_of_a_pair_are_36_px(client, pair):
    capsule = np.asarray(pair.capsules, dtype=np.float32)[pair.digit]
    tiles = fig4_tiles(client, capsule, pair.digit, PAIR_TAB.model)
    assert tiles.shape == (CAPSULE_DIM, len(OFFSETS), MULTIMNIST_SIZE, MULTIMNIST_SIZE) == (16, 11, 36, 36)
    side = 2 * MULTIMNIST_SIZE + 2  # 2x tiles + gaps
    assert fig4(client, pair.capsules, pair.digit, PAIR_TAB.model).size == (52 + 11 * side, 24 + 16 * side)


def test_fashion_examples_are_named_by_their_class(client):
    """Each example's file name starts with its class index: at least 8 of the 10 are read as it."""
    names = client.classes(FASHION_TAB.model)
    assert len(FASHION_EXAMPLES) == NUM_CLASSES
    views = [predict_upload(client, str(path), FASHION_TAB) for path in FASHION_EXAMPLES]
    wrong = [(path.name, names[view.digit]) for path, view in zip(FASHION_EXAMPLES, views)
             if view.digit != int(path.name.split("_")[0])]
    assert len(wrong) <= 2, f"(example, predicted) for the misread garments: {wrong}"
    for view in views:
        assert view.status.startswith(f"## Prediction: **{names[view.digit]}**")


def test_fashion_view_has_every_panel(client):
    view = predict_upload(client, str(FASHION_EXAMPLES[0]), FASHION_TAB)
    assert view.input.size == view.reconstruction.size == (224, 224)
    assert view.lengths.size[0] > 0 and routing_view(client, view.answer, FASHION_TAB).size[0] > 0
    assert "runner-up " in view.status and "fashion-mnist" in view.footer
    zero = [0.0] * CAPSULE_DIM
    moved = [PERTURB_LIMIT] + zero[1:]
    before, after = (np.asarray(perturb(client, view.capsules, view.digit, *deltas, model=FASHION_TAB.model))
                     for deltas in (zero, moved))
    assert np.abs(after.astype(int) - before).max() > 0


def test_capsule_choices_are_named_by_the_models_classes(client, unused_url):
    radio = capsule_choices(client, FASHION_TAB.model)
    assert [name for name, _ in radio.choices] == client.classes(FASHION_TAB.model)
    assert [value for _, value in radio.choices] == list(range(NUM_CLASSES))
    assert [name for name, _ in capsule_choices(client, PAIR_TAB.model).choices] == list(plots.DIGITS)
    assert capsule_choices(ApiClient(unused_url, timeout_s=2.0), FASHION_TAB.model) == gr.skip()


def test_each_tab_asks_for_its_input(client):
    pair = predict_drawing(client, None, PAIR_TAB)
    assert isinstance(pair, PairView) and pair.status == DRAW_TWO_DIGITS and pair.capsules is None
    garment = predict_upload(client, None, FASHION_TAB)
    assert garment.status == SHOW_A_GARMENT and garment.capsules is None


def test_each_tabs_footer_names_its_model(client):
    for tab in (PAIR_TAB, FASHION_TAB):
        assert f"**{tab.model}**" in model_footer(client, tab.model)
