"""POST /explain and app/imaging/transform.py: each transform does what its name says, a sweep's step is
what /predict says of the same transformed input, every model answers, hostile sweeps are 4xx."""

import io
import math
from typing import get_args

import numpy as np
import pytest
from PIL import Image

from app.imaging import from_base64
from app.imaging.transform import TRANSFORMS, TransformName, apply, centre_of_mass, sweep
from app.schemas import MAX_SWEEP_STEPS
from model import contract
from tests.harness import encode

SIZE = contract.IMAGE_SIZE


def bar(horizontal: bool = True) -> np.ndarray:
    """A 3 px thick, 13 px long bar through the middle of a 28x28 frame."""
    x = np.zeros((SIZE, SIZE), np.float32)
    if horizontal:
        x[13:16, 8:21] = 1.0
    else:
        x[8:21, 13:16] = 1.0
    return x


def extent(x: np.ndarray) -> tuple[int, int]:
    """Rows and columns the ink (> 0.5) spans."""
    rows, cols = np.nonzero(x > 0.5)
    return int(np.ptp(rows)) + 1, int(np.ptp(cols)) + 1


def post(client, image: np.ndarray, **params):
    return client.post("/explain", params=params, files={"file": ("digit.png", encode(image), "image/png")})


def png(url: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(from_base64(url))), np.float32) / 255


# --- the transforms --------------------------------------------------------------------------------
def test_rotation_turns_anticlockwise_about_the_ink():
    turned = apply(bar(), "rotate", 90.0)
    assert extent(turned) == extent(bar(horizontal=False))
    dot = np.zeros((SIZE, SIZE), np.float32)
    dot[14, 14], dot[14, 20] = 1.0, 0.2  # a heavy centre and a light mark to its right
    moved = apply(dot, "rotate", 90.0)
    row, col = np.unravel_index(np.argmax(np.where(moved < 0.9, moved, 0)), moved.shape)
    assert col == pytest.approx(14, abs=1) and row < 14  # right of the centre goes up: anticlockwise
    np.testing.assert_allclose(apply(bar(), "rotate", 0.0), bar(), atol=1e-6)


def test_scale_shear_and_shifts_move_the_ink_as_named():
    assert extent(apply(bar(), "scale", 1.5))[1] > extent(bar())[1] > extent(apply(bar(), "scale", 0.6))[1]
    slanted = apply(bar(horizontal=False), "shear", 30.0)
    top, bottom = slanted[8:11], slanted[18:21]
    cols = np.arange(SIZE)
    assert (top.sum(0) @ cols) / top.sum() > (bottom.sum(0) @ cols) / bottom.sum() + 3  # "/": the top leans right
    for name, axis, sign in (("shift_x", 1, 1), ("shift_y", 0, 1), ("shift_x", 1, -1)):
        before, after = centre_of_mass(bar()), centre_of_mass(apply(bar(), name, 3.0 * sign))
        assert after[axis] - before[axis] == pytest.approx(3.0 * sign, abs=1e-3)
        assert after[1 - axis] == pytest.approx(before[1 - axis], abs=1e-3)


def test_thickness_grows_and_thins_strokes_smoothly(mnist_fixture):
    digit = mnist_fixture[0][0].astype(np.float32) / 255
    ink = sweep(digit, "thickness", np.linspace(-1.0, 2.0, 13)).sum(axis=(1, 2))
    assert np.all(np.diff(ink) > 0)  # more ink at every step, no jumps back
    assert ink[0] < digit.sum() < ink[-1]


def test_sweep_refuses_an_unknown_transform():
    with pytest.raises(ValueError, match="no transform is named"):
        sweep(bar(), "twirl", np.zeros(2))


# --- the route -------------------------------------------------------------------------------------
def test_a_sweep_step_is_what_predict_says_of_that_input(client, digits):
    """Sent as the model's input (preprocess=none), the sweep's step is the same input transformed (up to
    the PNG's 8 bits) and the model reads it as /predict reads that PNG (lengths within what 8-bit pixels
    and the batch's composition move them)."""
    image = digits[0][1]
    body = post(client, image, transform="rotate", start=-30, stop=30, steps=7, preprocess="none").json()
    assert [s["value"] for s in body["steps"]] == pytest.approx(np.linspace(-30, 30, 7).tolist())
    mine = sweep(image.astype(np.float32) / 255, "rotate", np.linspace(-30, 30, 7))
    for item, expected in zip(body["steps"], mine, strict=True):
        shown = png(item["input"])
        np.testing.assert_allclose(shown, expected, atol=0.5 / 255 + 1e-6)
        alone = client.post(
            "/predict",
            params={"preprocess": "none", "include": "capsules"},
            files={"file": ("step.png", encode(np.round(shown * 255).astype(np.uint8)), "image/png")},
        ).json()
        assert alone["prediction"] == item["prediction"]
        np.testing.assert_allclose(alone["probabilities"], item["lengths"], atol=0.03)
        np.testing.assert_allclose(alone["capsules"][body["follow"]["digit"]], item["capsule"], atol=0.03)


