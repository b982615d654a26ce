"""The Transform panel (frontend/sweeps.py and its handlers) against the real API: a sweep of the answer's
own input for the tab's model and its partner, drawn at the slider's value without another call."""

import asyncio

import gradio as gr
import numpy as np
import pytest

from frontend import layout, plots
from frontend.client import ApiClient
from frontend.handlers import choose_sweep, follow_up, regrid, slide, slider_labels, sweep_answer
from frontend.screen import ANSWER, DRAWING, Screen, gated
from frontend.sweeps import DEFAULT, SWEEPS, Sweep, explain, framed, holds, shown, step_at
from frontend.tabs import EXAMPLES, PAIR_EXAMPLES, tabs_from
from model.contract import CAPSULE_DIM


@pytest.fixture(scope="module")
def tabs(api_url):
    return {tab.model: tab for tab in tabs_from(ApiClient(api_url, timeout_s=30.0).models())}


@pytest.fixture(scope="module")
def uis(tabs):
    with gr.Blocks():
        page = layout.page(list(tabs.values()))
    return {ui.tab.model: ui for ui in page.tabs}


@pytest.fixture(scope="module")
def seven(api_url, tabs):
    return ApiClient(api_url, timeout_s=30.0).predict(EXAMPLES[7].read_bytes(), "mnist")


def test_the_digit_models_are_each_others_partners(tabs):
    assert tabs["mnist"].partner.model == "affine" and tabs["affine"].partner.model == "mnist"
    assert tabs["fashion-mnist"].partner is None and tabs["multimnist"].partner is None


def test_framed_centres_the_same_pixels_on_another_frame():
    x = np.zeros((28, 28), np.uint8)
    x[10:18, 12:15] = 255
    padded = framed(x, 40)
    assert padded.shape == (40, 40) and padded.sum() == x.sum() and padded[16:24, 18:21].all()
    assert np.array_equal(framed(padded, 28), x)


def test_a_sweep_reads_the_answers_input_by_both_models(client, tabs, seven):
    sweep = explain(client, tabs["mnist"], seven, "rotate", 7)
    spec = SWEEPS["rotate"]
    assert [model for model, _ in sweep.answers] == ["mnist", "affine"]
    np.testing.assert_allclose(sweep.values, np.arange(spec.start, spec.stop + spec.step / 2, spec.step))
    for _, answer in sweep.answers:
        assert answer["follow"]["digit"] == 7 and len(answer["steps"]) == spec.steps
    # the mnist sweep's untransformed input is the answer's own: its capsule at 0 degrees is the answer's
    middle = sweep.answers[0][1]["steps"][step_at(sweep, 0.0)]
    np.testing.assert_allclose(middle["capsule"], seven["capsules"][7], atol=0.03)
    assert holds(sweep, sweep.answers[0][1]).startswith(("from", "over the whole sweep"))


def test_the_panel_at_a_value_names_each_models_reading_and_marks_that_step(client, tabs, seven):
    sweep = explain(client, tabs["mnist"], seven, "rotate", 7)
    at_zero, at_thirty = shown(sweep, tabs["mnist"], 0.0), shown(sweep, tabs["mnist"], 31.0)
    assert set(at_zero) == {"status", "input", "drawn", "partner_input", "partner_drawn", "lengths", "dimensions"}
    assert "Rotate 30°" in at_thirty["status"] and "`mnist` reads" in at_thirty["status"]
    assert "`affine` reads" in at_thirty["status"]
    assert not np.array_equal(np.asarray(at_zero["input"]), np.asarray(at_thirty["input"]))  # the turned input
    assert at_zero["input"].size == (28 * 5, 28 * 5) and at_zero["partner_input"].size == (40 * 5, 40 * 5)
    assert not np.array_equal(np.asarray(at_zero["lengths"]), np.asarray(at_thirty["lengths"]))  # the marker moved


def test_the_slider_redraws_from_the_sweep_without_asking_the_api(client, uis, seven):
    ui = uis["mnist"]
    drawn = sweep_answer(client, ui, seven, "scale")
    sweep = drawn[ui.transform.sweep]
    assert isinstance(sweep, Sweep) and sweep.transform == "scale"
    assert drawn[ui.transform.status].startswith("**Scale 1x**")
    moved = slide(ui, sweep, 1.3)  # the sweep is all it needs: no client at all
    assert "Scale 1.3x" in moved[ui.transform.status]
    assert set(moved) == set(ui.transform.outputs.values())


def test_the_follow_up_sweeps_only_when_the_panel_is_open(client, uis, seven):
    ui = uis["mnist"]
    for opened in (False, True):
        screen = Screen(DRAWING)
        gated(lambda: {ui.status: "", ANSWER: seven}, DRAWING)(screen)
        followed = follow_up(client, ui, screen, opened, "shear", *[0.0] * CAPSULE_DIM)
        assert (ui.transform.sweep in followed) is opened
    assert followed[ui.transform.sweep].transform == "shear"


