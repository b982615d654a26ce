"""Handlers: what the demo does for an event. First plain functions of (client, inputs) -> a view or an
image, testable alone; then the events' own, which return Gradio updates keyed by component (a tab's
TabUI names them), so no list of outputs has to match an order. frontend/events.py binds them."""

import io
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import gradio as gr
import numpy as np
from PIL import Image, ImageOps

from frontend import plots, sweeps
from frontend.client import ApiClient, ApiError
from frontend.layout import TAB_LABELS, TabUI, slider_of, upload_tab_id
from frontend.pad import drawing_png
from frontend.screen import DRAWING, UPLOAD, Screen, gated
from frontend.tabs import Tab
from frontend.views import View, footer_text, message_view, picked, routing_maps, updates
from model.contract import CAPSULE_DIM, MAX_PIXELS, PERTURB_LIMIT, PERTURB_STEP, WORK_SIZE

NO_FILE = "⚠️ The upload arrived without its file; upload the image as a file."
# An upload larger than the API takes in a request is sent again at most this side (px): the API reads a larger
# picture reduced to it
SENT_SIDE = WORK_SIZE
# The paper's Fig. 4 perturbations: -0.25, -0.20, ..., +0.25 (11 steps of 0.05).
OFFSETS = np.linspace(-PERTURB_LIMIT, PERTURB_LIMIT, round(2 * PERTURB_LIMIT / PERTURB_STEP) + 1)


# -------------------------------------------------------------------------------------------------
# Views and images
def predict_png(client: ApiClient, tab: Tab, png: bytes | None, note: str | None = None) -> View:
    """The view of an image file (the prompt for none). A file larger than the API takes in a request (a phone's
    photo, a large screenshot: 413) is sent again reduced (`reduced`), and its answer says so (`note`)."""
    if png is None:
        return message_view(tab.view, tab.look.prompt)
    try:
        answer = client.predict(png, tab.model, tab.iterations)
    except ApiError as error:
        if error.status == 413 and note is None and (smaller := reduced(png)) is not None:
            return predict_png(client, tab, *smaller)
        return message_view(tab.view, str(error))
    if note:
        answer["warnings"].insert(0, note)
    return tab.view.of(answer, tab.classes, client.public_url)


def reduced(data: bytes, side: int = SENT_SIDE) -> tuple[bytes, str] | None:
    """An image file's picture upright and at most `side` px a side, as a PNG that keeps its transparency, and a
    sentence saying so; None where Pillow cannot read it or it has more pixels than the API reads (the API's
    answer then says what is wrong)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                return None
            image.draft(image.mode, (side, side))  # a JPEG decoded at a reduced scale
            picture = ImageOps.exif_transpose(image)
            if picture.mode not in ("L", "LA", "RGB", "RGBA"):
                picture = picture.convert("RGBA")
            picture.thumbnail((side, side))
            buffer = io.BytesIO()
            picture.save(buffer, "PNG")
    except (OSError, ValueError, Image.DecompressionBombError):
        return None
    note = (
        f"the file is larger than the service takes in one request, so the demo sent its picture reduced from "
        f"{width}x{height} to {picture.width}x{picture.height} px"
    )
    return buffer.getvalue(), note


def predict_drawing(client: ApiClient, tab: Tab, drawing: str | None) -> View:
    """The view of the pad's drawing (a PNG data URL, see frontend.pad), or the prompt if nothing is drawn."""
    try:
        png = drawing_png(drawing)
    except ValueError:
        return message_view(tab.view, "⚠️ The drawing did not arrive as a PNG image; draw it again.")
    return predict_png(client, tab, png)


def predict_upload(client: ApiClient, tab: Tab, path: str | None) -> View:
    return predict_png(client, tab, Path(path).read_bytes() if path else None)


def routing_view(tab: Tab, answer: dict[str, Any] | None, iteration: int | None = None) -> Image.Image | None:
    """The routing maps of the answer on screen at routing iteration r (the last without one; none without
    an answer)."""
    return None if answer is None else routing_maps(answer, tab.classes, iteration)


