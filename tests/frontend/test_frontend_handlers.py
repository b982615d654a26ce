"""The demo's handlers against the real API on loopback: predict, perturb, the Fig. 4 grid, and the
states a person must see in words (empty canvas, API down, API starting, a refused file)."""
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image, ImageDraw

from frontend.app import (
    BRUSH_RADIUS,
    CANVAS,
    DRAW_A_DIGIT,
    EXAMPLES,
    OFFSETS,
    ApiClient,
    fig4,
    fig4_tiles,
    model_footer,
    perturb,
    predict_drawing,
    predict_upload,
)
from model.contract import CAPSULE_DIM, IMAGE_SIZE, NUM_CLASSES, PERTURB_LIMIT, STROKE_RANGE

REPO = Path(__file__).resolve().parents[2]


def drawing(digit: np.ndarray, size: int = 400) -> dict:
    """What the sketchpad hands the handler for a digit drawn in black on its white canvas: a
    transparent RGBA layer whose alpha is the ink (the 28x28 digit scaled up to the canvas)."""
    layer = Image.new("RGBA", (size, size), (0, 0, 0, 0))
    layer.putalpha(Image.fromarray(digit, mode="L").resize((size, size), Image.Resampling.BILINEAR))
    return {"background": Image.new("RGB", (size, size), "white"), "layers": [layer], "composite": None}


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
    assert view.lengths.size[0] > 0 and view.routing.size[0] > 0
    assert np.asarray(view.capsules).shape == (NUM_CLASSES, CAPSULE_DIM)
    assert "version" in view.footer and "CPUExecutionProvider" in view.footer


# Digits as a mouse draws them: polylines (x, y) on the 400 px canvas, 250 px tall.
STROKES = {
    1: [[(180, 110), (210, 80), (210, 330)]],
    4: [[(230, 80), (130, 250), (270, 250)], [(230, 80), (230, 330)]],
    7: [[(120, 80), (280, 80), (170, 330)]],
}


def brushed(lines: list[list[tuple[int, int]]], radius: int = BRUSH_RADIUS) -> dict:
    """The sketchpad's value for polylines drawn with the demo's round brush (black, into alpha)."""
    layer = Image.new("RGBA", (CANVAS, CANVAS), (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    for line in lines:
        draw.line(line, fill=(0, 0, 0, 255), width=2 * radius, joint="curve")
        for x, y in line:
            draw.ellipse((x - radius, y - radius, x + radius, y + radius), fill=(0, 0, 0, 255))
    return {"background": Image.new("RGB", (CANVAS, CANVAS), "white"), "layers": [layer], "composite": None}


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
    blank = {"background": Image.new("RGB", (400, 400)), "layers": [Image.new("RGBA", (400, 400))], "composite": None}
    for editor in (None, {"background": None, "layers": [], "composite": None}, blank):
        view = predict_drawing(client, editor)
        assert view.status == DRAW_A_DIGIT and view.capsules is None


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
