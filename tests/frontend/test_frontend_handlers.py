"""The demo's handlers against the real API on loopback: the tabs built from GET /models, predict, perturb,
the Fig. 4 grid, and the states a person must see in words (empty canvas, API down, API starting, a refused
file); then the Two digits (multimnist), Fashion (fashion-mnist) and affine tabs."""

import base64
import copy
import gc
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

from frontend import layout, plots
from frontend.app import build_demo
from frontend.client import ApiClient, ApiUnreachable, served_models
from frontend.handlers import (
    NO_FILE,
    OFFSETS,
    SENT_SIDE,
    answer_example,
    answer_tab,
    answer_upload,
    fig4,
    fig4_tiles,
    follow_up,
    model_footer,
    perturb,
    predict_drawing,
    predict_upload,
    routing_view,
    slider_labels,
)
from frontend.layout import CANVAS, PEN, PENS, TabUI
from frontend.pad import PNG_DATA_URL
from frontend.screen import ANSWER, DRAWING, UPLOAD, Screen, gated
from frontend.sweeps import DEFAULT
from frontend.tabs import (
    DRAW_A_DIGIT,
    DRAW_TWO_DIGITS,
    EXAMPLES,
    FASHION_EXAMPLES,
    LOOKS,
    PAIR_EXAMPLES,
    SHOW_A_GARMENT,
    Tab,
    tabs_from,
)
from frontend.views import PairView, PredictView
from model.contract import (
    AFFINE_SIZE,
    CAPSULE_DIM,
    IMAGE_SIZE,
    MULTIMNIST_SIZE,
    NUM_CLASSES,
    PERTURB_LIMIT,
    STROKE_RANGE,
)
from tests.conftest import serving
from tests.frontend.conftest import start_demo
from tests.harness import TRANSPARENT_SEVEN

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tabs(api_url) -> dict[str, Tab]:
    """The demo's tabs as it builds them from the API's GET /models, by model."""
    return {tab.model: tab for tab in tabs_from(ApiClient(api_url, timeout_s=30.0).models())}


@pytest.fixture(scope="module")
def digit_tab(tabs) -> Tab:
    return tabs["mnist"]


@pytest.fixture(scope="module")
def pair_tab(tabs) -> Tab:
    return tabs["multimnist"]


@pytest.fixture(scope="module")
def fashion_tab(tabs) -> Tab:
    return tabs["fashion-mnist"]


@pytest.fixture(scope="module")
def uis(tabs) -> dict[str, TabUI]:
    """Each tab's components, laid out as the demo does (for the handlers that return updates keyed by them)."""
    with gr.Blocks():
        page = layout.page(list(tabs.values()))
    return {ui.tab.model: ui for ui in page.tabs}


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
def seven(api_url, digit_tab, mnist_fixture) -> tuple[list[list[float]], int]:
    """Capsules (10x16) and prediction of the first test image (a 7), via the drawing handler."""
    view = predict_drawing(ApiClient(api_url, timeout_s=30.0), digit_tab, drawing(mnist_fixture[0][0]))
    return view.capsules, view.digit


# ---- the tabs: one per model the API serves (GET /models) ------------------------------------------------
def model_tabs(demo: gr.Blocks) -> list[str]:
    """The labels of a built demo's model tabs (every gr.Tab but the Draw and Upload tabs inside them)."""
    return [
        block.label
        for block in demo.blocks.values()
        if isinstance(block, gr.Tab) and block.label not in ("Draw", "Upload")
    ]


def test_every_served_model_gets_a_tab_the_default_first(client):
    """The API serves every shipped model here: the demo has a tab for each, the default model's first,
    each labelled by what its model reads, and no two components share an elem_id."""
    served = client.models()
    entries = {entry["name"]: entry for entry in served["models"]}
    tabs = tabs_from(served)
    assert tabs[0].model == served["default"] == "mnist" and {tab.model for tab in tabs} == set(entries)
    assert {tab.model: (tab.title, tab.prefix) for tab in tabs} == {
        "mnist": ("Digit", ""),
        "multimnist": ("Two digits", "pair-"),
        "fashion-mnist": ("Fashion", "fashion-"),
        "affine": ("Digit (affine)", "affine-"),
    }
    for tab in tabs:
        entry = entries[tab.model]
        assert (tab.size, tab.classes, tab.task) == (entry["input_size"], entry["classes"], entry["task"])
        assert tab.look is LOOKS[entry["preprocessing"]]
    demo = build_demo(client, tabs)
    assert model_tabs(demo) == [tab.title for tab in tabs]
    # Nothing but tabs in the models' gr.Tabs: a gr.State there gave a tab a second header in the browser.
    (models,) = [
        block
        for block in demo.blocks.values()
        if isinstance(block, gr.Tabs) and any(getattr(child, "id", None) == "mnist" for child in block.children)
    ]
    assert all(isinstance(child, gr.Tab) for child in models.children), models.children
    ids = [block.elem_id for block in demo.blocks.values() if getattr(block, "elem_id", None)]
    assert len(ids) == len(set(ids)) and {"sketch", "pair-sketch", "affine-sketch", "fashion-upload"} <= set(ids)


