"""Handlers: what the demo does for an event. First plain functions of (client, inputs) -> a view or an
image, testable alone; then the events' own, which return Gradio updates keyed by component (a tab's
TabUI names them), so no list of outputs has to match an order. frontend/events.py binds them."""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image

from frontend import plots
from frontend.client import ApiClient, ApiError
from frontend.layout import TabUI, upload_tab_id
from frontend.pad import drawing_png
from frontend.screen import Screen
from frontend.tabs import Tab
from frontend.views import View, footer_text, message_view, picked, routing_maps, updates
from model.contract import CAPSULE_DIM, PERTURB_LIMIT, PERTURB_STEP

# The paper's Fig. 4 perturbations: -0.25, -0.20, ..., +0.25 (11 steps of 0.05).
OFFSETS = np.linspace(-PERTURB_LIMIT, PERTURB_LIMIT, round(2 * PERTURB_LIMIT / PERTURB_STEP) + 1)


# -------------------------------------------------------------------------------------------------
# Views and images
def predict_png(client: ApiClient, tab: Tab, png: bytes | None) -> View:
    if png is None:
        return message_view(tab.view, tab.look.prompt)
    try:
        answer = client.predict(png, tab.model)
    except ApiError as error:
        return message_view(tab.view, str(error))
    return tab.view.of(answer, tab.classes, client.base_url)


def predict_drawing(client: ApiClient, tab: Tab, drawing: str | None) -> View:
    """The view of the pad's drawing (a PNG data URL, see frontend.pad), or the prompt if nothing is drawn."""
    try:
        png = drawing_png(drawing)
    except ValueError:
        return message_view(tab.view, "⚠️ The drawing did not arrive as a PNG image; draw it again.")
    return predict_png(client, tab, png)


def predict_upload(client: ApiClient, tab: Tab, path: str | None) -> View:
    return predict_png(client, tab, Path(path).read_bytes() if path else None)


def routing_view(tab: Tab, answer: dict[str, Any] | None) -> Image.Image | None:
    """The routing maps of the answer on screen (none without one)."""
    return None if answer is None else routing_maps(answer, tab.classes)


def perturb(
    client: ApiClient, capsules: list[list[float]] | None, digit: int | None, *deltas: float, model: str | None = None
) -> Image.Image | None:
    """The reconstruction from `digit`'s capsule with `deltas` (one per dimension) added to it."""
    if capsules is None or digit is None:
        return None
    capsule = np.asarray(capsules, dtype=np.float32)[digit] + np.asarray(deltas, dtype=np.float32)
    try:
        return plots.digit(client.reconstruct([digit], capsule[None], model)[0])
    except ApiError as error:
        gr.Warning(str(error))
        return None


def fig4_tiles(client: ApiClient, capsule: np.ndarray, digit: int, model: str | None = None) -> np.ndarray:
    """Fig. 4 for one capsule: (16, 11, S, S) at the model's input size S, row d adds OFFSETS to
    dimension d; one batch call."""
    dims, steps = CAPSULE_DIM, len(OFFSETS)
    batch = np.repeat(capsule[None, None], dims, 0).repeat(steps, 1)  # (16, 11, 16)
    batch[np.arange(dims), :, np.arange(dims)] += OFFSETS
    tiles = client.reconstruct([digit] * (dims * steps), batch.reshape(-1, dims), model)
    return tiles.reshape(dims, steps, *tiles.shape[1:])


def fig4(
    client: ApiClient, capsules: list[list[float]] | None, digit: int | None, model: str | None = None
) -> Image.Image | None:
    if capsules is None or digit is None:
        return None
    try:
        tiles = fig4_tiles(client, np.asarray(capsules, dtype=np.float32)[digit], digit, model)
    except ApiError as error:
        gr.Warning(str(error))
        return None
    return plots.fig4_grid(tiles, OFFSETS)


def model_footer(client: ApiClient, model: str | None = None) -> str:
    try:
        card = client.model(model)
    except ApiError as error:
        return str(error)
    return footer_text(card["served_as"], card["version"], card["providers"][0], client.base_url)


# -------------------------------------------------------------------------------------------------
# The events' handlers: updates keyed by component
def answer_drawing(client: ApiClient, ui: TabUI, drawing: str | None) -> dict:
    return updates(predict_drawing(client, ui.tab, drawing), ui.outputs)


def answer_upload(client: ApiClient, ui: TabUI, path: str | None) -> dict:
    return updates(predict_upload(client, ui.tab, path), ui.outputs)


def ask(ui: TabUI) -> dict:
    """Nothing to answer (a cleared pad or upload): the tab's prompt, every picture blank."""
    return updates(message_view(ui.tab.view, ui.tab.look.prompt), ui.outputs)


def answer_example(client: ApiClient, ui: TabUI, index: int) -> dict:
    """The example `index` of the tab, shown in the upload (the Upload tab selected, in a tab with a pad;
    the same event, so no tab select of its own follows), and its view."""
    path = str(ui.tab.look.examples[index])
    upload_in_view = {ui.inputs.tabs: gr.Tabs(selected=upload_tab_id(ui.tab))} if ui.inputs.tabs else {}
    return {**upload_in_view, ui.inputs.upload: path, **answer_upload(client, ui, path)}


def follow_up(client: ApiClient, ui: TabUI, screen: Screen, *deltas: float) -> Iterator[dict]:
    """What follows the answer on screen, each part as soon as it is drawn: its routing maps, its capsule
    (the one the answer's view picked) perturbed by the sliders, its Fig. 4 grid. Nothing when that answer
    has been followed up already (by the follow-up of a prediction whose answer was dropped, see Screen).
    The answer is the Screen's as this runs, not the one the event was sent with."""
    due, answer = screen.follow()
    if not due:
        yield gr.skip()
        return
    panel, model = ui.panel, ui.tab.model
    yield {ui.routing: routing_view(ui.tab, answer)}
    capsules, digit = (answer["capsules"], picked(answer)) if answer else (None, None)
    yield {panel.perturbed: perturb(client, capsules, digit, *deltas, model=model)}
    yield {panel.grid: fig4(client, capsules, digit, model=model)}


def redraw(client: ApiClient, ui: TabUI, capsules: list[list[float]] | None, digit: int | None, *deltas: float) -> dict:
    """The chosen capsule, perturbed by the sliders."""
    return {ui.panel.perturbed: perturb(client, capsules, digit, *deltas, model=ui.tab.model)}


def regrid(client: ApiClient, ui: TabUI, capsules: list[list[float]] | None, digit: int | None) -> dict:
    """The chosen capsule's Fig. 4."""
    return {ui.panel.grid: fig4(client, capsules, digit, model=ui.tab.model)}


def reset_sliders(ui: TabUI) -> dict:
    return {slider: 0.0 for slider in ui.panel.sliders}


def show_footer(client: ApiClient, ui: TabUI) -> dict:
    """The footer names the model of the tab in view."""
    return {ui.footer: model_footer(client, ui.tab.model)}
