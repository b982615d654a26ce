"""Routing, iteration by iteration, in the demo: the answer carries every iteration's maps (GET /models says
which models can), the slider shows iteration r and says what it changed (Procedure 1, Fig. A.1)."""

import gradio as gr
import numpy as np
import pytest

from frontend import layout, plots
from frontend.client import ApiClient
from frontend.handlers import follow_up, iteration_words, routing_view, show_iteration
from frontend.screen import ANSWER, DRAWING, Screen, gated
from frontend.sweeps import DEFAULT
from frontend.tabs import EXAMPLES, tabs_from
from model.contract import CAPSULE_DIM


@pytest.fixture(scope="module")
def uis(api_url):
    tabs = tabs_from(ApiClient(api_url, timeout_s=30.0).models())
    with gr.Blocks():
        page = layout.page(tabs)
    return {ui.tab.model: ui for ui in page.tabs}


@pytest.fixture(scope="module")
def seven(api_url, uis):
    return ApiClient(api_url, timeout_s=30.0).predict(EXAMPLES[7].read_bytes(), "mnist", uis["mnist"].tab.iterations)


def shown(screen_answer, ui) -> Screen:
    screen = Screen(DRAWING)
    gated(lambda: {ui.status: "", ANSWER: screen_answer}, DRAWING)(screen)
    return screen


def test_every_shipped_model_answers_with_its_iterations(uis):
    assert all(ui.tab.iterations for ui in uis.values())


def test_the_slider_steps_from_uniform_couplings_to_agreement(uis, seven):
    ui = uis["mnist"]
    iterations = seven["routing"]["iterations"]
    assert [it["iteration"] for it in iterations] == [1, 2, 3]
    screen = shown(seven, ui)
    first, last = show_iteration(ui, screen, 1), show_iteration(ui, screen, 3)
    assert np.array_equal(np.asarray(last[ui.routing.maps]), np.asarray(routing_view(ui.tab, seven)))
    assert not np.array_equal(np.asarray(first[ui.routing.maps]), np.asarray(last[ui.routing.maps]))
    assert "1/10" in first[ui.routing.change] and "Iteration 1 of 3" in first[ui.routing.change]
    assert f"{iterations[2]['coupling_change']:.4f}" in last[ui.routing.change]


def test_the_follow_up_shows_the_last_iteration_and_the_slider(client, uis, seven):
    ui = uis["mnist"]
    followed = follow_up(client, ui, shown(seven, ui), False, DEFAULT, *[0.0] * CAPSULE_DIM)
    slider = followed[ui.routing.iteration]
    assert slider.maximum == 3 and slider.value == 3 and slider.visible
    assert "Iteration 3 of 3" in followed[ui.routing.change]


def test_an_answer_without_iterations_hides_the_slider(client, uis, seven):
    ui = uis["mnist"]
    plain = {**seven, "routing": {k: v for k, v in seven["routing"].items() if k != "iterations"}}
    followed = follow_up(client, ui, shown(plain, ui), False, DEFAULT, *[0.0] * CAPSULE_DIM)
    assert followed[ui.routing.iteration].visible is False and followed[ui.routing.change] == ""
    assert iteration_words(None, 1) == ""


def test_every_iteration_is_drawn_on_one_scale(uis, seven):
    """Stepping through the iterations shows the votes gathering: the brightest cell of the last iteration is
    the scale's top, and the first iteration, whose couplings are all 1/10, stays below it."""
    ui = uis["mnist"]
    top = tuple(int(c) for c in plots.heat(np.array([1.0]))[0])
    brightest = [(np.asarray(routing_view(ui.tab, seven, r)) == top).all(axis=-1).any() for r in range(1, 4)]
    assert brightest == [False, False, True]