@pytest.fixture(scope="module")
def mnist_only_url():
    """The API serving mnist alone (CAPSNET_MODELS=mnist)."""
    from app.main import create_app
    from app.settings import Settings

    settings = Settings(models=["mnist"], providers=["CPUExecutionProvider"], log_level="warning")
    with serving(create_app(settings), "capsnet-api-mnist") as url:
        yield url


def test_one_served_model_is_one_tab(mnist_only_url):
    """An API serving mnist alone: the demo has the Digit tab and no other, and it answers."""
    client = ApiClient(mnist_only_url, timeout_s=30.0)
    tabs = tabs_from(client.models())
    assert [(tab.model, tab.title, tab.prefix) for tab in tabs] == [("mnist", "Digit", "")]
    assert model_tabs(build_demo(client, tabs)) == ["Digit"]
    view = predict_upload(client, tabs[0], str(EXAMPLES[7]))
    assert view.digit == 7 and "**mnist**" in view.footer


def test_affine_gets_a_digit_tab_with_its_40x40_input(client, tabs):
    """The affine model (digit preprocessing, 40x40 input) is shown as a digit: drawn or uploaded, its
    model input and reconstructions 40x40, its routing on a 12x12 grid; the MNIST examples are read."""
    tab = tabs["affine"]
    assert tab.look is LOOKS["digit"] and tab.look.canvas and tab.view is PredictView
    assert tab.size == AFFINE_SIZE == 40 and tab.title == "Digit (affine)"
    side = AFFINE_SIZE * plots.SCALE
    views = [predict_upload(client, tab, str(path)) for path in EXAMPLES]
    assert [view.digit for view in views] == [int(path.name[0]) for path in EXAMPLES]
    seven = views[7]
    assert seven.status.startswith("## Prediction: **7**") and "**affine**" in seven.footer
    assert seven.input.size == seven.reconstruction.size == (side, side)
    assert np.asarray(seven.answer["routing"]["maps"]).shape == (NUM_CLASSES, 12, 12)
    tiles = fig4_tiles(client, np.asarray(seven.capsules, dtype=np.float32)[7], 7, tab.model)
    assert tiles.shape == (CAPSULE_DIM, len(OFFSETS), AFFINE_SIZE, AFFINE_SIZE)
    drawn = predict_drawing(client, tab, brushed(STROKES[7]))
    assert drawn.digit == 7 and drawn.input.size == (side, side), drawn.status


def test_the_demo_waits_for_the_api_to_list_its_models(unused_url):
    """`make demo` starts the API and the demo at once: the demo asks GET /models again until the API
    listens, and says in words when it never does."""
    calls = []

    def api(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) < 3:  # still loading its models: nothing listens yet
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json={"default": "mnist", "models": []})

    answer = served_models(ApiClient("http://api", 2.0, transport=httpx.MockTransport(api)), wait_s=10, every_s=0.01)
    assert answer == {"default": "mnist", "models": []} and calls == ["/models"] * 3
    with pytest.raises(ApiUnreachable, match=r"GET /models.*not reachable"):
        served_models(ApiClient(unused_url, timeout_s=2.0), wait_s=0.3, every_s=0.1)


def test_the_launched_demo_takes_what_it_holds_out_of_the_garbage_collector(api_url):
    """Once serving, the demo's objects (Gradio, its server, its components, the libraries) are frozen: the
    collections that its events' objects set off walk only those, not every object of the process."""
    gc.unfreeze()
    demo, _ = start_demo(api_url)
    try:
        young = gc.get_objects()  # the frozen are left out
        assert not any(o is demo or o is demo.server_app for o in young)
        assert len(young) < gc.get_freeze_count() / 10
    finally:
        demo.close()
        gc.unfreeze()