def test_no_answer_blanks_the_panel(client, uis):
    ui = uis["mnist"]
    blank = sweep_answer(client, ui, None, DEFAULT)
    assert blank[ui.transform.sweep] is None and blank[ui.transform.lengths] is None


def test_sweep_charts_mark_the_slider_step():
    values = np.linspace(-45, 45, 19)
    lengths = np.full((19, 10), 0.05, np.float32)
    lengths[:, 7] = 0.95
    chart = np.asarray(plots.sweep_lengths(values, [("mnist", lengths, plots.WINNER)], 7, 9))
    first = np.asarray(plots.sweep_lengths(values, [("mnist", lengths, plots.WINNER)], 7, 0))
    assert not np.array_equal(chart, first)
    capsules = np.sin(np.linspace(0, 3, 19))[:, None] * np.linspace(0.01, 0.3, 16)[None]
    grid = plots.sweep_dimensions(values, capsules, 3, [f"dim {d + 1}" for d in range(16)])
    accent = np.all(np.asarray(grid) == plots.WINNER, axis=-1)
    assert accent.any()  # the dimensions that move most are drawn in the accent colour


def test_the_sliders_say_what_each_dimension_does(client, uis, tabs, seven):
    """The perturbation sliders of the chosen capsule take its card's words (GET /models' dimensions),
    counted from 0 as the card counts them; another capsule, other words. An answer's follow-up names them
    for its capsule, and a capsule picked in the panel for that one."""
    ui, words = uis["mnist"], tabs["mnist"].dimensions
    assert words is not None and len(words["7"]) == CAPSULE_DIM
    names = {d: [update.label for update in slider_labels(ui, d).values()] for d in (3, 7)}
    assert list(slider_labels(ui, 7)) == ui.panel.sliders
    assert names[7] == [f"dim {d}: {words['7'][d]}" for d in range(CAPSULE_DIM)] and names[7] != names[3]
    assert slider_labels(ui, None) == {}  # the capsules cleared: the names stay
    screen = Screen(DRAWING)
    gated(lambda: {ui.status: "", ANSWER: seven}, DRAWING)(screen)
    followed = follow_up(client, ui, screen, False, DEFAULT, *[0.0] * CAPSULE_DIM)
    assert [followed[slider].label for slider in ui.panel.sliders] == names[7]
    picked = regrid(client, ui, seven["capsules"], 3)
    assert [picked[slider].label for slider in ui.panel.sliders] == names[3] and ui.panel.grid in picked


def gradio_takes(answer, outputs: int) -> None:
    """Gradio's own check of what an event function with `outputs` outputs returned (an empty dict, for one,
    is a missing value: a traceback in the demo's log)."""
    with gr.Blocks() as blocks:
        event = gr.Button().click(lambda: answer, None, [gr.Number() for _ in range(outputs)])
    asyncio.run(blocks.postprocess_data(blocks.fns[event["id"]], answer, None))


def test_nothing_to_say_is_an_answer_gradio_takes(client, uis):
    """No capsule chosen, no sweep yet, the panel closed: each handler says nothing in a form that Gradio
    takes for every one of its outputs."""
    ui = uis["mnist"]
    gradio_takes(slide(ui, None, 0.0), len(ui.transform.outputs))
    gradio_takes(choose_sweep(client, ui, Screen(), False, "rotate", 7), len(ui.transform.outputs))
    with pytest.raises(ValueError, match="enough output values"):
        gradio_takes({}, 2)


def test_a_pairs_second_digit_can_be_followed(client, uis):
    """MultiMNIST per object: the capsule picked in the perturbation panel (the green digit) is the one the
    sweep follows; with the panel closed nothing is asked."""
    ui = uis["multimnist"]
    answer = client.predict(PAIR_EXAMPLES[0].read_bytes(), "multimnist")
    second = int(answer["objects"][1]["digit"])
    screen = Screen(DRAWING)
    gated(lambda: {ui.status: "", ANSWER: answer}, DRAWING)(screen)
    assert choose_sweep(client, ui, screen, False, "rotate", second) == gr.skip()
    drawn = choose_sweep(client, ui, screen, True, "rotate", second)
    sweep = drawn[ui.transform.sweep]
    assert sweep.followed == second and [m for m, _ in sweep.answers] == ["multimnist"]
    assert f"following the {second} capsule" in drawn[ui.transform.status]
    assert all(len(step["capsule"]) == CAPSULE_DIM for step in sweep.answers[0][1]["steps"])