def test_the_capsule_followed_is_the_answers_and_holds_at_identity(client, digits):
    image, label = digits[0][0], int(digits[1][0])
    body = post(client, image, transform="shift_x", start=-2, stop=2, steps=5).json()
    assert body["follow"] == {"digit": label, "label": str(label)} and body["original"]["prediction"] == label
    middle = body["steps"][2]
    assert middle["value"] == 0.0
    np.testing.assert_allclose(middle["capsule"], body["original"]["capsule"], atol=1e-4)  # the same pixels
    assert all(
        len(s["capsule"]) == contract.CAPSULE_DIM and len(s["lengths"]) == contract.NUM_CLASSES for s in body["steps"]
    )
    other = post(client, image, transform="shift_x", steps=3, follow=(label + 1) % 10, include="capsules").json()
    assert other["follow"]["digit"] == (label + 1) % 10
    for item in other["steps"]:
        assert item["capsule"] == item["capsules"][(label + 1) % 10]
        assert "input" not in item and "reconstruction" not in item


def test_rotating_a_digit_far_enough_breaks_the_answer_but_small_turns_keep_it(client, digits):
    image, label = digits[0][0], int(digits[1][0])  # a 7
    body = post(client, image, transform="rotate", start=-10, stop=10, steps=5, include="").json()
    assert all(s["prediction"] == label for s in body["steps"])
    lengths = np.array([s["lengths"][label] for s in body["steps"]])
    assert lengths.min() > 0.5
    upside = post(client, image, transform="rotate", start=180, stop=180, steps=2, include="").json()
    assert upside["steps"][0]["lengths"][label] < body["original"]["lengths"][label]


@pytest.mark.parametrize("name", list(contract.SHIPPED))
def test_every_model_explains_at_its_size(client, name, digits):
    size = client.get("/models").json()
    size = next(m["input_size"] for m in size["models"] if m["name"] == name)
    body = post(client, digits[0][3], model=name, transform="scale", steps=4).json()
    assert len(body["steps"]) == 4 and body["model"]["name"] == name
    for item in body["steps"]:
        assert png(item["input"]).shape == png(item["reconstruction"]).shape == (size, size)
    assert png(body["input"]).shape == (size, size)


def test_a_twenty_step_sweep_runs_as_one_batch(client, digits):
    """The sweep's 20 inputs reach the model as one ONNX Runtime run (the batch-size histogram of the
    capsnet graph counts one more batch of 20 or more rows)."""

    def batches(text: str) -> tuple[float, float]:
        count = big = 0.0
        for line in text.splitlines():
            if line.startswith("capsnet_batch_size_count") and 'model="mnist"' in line:
                count = float(line.rsplit(" ", 1)[1])
            if line.startswith("capsnet_batch_size_bucket") and 'model="mnist"' in line and 'le="16.0"' in line:
                big = float(line.rsplit(" ", 1)[1])
        return count, big

    before = batches(client.get("/metrics").text)
    assert post(client, digits[0][4], transform="shear", steps=20, include="").status_code == 200
    after = batches(client.get("/metrics").text)
    assert after[0] - before[0] == 2  # the untransformed input, then the whole sweep
    assert after[1] - before[1] == 1  # of which one was small: the sweep was the batch of 20


@pytest.mark.parametrize(
    "params, words",
    [
        ({"steps": 10_000}, "less than or equal to 64"),
        ({"steps": 1}, "greater than or equal to 2"),
        ({"start": "nan"}, "outside what rotate takes"),
        ({"stop": "inf"}, "outside what rotate takes"),
        ({"start": 1e300}, "outside what rotate takes"),
        ({"transform": "scale", "start": 0}, "0.25 to 4"),
        ({"transform": "twirl"}, "transform"),
        ({"include": "everything"}, "unknown part"),
        ({"follow": 10}, "less than or equal to 9"),
        ({"follow": "0_1"}, "leave out the underscores"),
        ({"steps": "1_0"}, "leave out the underscores"),
        ({"start": "1_0.5"}, "leave out the underscores"),
        ({"model": "nope"}, "no model is called"),
    ],
)
def test_hostile_sweeps_are_refused_in_words(client, digits, params, words):
    r = post(client, digits[0][0], **params)
    assert 400 <= r.status_code < 500 and words in r.json()["detail"], r.text


def test_the_documented_sweep_numbers_keep_their_bounds(client):
    """The checks on how a query's number is written leave its documented bounds as they were."""
    operation = client.get("/openapi.json").json()["paths"]["/explain"]["post"]
    parameters = {p["name"]: p["schema"] for p in operation["parameters"]}
    assert (parameters["steps"]["minimum"], parameters["steps"]["maximum"]) == (2, MAX_SWEEP_STEPS)
    follow = next(s for s in parameters["follow"]["anyOf"] if s["type"] == "integer")
    assert (follow["minimum"], follow["maximum"]) == (0, 9)


def test_transform_limits_hold_their_defaults():
    assert list(get_args(TransformName)) == list(TRANSFORMS)  # the route's choices are the table's
    for name, t in TRANSFORMS.items():
        low, high = t.limits
        assert low <= t.default[0] < t.default[1] <= high and low <= t.identity <= high, name
        assert math.isfinite(low) and math.isfinite(high)