# ---- the Digit tab (mnist) -------------------------------------------------------------------------------
def test_drawing_a_fixture_digit_yields_its_label(client, digit_tab, mnist_fixture):
    # Needs the trained model: the first test digit of each class, drawn on the canvas.
    images, labels = mnist_fixture
    firsts = [int(np.flatnonzero(labels == d)[0]) for d in range(NUM_CLASSES)]
    predicted = [predict_drawing(client, digit_tab, drawing(images[i])).digit for i in firsts]
    wrong = [(int(labels[i]), p) for i, p in zip(firsts, predicted, strict=True) if p != labels[i]]
    assert len(wrong) <= 1, f"(label, predicted) for the misread digits: {wrong}"


def test_prediction_view_has_every_panel(client, digit_tab, mnist_fixture):
    view = predict_drawing(client, digit_tab, drawing(mnist_fixture[0][0]))
    assert view.digit == 7 and view.status.startswith("## Prediction: **7**")
    assert view.input.size == view.reconstruction.size == (224, 224)
    assert view.lengths.size[0] > 0 and routing_view(digit_tab, view.answer).size[0] > 0
    assert np.asarray(view.capsules).shape == (NUM_CLASSES, CAPSULE_DIM)
    assert "version" in view.footer and "CPUExecutionProvider" in view.footer
    assert view.answer["prediction"] == view.digit  # the answer kept for the routing maps is this one


def test_routing_maps_put_the_answer_first(client, digit_tab, mnist_fixture):
    """The maps follow the answer in a second step: the predicted class's tile first, drawn in its colour."""
    view = predict_drawing(client, digit_tab, drawing(mnist_fixture[0][0]))
    maps = np.asarray(routing_view(digit_tab, view.answer), dtype=np.int64)
    first_label = maps[14:40, 14:50]  # the first tile's caption: the predicted class, in the winner's colour
    assert (np.abs(first_label - np.array(plots.WINNER)).sum(axis=-1) < 60).any()
    assert routing_view(digit_tab, None) is None  # nothing answered: no maps


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
    assert screen.switch(UPLOAD) is None  # the Upload tab clicked with the example on screen: nothing new
    assert screen.shows(screen.switch(DRAWING), DRAWING)  # back to the Draw tab: the drawing answers


def test_an_event_passes_its_updates_or_drops_stale_ones():
    outputs = [gr.Markdown(), gr.Markdown()]
    screen = Screen(DRAWING)
    run = gated(lambda text: {outputs[0]: text, outputs[1]: text.upper()}, DRAWING, switch=True)
    assert run(screen, "a") == {outputs[0]: "a", outputs[1]: "A"}

    def overtaken(text):  # a newer prediction starts while this one waits for the API
        screen.start(DRAWING)
        return {outputs[0]: text}

    assert gated(overtaken, DRAWING)(screen, "b") == gr.skip()  # no update to any output
    assert gated(lambda: {outputs[0]: "c"}, DRAWING, tab_select=True)(screen) == gr.skip()  # on screen already


def test_an_answer_on_screen_is_followed_up_once():
    """The routing maps and Fig. 4 follow the answer that showed, once; a dropped answer has none."""
    screen, output = Screen(DRAWING), gr.Markdown()
    assert screen.follow() == (False, None)  # nothing shown yet
    assert gated(lambda text: {output: text, ANSWER: {"text": text}}, DRAWING)(screen, "a") == {output: "a"}
    assert screen.follow() == (True, {"text": "a"}) and screen.follow() == (False, None)

    def overtaken(text):
        screen.start(DRAWING)
        return {output: text, ANSWER: {"text": text}}

    gated(overtaken, DRAWING)(screen, "b")  # dropped: the answer on screen is still "a"'s
    assert screen.follow() == (False, None)


def test_a_follow_up_that_waited_draws_the_answer_on_screen_as_it_runs(client, uis):
    """Two answers show before the first one's follow-up runs (it waits for the browser to paint): it draws
    the second answer's maps, not the one its event was sent after, and the second's follow-up has nothing
    left to do (before, the first drew the old answer and marked the new one done: its maps never came)."""
    ui = uis["mnist"]
    screen = Screen(DRAWING)
    answers = {d: client.predict(EXAMPLES[d].read_bytes(), ui.tab.model) for d in (3, 7)}
    for d in (3, 7):
        gated(lambda d=d: {ANSWER: answers[d]}, DRAWING)(screen)
    shown = follow_up(client, ui, screen, False, DEFAULT, *[0.0] * CAPSULE_DIM)
    maps = ui.routing.maps
    assert np.array_equal(np.asarray(shown[maps]), np.asarray(routing_view(ui.tab, answers[7])))
    assert not np.array_equal(np.asarray(shown[maps]), np.asarray(routing_view(ui.tab, answers[3])))
    assert follow_up(client, ui, screen, False, DEFAULT, *[0.0] * CAPSULE_DIM) == gr.skip()