def iteration_words(answer: dict[str, Any] | None, iteration: int) -> str:
    """What routing iteration r did: the couplings' and the logits' mean change (Fig. A.1's quantity)."""
    iterations = (answer or {}).get("routing", {}).get("iterations")
    if not iterations:
        return ""
    step = iterations[iteration - 1]
    if iteration == 1:
        coupling = "every coupling c<sub>ij</sub> is 1/10: each child splits its vote evenly"
    else:
        coupling = f"the couplings moved by {step['coupling_change']:.4f} on average (mean |Δc<sub>ij</sub>|)"
    return (
        f"**Iteration {iteration} of {len(iterations)}**: {coupling}; the agreement it adds to the logits "
        f"b<sub>ij</sub> is {step['logit_change']:.3f} on average (mean |û·v|, Fig. A.1)."
    )


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
    return footer_text(card["served_as"], card["version"], card["providers"][0], client.public_url)


# -------------------------------------------------------------------------------------------------
# The events' handlers: updates keyed by component
def answer_drawing(client: ApiClient, ui: TabUI, drawing: str | None) -> dict:
    return updates(predict_drawing(client, ui.tab, drawing), ui.outputs)


def answer_upload(client: ApiClient, ui: TabUI, upload: dict[str, Any] | None) -> dict:
    """The view of an uploaded file as Gradio stored it (`upload`: its ImageData, as a dict; None: nothing).

    The upload's events skip Gradio's preprocessing (frontend/events.py), which would open the file with
    Pillow and convert it to RGB: a transparent PNG's ink, held in its alpha over black pixels, would reach
    the API as a black square, and a file that is not an image would fail in Gradio with no sentence. The
    file goes to the API as it was sent, which reads it or says why not. Gradio has checked that the path
    is one of its uploads before the handler runs; an event sent by hand without one (a data URL) is told
    to send a file."""
    if upload is not None and not upload.get("path"):
        return updates(message_view(ui.tab.view, NO_FILE), ui.outputs)
    return answer_path(client, ui, upload["path"] if upload else None)


def answer_path(client: ApiClient, ui: TabUI, path: str | None) -> dict:
    return updates(predict_upload(client, ui.tab, path), ui.outputs)


def ask(ui: TabUI) -> dict:
    """Nothing to answer (a cleared pad or upload): the tab's prompt, every picture blank."""
    return updates(message_view(ui.tab.view, ui.tab.look.prompt), ui.outputs)


def answer_tab(client: ApiClient, ui: TabUI) -> Callable[..., dict]:
    """The event function of a person's click on the Draw or Upload tab (the Tabs' select, `selected`): the
    input that tab holds answers, unless it is on screen already (gated)."""
    drawn = gated(partial(answer_drawing, client, ui), DRAWING, tab_select=True)
    uploaded = gated(partial(answer_upload, client, ui), UPLOAD, tab_select=True)

    def run(screen: Screen, drawing: str | None, upload: dict[str, Any] | None, selected: gr.SelectData) -> dict:
        return uploaded(screen, upload) if selected.value == TAB_LABELS[UPLOAD] else drawn(screen, drawing)

    return run


def answer_example(client: ApiClient, ui: TabUI, index: int) -> dict:
    """The example `index` of the tab, shown in the upload (the Upload tab selected, in a tab with a pad:
    a tab brought into view by an answer sends no select of its own), and its view."""
    path = str(ui.tab.look.examples[index])
    upload_in_view = {ui.inputs.tabs: gr.Tabs(selected=upload_tab_id(ui.tab))} if ui.inputs.tabs else {}
    return {**upload_in_view, ui.inputs.upload: path, **answer_path(client, ui, path)}


def follow_up(client: ApiClient, ui: TabUI, screen: Screen, opened: bool, transform: str, *deltas: float) -> dict:
    """What follows the answer on screen, in one update: its routing maps (the last iteration), its capsule
    (the one the answer's view picked) perturbed by the sliders, its Fig. 4 grid, the sliders named for that
    capsule, and its sweep when the Transform panel is open (`opened`). Nothing when that answer has been
    followed up already (by the follow-up of a prediction whose answer was dropped, see Screen). The answer
    is the Screen's as this runs, not the one the event was sent with.

    One update, not a part at a time: Gradio's page applies a generator's later outputs as diffs, in place,
    to the objects of the earlier ones, which it hands to the components, sometimes a frame later, so an
    image of an earlier output can lose its url before it is drawn."""
    due, answer = screen.follow()
    if not due:
        return gr.skip()
    panel, model, routing = ui.panel, ui.tab.model, ui.routing
    last = len((answer or {}).get("routing", {}).get("iterations") or [])
    capsules, digit = (answer["capsules"], picked(answer)) if answer else (None, None)
    return {
        routing.maps: routing_view(ui.tab, answer),
        routing.iteration: gr.Slider(maximum=last, value=last, visible=True) if last else gr.Slider(visible=False),
        routing.change: iteration_words(answer, last),
        panel.perturbed: perturb(client, capsules, digit, *deltas, model=model),
        panel.grid: fig4(client, capsules, digit, model=model),
        **slider_labels(ui, digit),
        **(sweep_answer(client, ui, answer, transform) if opened else {}),
    }