def test_the_follow_up_draws_the_maps_the_perturbed_capsule_and_fig4(client, uis):
    """Of the answer on screen, from the session's state, in one update: its maps, its prediction's capsule
    perturbed by the sliders, its Fig. 4; a pair's first digit. Nothing more once followed up."""
    deltas = [0.0] * CAPSULE_DIM
    deltas[2] = 0.25
    for ui, example in ((uis["mnist"], EXAMPLES[7]), (uis["multimnist"], PAIR_EXAMPLES[0])):
        tab, panel = ui.tab, ui.panel
        screen, answer = Screen(DRAWING), client.predict(example.read_bytes(), tab.model)
        digit = int(answer["objects"][0]["digit"]) if tab.view is PairView else 7
        gated(lambda ui=ui, answer=answer: {ui.status: "", ANSWER: answer}, DRAWING)(screen)  # an answer shows
        shown = follow_up(client, ui, screen, False, DEFAULT, *deltas)
        assert list(shown) == [*ui.routing, panel.perturbed, panel.grid, *panel.sliders]
        assert shown[panel.sliders[0]].label == slider_labels(ui, digit)[panel.sliders[0]].label
        assert np.array_equal(np.asarray(shown[ui.routing.maps]), np.asarray(routing_view(tab, answer)))
        expected = perturb(client, answer["capsules"], digit, *deltas, model=tab.model)
        assert np.array_equal(np.asarray(shown[panel.perturbed]), np.asarray(expected))
        assert shown[panel.grid].size == fig4(client, answer["capsules"], digit, tab.model).size
        again = follow_up(client, ui, screen, False, DEFAULT, *deltas)
        assert again == gr.skip()  # followed up already: no update to any output


def test_the_demo_asks_for_the_routing_maps_not_the_coefficients(client, uis):
    """The demo's answer carries the routing maps (each iteration's too) that its panels draw, not the 11,520
    routing coefficients the maps sum up, and a view keeps that answer for the session (gr.State)."""
    for ui, example in ((uis["mnist"], EXAMPLES[7]), (uis["multimnist"], PAIR_EXAMPLES[0])):
        tab = ui.tab
        answer = client.predict(example.read_bytes(), tab.model, tab.iterations)
        assert set(answer["routing"]) == {"maps", "iterations"}
        assert tab.view.of(answer, tab.classes, client.public_url).answer is answer


def test_no_event_of_the_page_answers_part_by_part(client, tabs):
    """Every event answers in one update, none as a generator: Gradio's page applies a generator's later
    outputs as diffs, in place, to the objects of its earlier ones, which it hands to the components, and an
    image of an earlier output can lose its url before it is drawn (its box stays empty)."""
    demo = build_demo(client, list(tabs.values()))
    assert demo.fns and [fn.name for fn in demo.fns.values() if fn.types_generator] == []


def test_an_example_is_shown_in_the_upload_and_answered(client, uis):
    """A click on an example, in every tab: the Upload tab selected where the tab has a pad beside it, the
    example's file for the upload, then the view of that file, keyed by the tab's components."""
    for ui in uis.values():
        tab, shown = ui.tab, answer_example(client, ui, 3)
        path = str(tab.look.examples[3])
        view = predict_upload(client, tab, path)
        fields = {ui.outputs[field]: value for field, value in view._asdict().items() if field != "answer"}
        expected = {ui.inputs.upload: path, **fields, ANSWER: view.answer}
        if tab.look.canvas:
            assert shown.pop(ui.inputs.tabs).selected == f"{tab.prefix}upload-tab"
        assert shown.keys() == expected.keys()
        assert shown[ui.inputs.upload] == path and shown[ui.status] == view.status
        assert shown[ANSWER]["capsules"] == view.answer["capsules"]
    seven = answer_example(client, uis["mnist"], 7)
    assert Path(seven[uis["mnist"].inputs.upload]).name.startswith("7_")
    assert seven[uis["mnist"].status].startswith("## Prediction: **7**") and seven[uis["mnist"].panel.digit] == 7


def test_an_upload_is_answered_from_its_file_as_gradio_stored_it(client, uis, tmp_path):
    """The upload's events hand the handler Gradio's record of the file (not opened): its path is read and
    sent; no upload is the prompt; a record without a file (a data URL sent to the event by hand) is told
    to send one."""
    ui = uis["mnist"]
    seven = tmp_path / "seven.png"
    seven.write_bytes(EXAMPLES[7].read_bytes())
    answered = answer_upload(client, ui, {"path": str(seven), "url": None, "orig_name": "seven.png"})
    assert answered[ui.status].startswith("## Prediction: **7**")
    assert answer_upload(client, ui, None)[ui.status] == ui.tab.look.prompt
    data_url = {"path": None, "url": "data:image/png;base64," + base64.b64encode(seven.read_bytes()).decode()}
    refused = answer_upload(client, ui, data_url)
    assert refused[ui.status] == NO_FILE and refused[ANSWER] is None


def test_a_click_on_a_tab_answers_for_the_input_it_holds(client, uis, tmp_path):
    """The Tabs' select, which a person's click sends: Upload answers the upload's file, Draw the drawing,
    and a tab whose input is on screen already has nothing new to say."""
    ui = uis["mnist"]
    seven = tmp_path / "seven.png"
    seven.write_bytes(EXAMPLES[7].read_bytes())
    upload, drawing = {"path": str(seven), "url": None, "orig_name": "seven.png"}, brushed(STROKES[4])
    run, screen = answer_tab(client, ui), Screen(DRAWING)

    def click(label: str):
        return run(screen, drawing, upload, gr.SelectData(ui.inputs.tabs, {"index": 0, "value": label}))

    assert click("Upload")[ui.status].startswith("## Prediction: **7**")
    assert click("Upload") == gr.skip()
    assert click("Draw")[ui.status].startswith("## Prediction: **4**")
    assert click("Draw") == gr.skip()


# Digits as a mouse draws them: polylines (x, y) on the 400 px canvas, 250 px tall.
STROKES = {
    1: [[(180, 110), (210, 80), (210, 330)]],
    4: [[(230, 80), (130, 250), (270, 250)], [(230, 80), (230, 330)]],
    7: [[(120, 80), (280, 80), (170, 330)]],
}