def redraw(client: ApiClient, ui: TabUI, capsules: list[list[float]] | None, digit: int | None, *deltas: float) -> dict:
    """The chosen capsule, perturbed by the sliders."""
    return {ui.panel.perturbed: perturb(client, capsules, digit, *deltas, model=ui.tab.model)}


def regrid(client: ApiClient, ui: TabUI, capsules: list[list[float]] | None, digit: int | None) -> dict:
    """The chosen capsule's Fig. 4, and its sliders named."""
    return {ui.panel.grid: fig4(client, capsules, digit, model=ui.tab.model), **slider_labels(ui, digit)}


def show_iteration(ui: TabUI, screen: Screen, iteration: int) -> dict:
    """The routing maps of the answer on screen at iteration r, and what that iteration changed."""
    answer = screen.answer
    return {
        ui.routing.maps: routing_view(ui.tab, answer, int(iteration)),
        ui.routing.change: iteration_words(answer, int(iteration)),
    }


def sweep_answer(
    client: ApiClient, ui: TabUI, answer: dict[str, Any] | None, transform: str, digit: int | None = None
) -> dict:
    """The Transform panel for an answer: its sweep (one POST /explain per model) following the capsule of
    `digit` (the one the perturbation panel decodes; the answer's by default), the slider at the
    transform's identity over its range, and the panel drawn there; blank without an answer."""
    panel = ui.transform
    slider = slider_of(transform)
    if answer is None:
        return {panel.sweep: None, panel.value: slider, **dict.fromkeys(panel.outputs.values())}
    followed = picked(answer) if digit is None else int(digit)
    try:
        sweep = sweeps.explain(client, ui.tab, answer, transform, followed)
    except ApiError as error:
        return {panel.sweep: None, panel.value: slider, panel.status: str(error)}
    drawn = sweeps.shown(sweep, ui.tab, sweeps.SWEEPS[transform].identity)
    return {panel.sweep: sweep, panel.value: slider, **{panel.outputs[k]: v for k, v in drawn.items()}}


def open_transform(client: ApiClient, ui: TabUI, screen: Screen, transform: str, digit: int | None) -> dict:
    """The panel opened: it sweeps the answer on screen from now on, starting now."""
    return {ui.transform.open: True, **sweep_answer(client, ui, screen.answer, transform, digit)}


def close_transform(ui: TabUI) -> dict:
    return {ui.transform.open: False}


def choose_sweep(client: ApiClient, ui: TabUI, screen: Screen, opened: bool, transform: str, digit: int | None) -> dict:
    """Another transform, or another capsule picked (a pair's second digit): sweep again if the panel is open."""
    return sweep_answer(client, ui, screen.answer, transform, digit) if opened else gr.skip()


def slide(ui: TabUI, sweep: sweeps.Sweep | None, value: float) -> dict:
    """The panel at the slider's value: no call, the sweep has every step."""
    if sweep is None:
        return gr.skip()
    panel = ui.transform
    return {panel.outputs[k]: v for k, v in sweeps.shown(sweep, ui.tab, value).items()}


def slider_labels(ui: TabUI, digit: int | None) -> dict:
    """The perturbation sliders named by what each dimension of the capsule of `digit` does (its card's words);
    no update without a capsule (the capsules cleared)."""
    if digit is None:
        return {}
    labels = sweeps.dimension_labels(ui.tab, int(digit))
    return {slider: gr.Slider(label=label) for slider, label in zip(ui.panel.sliders, labels, strict=True)}


def reset_sliders(ui: TabUI) -> dict:
    return {slider: 0.0 for slider in ui.panel.sliders}


def show_footer(client: ApiClient, ui: TabUI) -> dict:
    """The footer names the model of the tab in view."""
    return {ui.footer: model_footer(client, ui.tab.model)}