def brushed(lines: list[list[tuple[int, int]]], radius: int = PENS[PEN]) -> str:
    """The pad's value for polylines drawn with a round pen of the demo's (black, into alpha), the one in hand
    at first unless `radius` says."""
    layer = Image.new("RGBA", (CANVAS, CANVAS), (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    for line in lines:
        draw.line(line, fill=(0, 0, 0, 255), width=2 * radius, joint="curve")
        for x, y in line:
            draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=(0, 0, 0, 255))
    return pad_value(layer)


def test_the_pen_in_hand_draws_mnist_like_strokes():
    """The pen in hand at first, on a digit 40% to 95% of the canvas tall, is within MNIST's widths (as a
    fraction of the digit's side; the API's stroke_width adds about a pixel in 80, hence 1/80); the fine pen
    is finer and the broad one broader."""
    for height in (0.4 * CANVAS, 0.95 * CANVAS):
        assert STROKE_RANGE[0] <= 2 * PENS[PEN] / height + 1 / 80 <= STROKE_RANGE[1], height
    assert PENS["fine"] < PENS[PEN] < PENS["broad"]


@pytest.mark.parametrize("pen", sorted(PENS))
@pytest.mark.parametrize("digit", sorted(STROKES))
def test_digits_drawn_with_each_pen_are_read(client, digit_tab, digit, pen):
    view = predict_drawing(client, digit_tab, brushed(STROKES[digit], PENS[pen]))
    assert view.digit == digit and "⚠️" not in view.status, view.status


def test_a_small_digit_drawn_with_the_broad_pen_is_a_blob_and_the_fine_pen_mends_it(client, digit_tab):
    """A 7 drawn 42 px tall: with the broad pen (56 px) its ink is 98 px tall and its strokes over half of
    that, a blob, and the answer says to draw it larger or with a finer pen, which the pad has; with the fine
    pen it is read without a warning."""
    small = [[(180 + x // 8, 180 + y // 6) for x, y in STROKES[7][0]]]  # the path 20 x 42 px
    broad = predict_drawing(client, digit_tab, brushed(small, PENS["broad"]))
    assert "⚠️" in broad.status and "finer pen" in broad.status, broad.status
    fine = predict_drawing(client, digit_tab, brushed(small, PENS["fine"]))
    assert fine.digit == 7 and "⚠️" not in fine.status, fine.status


def test_warnings_are_shown(client, digit_tab):
    """Two digits side by side: the API says it left a shape out, and the demo says so."""
    seven = STROKES[7][0]
    left = [(x // 3, y) for x, y in seven]  # x 40-93
    right = [(x // 3 + 280, y) for x, y in seven]  # x 320-373, farther than half the digit's height
    view = predict_drawing(client, digit_tab, brushed([left, right], radius=7))
    assert "⚠️" in view.status and "shape" in view.status, view.status
    assert "⚠️" not in predict_drawing(client, digit_tab, brushed(STROKES[1])).status


def test_examples_are_read_as_their_digit_through_the_upload_handler(client, digit_tab):
    """Each example's file name starts with its digit (MNIST t10k, the first of each class): all ten read so."""
    assert len(EXAMPLES) == NUM_CLASSES
    views = [predict_upload(client, digit_tab, str(path)) for path in EXAMPLES]
    assert [view.digit for view in views] == [int(path.name[0]) for path in EXAMPLES] == list(range(NUM_CLASSES))
    for view in views:
        assert view.status.startswith(f"## Prediction: **{view.digit}**")
        assert np.asarray(view.capsules).shape == (NUM_CLASSES, CAPSULE_DIM)


def test_slider_deltas_change_the_reconstruction(client, seven):
    capsules, digit = seven
    zero = [0.0] * CAPSULE_DIM
    moved = [PERTURB_LIMIT, *zero[1:]]
    before, after = (np.asarray(perturb(client, capsules, digit, *deltas)) for deltas in (zero, moved))
    assert before.shape == (224, 224)
    assert np.abs(after.astype(int) - before).max() > 0
    np.testing.assert_array_equal(np.asarray(perturb(client, capsules, digit, *zero)), before)  # reset


def test_any_digit_capsule_can_be_decoded(client, seven):
    capsules, digit = seven
    other = (digit + 3) % NUM_CLASSES
    zero = [0.0] * CAPSULE_DIM
    drawn = perturb(client, capsules, other, *zero)
    assert drawn.size == (224, 224)
    # that digit's own capsule, decoded alone: not the answer's digit, nor a blank
    own = client.reconstruct([other], np.asarray(capsules, np.float32)[other][None])[0]
    assert np.array_equal(np.asarray(drawn), np.asarray(plots.digit(own)))
    answer = client.reconstruct([digit], np.asarray(capsules, np.float32)[digit][None])[0]
    assert not np.array_equal(np.asarray(drawn), np.asarray(plots.digit(answer)))


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


def test_empty_canvas_asks_for_a_digit(client, digit_tab):
    for empty in (None, ""):  # what the pad sends with nothing drawn, and an empty value
        view = predict_drawing(client, digit_tab, empty)
        assert view.status == DRAW_A_DIGIT and view.capsules is None
    blank = predict_drawing(client, digit_tab, pad_value(Image.new("RGBA", (CANVAS, CANVAS))))  # a PNG with no ink
    assert "⚠️" in blank.status and "blank" in blank.status and blank.capsules is None


@pytest.mark.parametrize(
    "value", ["data:image/jpeg;base64,/9j/4AAQ", "data:image/png;base64,not base64!", "<img src=x onerror=alert(1)>"]
)
def test_a_drawing_that_is_not_a_png_data_url_is_refused_in_words(client, digit_tab, value):
    """The pad's event is public (Gradio's API page): a value it would never send gets a sentence."""
    view = predict_drawing(client, digit_tab, value)
    assert view.status == "⚠️ The drawing did not arrive as a PNG image; draw it again." and view.capsules is None


def test_refused_file_shows_the_apis_words(client, digit_tab, tmp_path):
    not_an_image = tmp_path / "notes.png"
    not_an_image.write_text("this is not a picture")
    view = predict_upload(client, digit_tab, str(not_an_image))
    assert view.status.startswith("⚠️") and view.capsules is None
    assert "Traceback" not in view.status


def test_an_upload_over_the_apis_limit_is_sent_again_reduced(api_url, digit_tab, tmp_path):
    """A photo-sized upload (a drawing app's transparent 7, 3000 px a side) that the API refuses as larger than it
    takes (413, here from 100 kB) is sent again reduced to SENT_SIDE px a side, transparency kept: the answer
    names the 7 and says what was sent. A file over the limit that is no picture gets the API's sentence."""
    limit = 100_000
    sent: list[int] = []

    def api_with_a_small_limit(request: httpx.Request) -> httpx.Response:
        sent.append(len(request.content))
        if len(request.content) > limit:
            return httpx.Response(413, json={"detail": f"the request body is {len(request.content):,} bytes"})
        answer = httpx.request(
            request.method,
            f"{api_url}{request.url.raw_path.decode()}",
            headers=request.headers,
            content=request.content,
            timeout=30.0,
        )
        return httpx.Response(answer.status_code, content=answer.content, headers=answer.headers)

    client = ApiClient("http://api", 30.0, transport=httpx.MockTransport(api_with_a_small_limit))
    photo = tmp_path / "seven.png"
    Image.open(TRANSPARENT_SEVEN).resize((3000, 3000), Image.Resampling.BICUBIC).save(photo)
    view = predict_upload(client, digit_tab, str(photo))
    assert sent[0] > limit >= sent[1] and len(sent) == 2
    assert view.status.startswith("## Prediction: **7**"), view.status
    assert f"reduced from 3000x3000 to {SENT_SIDE}x{SENT_SIDE} px" in view.status
    noise = tmp_path / "noise.png"
    noise.write_bytes(np.random.default_rng(0).bytes(2 * limit))
    view = predict_upload(client, digit_tab, str(noise))
    assert view.status == f"⚠️ the request body is {sent[-1]:,} bytes" and view.capsules is None


def test_api_down_is_a_message_not_a_traceback(digit_tab, unused_url):
    nobody = ApiClient(unused_url, timeout_s=2.0)
    view = predict_upload(nobody, digit_tab, str(EXAMPLES[0]))
    assert "not reachable" in view.status and "python -m app" in view.status
    assert "not reachable" in model_footer(nobody)
    assert perturb(nobody, [[0.0] * CAPSULE_DIM] * NUM_CLASSES, 3, *[0.0] * CAPSULE_DIM) is None


def test_api_starting_up_is_a_message(digit_tab):
    warming = httpx.MockTransport(lambda request: httpx.Response(503, json={"detail": "warming up"}))
    view = predict_upload(ApiClient("http://api", 2.0, transport=warming), digit_tab, str(EXAMPLES[0]))
    assert "starting up" in view.status and view.capsules is None


def test_import_loads_neither_torch_nor_the_api():
    code = (
        "import sys, frontend.app; print(sorted({'torch', 'app', 'training'} & {m.split('.')[0] for m in sys.modules}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


# ---- the Two digits tab (multimnist, 36x36) and the Fashion tab (fashion-mnist) --------------------------
PAIR_SIDE = MULTIMNIST_SIZE * plots.SCALE  # 288 px on screen


def named_digits(status: str) -> list[str]:
    """The digits a pair's status names in bold on its first line: '## Digits: **3** and **7**'."""
    return re.findall(r"\*\*(\d)\*\*", status.splitlines()[0])


@pytest.fixture(scope="module")
def pair(api_url, pair_tab) -> PairView:
    """The Two digits tab's view of the first generated pair example."""
    return predict_upload(ApiClient(api_url, timeout_s=30.0), pair_tab, str(PAIR_EXAMPLES[0]))


@pytest.mark.parametrize("path", PAIR_EXAMPLES, ids=lambda p: p.name)
def test_pair_examples_name_both_digits(client, pair_tab, path):
    """A generated pair's file name starts with its two digits; the tab names both, in either order."""
    view = predict_upload(client, pair_tab, str(path))
    assert sorted(named_digits(view.status)) == sorted(path.name[:2]), view.status


@pytest.mark.parametrize("first, second", [(1, 7), (1, 4), (4, 7)])
def test_two_digits_drawn_over_each_other_are_both_named(client, pair_tab, first, second):
    lines = [[(x - 30, y) for x, y in line] for line in STROKES[first]]
    lines += [[(x + 30, y) for x, y in line] for line in STROKES[second]]
    view = predict_drawing(client, pair_tab, brushed(lines))
    assert sorted(named_digits(view.status)) == sorted(f"{first}{second}"), view.status


def test_pair_view_shows_the_input_the_overlay_and_each_digit(pair_tab, pair):
    assert pair_tab.view is PairView and pair_tab.look is LOOKS["digit-pair"] and pair_tab.size == MULTIMNIST_SIZE
    assert pair.status.startswith("## Digits: ") and "(red)" in pair.status and "(green)" in pair.status
    assert pair.input.size == pair.overlay.size == pair.first.size == pair.second.size == (PAIR_SIDE, PAIR_SIDE)
    assert pair.overlay.mode == pair.first.mode == pair.second.mode == "RGB"
    red, green = (np.asarray(image, dtype=np.int64).sum(axis=(0, 1)) for image in (pair.first, pair.second))
    assert red[0] > red[1] and green[1] > green[0]  # the first digit drawn in red, the second in green
    assert np.asarray(pair.capsules).shape == (NUM_CLASSES, CAPSULE_DIM)
    assert pair.digit == int(named_digits(pair.status)[0])  # the red digit's capsule is the one to perturb
    assert pair.lengths.size[0] > 0 and routing_view(pair_tab, pair.answer).size[0] > 0
    assert "multimnist" in pair.footer


def test_either_pair_capsule_can_be_perturbed(client, pair_tab, pair):
    zero = [0.0] * CAPSULE_DIM
    moved = [PERTURB_LIMIT, *zero[1:]]
    for digit in map(int, named_digits(pair.status)):
        before, after = (
            np.asarray(perturb(client, pair.capsules, digit, *deltas, model=pair_tab.model)) for deltas in (zero, moved)
        )
        assert before.shape == (PAIR_SIDE, PAIR_SIDE)
        assert np.abs(after.astype(int) - before).max() > 0, digit


def test_fig4_tiles_of_a_pair_are_36_px(client, pair_tab, pair):
    capsule = np.asarray(pair.capsules, dtype=np.float32)[pair.digit]
    tiles = fig4_tiles(client, capsule, pair.digit, pair_tab.model)
    assert tiles.shape == (CAPSULE_DIM, len(OFFSETS), MULTIMNIST_SIZE, MULTIMNIST_SIZE) == (16, 11, 36, 36)
    side = 2 * MULTIMNIST_SIZE + 2  # 2x tiles + gaps
    assert fig4(client, pair.capsules, pair.digit, pair_tab.model).size == (52 + 11 * side, 24 + 16 * side)


def test_fashion_examples_are_named_by_their_class(client, fashion_tab):
    """Each example's file name starts with its class index: at least 8 of the 10 are read as it."""
    names = fashion_tab.classes
    assert len(FASHION_EXAMPLES) == NUM_CLASSES
    views = [predict_upload(client, fashion_tab, str(path)) for path in FASHION_EXAMPLES]
    wrong = [
        (path.name, names[view.digit])
        for path, view in zip(FASHION_EXAMPLES, views, strict=True)
        if view.digit != int(path.name.split("_")[0])
    ]
    assert len(wrong) <= 2, f"(example, predicted) for the misread garments: {wrong}"
    for view in views:
        assert view.status.startswith(f"## Prediction: **{names[view.digit]}**")


def test_fashion_view_has_every_panel(client, fashion_tab):
    assert fashion_tab.look is LOOKS["garment"] and not fashion_tab.look.canvas
    view = predict_upload(client, fashion_tab, str(FASHION_EXAMPLES[0]))
    assert view.input.size == view.reconstruction.size == (224, 224)
    assert view.lengths.size[0] > 0 and routing_view(fashion_tab, view.answer).size[0] > 0
    assert "runner-up " in view.status and "fashion-mnist" in view.footer
    zero = [0.0] * CAPSULE_DIM
    moved = [PERTURB_LIMIT, *zero[1:]]
    before, after = (
        np.asarray(perturb(client, view.capsules, view.digit, *deltas, model=fashion_tab.model))
        for deltas in (zero, moved)
    )
    assert np.abs(after.astype(int) - before).max() > 0


def test_capsule_choices_are_named_by_the_models_classes(client, uis):
    """Each tab's radio of capsules names them as GET /models does: Fashion-MNIST's classes, digits."""
    served = {entry["name"]: entry["classes"] for entry in client.models()["models"]}
    for model, ui in uis.items():
        assert [name for name, _ in ui.panel.digit.choices] == served[model]
        assert [value for _, value in ui.panel.digit.choices] == list(range(NUM_CLASSES))
    assert [name for name, _ in uis["fashion-mnist"].panel.digit.choices][-1] == "Ankle boot"
    assert [name for name, _ in uis["multimnist"].panel.digit.choices] == list(plots.DIGITS)


def test_each_tab_asks_for_its_input(client, pair_tab, fashion_tab):
    pair = predict_drawing(client, pair_tab, None)
    assert isinstance(pair, PairView) and pair.status == DRAW_TWO_DIGITS and pair.capsules is None
    garment = predict_upload(client, fashion_tab, None)
    assert garment.status == SHOW_A_GARMENT and garment.capsules is None


def test_each_tabs_footer_names_its_model(client, tabs):
    for tab in tabs.values():
        assert f"**{tab.model}**" in model_footer(client, tab.model)


def test_the_footer_gives_the_api_address_a_browser_reaches(api_url, digit_tab):
    """In compose the demo asks http://api:8000, a name only the containers know: the footer shows the public
    address instead (CAPSNET_DEMO_PUBLIC_API_URL), before an answer and with one, and the one it asks where
    none is given."""
    public = ApiClient(api_url, timeout_s=30.0, public_url="http://localhost:8010/")
    answered = predict_upload(public, digit_tab, str(EXAMPLES[7])).footer
    for footer in (model_footer(public), answered):
        assert footer.endswith("API http://localhost:8010") and api_url not in footer
    assert model_footer(ApiClient(api_url, timeout_s=30.0)).endswith(f"API {api_url}")
