"""The CapsNet demo: a tab per model; draw or upload, see the capsules and the routing, perturb the 16 dimensions.

A Gradio app that asks the API over HTTP (it imports neither app/ nor torch) and lets a person
explore the models the way sections 5.1 and 6 and Figs. 4 and 5 of the paper (Sabour, Frosst & Hinton
2017, "Dynamic Routing Between Capsules", https://arxiv.org/abs/1710.09829) do:

- Digit (model mnist): draw, upload or pick an MNIST digit; its capsule lengths, reconstruction and
  routing maps.
- Two digits (model multimnist): draw two overlapping digits or pick a generated MultiMNIST pair; both
  digits named, each redrawn from its own capsule, in red and green over the input (Fig. 5).
- Fashion (model fashion-mnist): upload or pick a garment; its class, capsules and reconstruction.

Every tab perturbs any capsule's 16 dimensions with sliders and draws the paper's Fig. 4 grid.

$ python -m app                 # the API, http://localhost:8000
$ python -m frontend            # the demo, http://127.0.0.1:7860
$ CAPSNET_DEMO_API_URL=http://api:8000 CAPSNET_DEMO_HOST=0.0.0.0 python -m frontend
"""
import base64
import io
import threading
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, NamedTuple

import gradio as gr
import httpx
import numpy as np
import orjson
from PIL import Image
from pydantic_settings import BaseSettings, SettingsConfigDict

from frontend import plots
from frontend.pad import drawing_pad, drawing_png
from model.contract import (
    CAPSULE_DIM,
    IMAGE_SIZE,
    MULTIMNIST_SIZE,
    NUM_CLASSES,
    PERTURB_LIMIT,
    PERTURB_STEP,
    primary_grid,
)


# -------------------------------------------------------------------------------------------------
class DemoSettings(BaseSettings):
    """Where the demo listens and which API it asks (env: CAPSNET_DEMO_API_URL, ...)."""

    model_config = SettingsConfigDict(env_prefix="CAPSNET_DEMO_", env_ignore_empty=True, extra="ignore")

    api_url: str = "http://localhost:8000"
    host: str = "127.0.0.1"  # 0.0.0.0 in a container
    port: int = 7860
    timeout_s: float = 10.0  # per API call; a CPU predict takes tens of milliseconds


@lru_cache
def get_settings() -> DemoSettings:
    return DemoSettings()


EXAMPLES_DIR = Path(__file__).parent / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.joinpath("digits").glob("*.png"))  # MNIST t10k, one per class
PAIR_EXAMPLES = sorted(EXAMPLES_DIR.joinpath("pairs").glob("*.png"))  # generated MultiMNIST, named by both digits
FASHION_EXAMPLES = sorted(EXAMPLES_DIR.joinpath("fashion").glob("*.png"))  # Fashion-MNIST t10k, dark on white
DEFAULT_MODEL = "mnist"  # the API's default, and the first tab's
# The paper's Fig. 4 perturbations: -0.25, -0.20, ..., +0.25 (11 steps of 0.05).
OFFSETS = np.linspace(-PERTURB_LIMIT, PERTURB_LIMIT, round(2 * PERTURB_LIMIT / PERTURB_STEP) + 1)
DRAW_A_DIGIT = "✏️ Draw a digit on the canvas, or upload one or pick an example."
DRAW_TWO_DIGITS = "✏️ Draw two overlapping digits on the canvas, or upload a pair or pick an example."
SHOW_A_GARMENT = "👕 Upload a photo of one garment on a plain background, or pick an example."
LIVE = dict(trigger_mode="always_last", show_progress="minimal")  # while one call runs, only the last new one waits
CANVAS = 400  # px, square
# The pen's radius on the drawing pad (frontend.pad): a 28 px pen is MNIST's median stroke for a digit
# about 250 px tall, and within MNIST's range of widths (contract.STROKE_RANGE) for any digit taller than
# 120 px on this canvas, so the API need not reshape it. The canvas is white paper with a black pen
# whatever the theme, and the API reads the ink from alpha.
BRUSH_RADIUS = 14


# -------------------------------------------------------------------------------------------------
# The API, over HTTP. Every failure becomes an ApiError whose message a person can act on.
class ApiError(Exception):
    pass


class ApiClient:
    """A thin httpx client of the CapsNet service (routes and fields: DESIGN.md, app/schemas.py)."""

    def __init__(self, base_url: str, timeout_s: float, transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout_s, transport=transport)
        self.names: dict[str, list[str]] = {}  # each model's class names, once GET /models has said them

    def call(self, method: str, path: str, **kwargs) -> dict[str, Any]:
        """The API's JSON answer (orjson: a Fig. 4 grid's 176 drawings parse in 11 ms, 48 with json)."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ApiError(f"⏳ The API at {self.base_url} did not answer in time; try again.") from None
        except httpx.HTTPError:
            raise ApiError(
                f"🔌 The API at {self.base_url} is not reachable. Start it with `python -m app` "
                "(or set CAPSNET_DEMO_API_URL) and try again."
            ) from None
        if response.status_code == 503:
            raise ApiError("⏳ The API is starting up (loading and warming the model); try again in a moment.")
        if response.is_client_error:
            raise ApiError(f"⚠️ {detail(response)}")
        if response.is_error:
            raise ApiError(f"⚠️ The API failed ({response.status_code}): {detail(response)}")
        return orjson.loads(response.content)

    def predict(self, png: bytes, model: str = DEFAULT_MODEL) -> dict[str, Any]:
        return self.call(
            "POST",
            "/predict",
            params={"model": model, "include": "capsules,reconstruction,routing", "preprocess": "auto"},
            files={"file": ("image.png", png, "image/png")},
        )

    def reconstruct(self, digits: list[int], capsules: np.ndarray, model: str = DEFAULT_MODEL) -> np.ndarray:
        """Decode capsules (n, 16), each placed at its class's slot, in one batch: (n, S, S) at the model's size."""
        items = [{"digit": int(d), "capsule": c.tolist()} for d, c in zip(digits, capsules)]
        answer = self.call("POST", "/reconstruct", params={"model": model, "include": "image"}, json={"items": items})
        return np.array([r["image"] for r in answer["items"]], dtype=np.float32)

    def model(self, model: str = DEFAULT_MODEL) -> dict[str, Any]:
        return self.call("GET", "/model", params={"model": model})

    def models(self) -> dict[str, Any]:
        return self.call("GET", "/models")

    def classes(self, model: str = DEFAULT_MODEL) -> list[str]:
        """The model's class names, from GET /models (asked until it has answered once)."""
        if model not in self.names:
            self.names.update({entry["name"]: entry["classes"] for entry in self.models()["models"]})
        if model not in self.names:
            raise ApiError(f"⚠️ The API at {self.base_url} serves no model {model!r}.")
        return self.names[model]


def detail(response: httpx.Response) -> str:
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text or response.reason_phrase


def decode_data_url(url: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def footer_text(name: str, version: str, provider: str, api_url: str) -> str:
    kind = "CPU" if provider.startswith("CPU") else "GPU"
    return f"Model **{name}** · version `{version}` · runs on **{kind}** ({provider}) · API {api_url}"


# -------------------------------------------------------------------------------------------------
# Views: what one answer of the API shows, in the order of a tab's UI outputs.
def seen_image(answer: dict[str, Any]) -> Image.Image:
    """The image the model saw, at its input size, enlarged."""
    return plots.digit(np.asarray(decode_data_url(answer["input"]).convert("L")))


def marks(answer: dict[str, Any]) -> dict[int, plots.RGB]:
    """The answered classes and their colours: the prediction, or each object of a pair (red, green)."""
    if "objects" in answer:
        return {int(o["digit"]): colour for o, colour in zip(answer["objects"], plots.PAIR_COLOURS)}
    return {int(answer["prediction"]): plots.WINNER}


def picked(answer: dict[str, Any]) -> int:
    """The capsule a view perturbs first: the prediction, or the first object of a pair."""
    return next(iter(marks(answer)))


def lengths_chart(answer: dict[str, Any], names: list[str]) -> Image.Image:
    return plots.lengths_chart(np.asarray(answer["probabilities"], dtype=np.float32), marks(answer), names)


def routing_maps(answer: dict[str, Any], names: list[str]) -> Image.Image:
    """The routing maps, the answered classes first, then by capsule length."""
    lengths = np.asarray(answer["probabilities"], dtype=np.float32)
    marked = marks(answer)
    order = list(marked) + [int(j) for j in np.argsort(-lengths) if j not in marked]
    maps = np.asarray(answer["routing"]["maps"], dtype=np.float32)
    return plots.routing_heatmaps(maps, lengths, order, marked, names)


def runner_up_and_warnings(answer: dict[str, Any]) -> str:
    runner_up = answer["runner_up"]
    warnings = "".join(f"\n\n⚠️ {warning}" for warning in answer["warnings"])
    return f"runner-up {runner_up['label']} at {runner_up['length']:.3f}." + warnings


def answer_footer(answer: dict[str, Any], api_url: str) -> str:
    model = answer["model"]
    return footer_text(model["name"], model["version"], model["provider"], api_url)


class PredictView(NamedTuple):
    """One object (a digit, a garment): the Digit and Fashion tabs. What shows at once; the routing maps
    follow from `answer`."""

    status: str
    input: Image.Image | None  # the 28x28 image the model saw
    reconstruction: Image.Image | None
    lengths: Image.Image | None  # bar chart with m+ and m-
    capsules: list[list[float]] | None  # (10, 16), kept in gr.State for the perturbation panel
    digit: int | None  # the capsule to perturb: the prediction
    footer: str | dict  # model, version and provider; gr.skip() keeps the last one
    answer: dict[str, Any] | None  # the API's answer, kept in gr.State for the routing maps

    @classmethod
    def of(cls, answer: dict[str, Any], names: list[str], api_url: str) -> "PredictView":
        prediction, label = int(answer["prediction"]), answer["label"]
        length = answer["probabilities"][prediction]
        status = (f"## Prediction: **{label}**\n"
                  f"Capsule length ‖v<sub>{label}</sub>‖ = {length:.3f}; " + runner_up_and_warnings(answer))
        reconstruction = plots.digit(np.asarray(answer["reconstruction"]["image"]))
        return cls(status, seen_image(answer), reconstruction, lengths_chart(answer, names), answer["capsules"],
                   picked(answer), answer_footer(answer, api_url), answer)


class PairView(NamedTuple):
    """Two overlapping digits: the Two digits tab (the paper's section 6 and Fig. 5)."""

    status: str
    input: Image.Image | None  # the 36x36 image the model saw
    overlay: Image.Image | None  # both reconstructions over the dimmed input: the first red, the second green
    first: Image.Image | None  # the first digit redrawn from its own capsule, in red
    second: Image.Image | None  # the second, in green
    lengths: Image.Image | None
    capsules: list[list[float]] | None
    digit: int | None  # the capsule to perturb: the first digit's
    footer: str | dict
    answer: dict[str, Any] | None

    @classmethod
    def of(cls, answer: dict[str, Any], names: list[str], api_url: str) -> "PairView":
        objects = answer["objects"]
        first, second = objects
        status = (f"## Digits: **{first['label']}** and **{second['label']}**\n"
                  f"Capsule lengths ‖v<sub>{first['label']}</sub>‖ = {first['length']:.3f} (red) and "
                  f"‖v<sub>{second['label']}</sub>‖ = {second['length']:.3f} (green); "
                  + runner_up_and_warnings(answer))
        drawings = [plots.digit(np.asarray(o["reconstruction"]["image"]), colour=colour)
                    for o, colour in zip(objects, plots.PAIR_COLOURS)]
        overlay = plots.enlarge(decode_data_url(answer["overlay"]).convert("RGB"))
        return cls(status, seen_image(answer), overlay, *drawings, lengths_chart(answer, names), answer["capsules"],
                   picked(answer), answer_footer(answer, api_url), answer)


View = PredictView | PairView


def message_view(view: type[View], status: str) -> View:
    """Words only (nothing drawn yet, an API error): every picture blank, the footer kept."""
    return view(status, *[None] * (len(view._fields) - 3), gr.skip(), None)


# -------------------------------------------------------------------------------------------------
class Tab(NamedTuple):
    """One model's tab: which model answers, what it asks for, what it shows."""

    title: str
    model: str  # the API's ?model=
    prefix: str  # of the tab's elem_ids and API names ("" for the digit tab, whose ids came first)
    size: int  # the model's input side (model.contract)
    view: type[View]
    pictures: tuple[tuple[str, str], ...]  # (label, elem_id) of the view's pictures before the lengths chart
    subject: str  # what to draw or upload: "a digit"
    canvas: bool  # can it be drawn on the pad?
    prompt: str  # the status before there is anything to predict
    examples: list[Path]
    examples_label: str
    noun: str  # what one capsule stands for: "digit" or "class"
    pick_info: str  # under the radio that picks the capsule to perturb


ONE_OBJECT = (("Model input", "seen"), ("Reconstruction", "reconstruction"))
DIGIT_TAB = Tab(
    title="Digit", model=DEFAULT_MODEL, prefix="", size=IMAGE_SIZE, view=PredictView, pictures=ONE_OBJECT,
    subject="a digit", canvas=True, prompt=DRAW_A_DIGIT, examples=EXAMPLES, examples_label="MNIST test digits",
    noun="digit", pick_info="What does the 3-capsule see? Pick any digit.",
)
PAIR_TAB = Tab(
    title="Two digits", model="multimnist", prefix="pair-", size=MULTIMNIST_SIZE, view=PairView,
    pictures=(("Model input", "seen"), ("Both digits redrawn (Fig. 5)", "overlay"),
              ("First digit, from its capsule", "first"), ("Second digit, from its capsule", "second")),
    subject="two digits", canvas=True, prompt=DRAW_TWO_DIGITS, examples=PAIR_EXAMPLES,
    examples_label="Generated MultiMNIST pairs", noun="digit",
    pick_info="The red digit first; pick the green one, or any digit.",
)
FASHION_TAB = Tab(
    title="Fashion", model="fashion-mnist", prefix="fashion-", size=IMAGE_SIZE, view=PredictView,
    pictures=ONE_OBJECT, subject="a garment", canvas=False, prompt=SHOW_A_GARMENT, examples=FASHION_EXAMPLES,
    examples_label="Fashion-MNIST test images", noun="class",
    pick_info="What does the Bag capsule see? Pick any class.",
)
TABS = (DIGIT_TAB, PAIR_TAB, FASHION_TAB)


# -------------------------------------------------------------------------------------------------
# Handlers: plain functions of (client, inputs) -> outputs, bound to the UI in build_demo().
def predict_png(client: ApiClient, png: bytes | None, tab: Tab = DIGIT_TAB) -> View:
    if png is None:
        return message_view(tab.view, tab.prompt)
    try:
        answer = client.predict(png, tab.model)
        names = client.classes(tab.model)
    except ApiError as error:
        return message_view(tab.view, str(error))
    return tab.view.of(answer, names, client.base_url)


def predict_drawing(client: ApiClient, drawing: str | None, tab: Tab = DIGIT_TAB) -> View:
    """The view of the pad's drawing (a PNG data URL, see frontend.pad), or the prompt if nothing is drawn."""
    try:
        png = drawing_png(drawing)
    except ValueError:
        return message_view(tab.view, "⚠️ The drawing did not arrive as a PNG image; draw it again.")
    return predict_png(client, png, tab)


def routing_view(client: ApiClient, answer: dict[str, Any] | None, tab: Tab = DIGIT_TAB) -> Image.Image | None:
    """The routing maps of the answer on screen (none without one)."""
    if answer is None:
        return None
    try:
        return routing_maps(answer, client.classes(tab.model))
    except ApiError:
        return None


DRAWING, UPLOAD = "drawing", "upload"  # the two inputs a tab can have on screen


class Screen:
    """What one tab shows in one browser session: which input is on screen (the drawing or the upload)
    and which prediction started last. An answer is shown only if it is for the input on screen and no
    prediction of the tab started after it: a late answer to an older drawing (a stroke's, slower than
    the Predict click that followed it, or one drawn before an example was picked) never replaces a
    newer one. Kept in a gr.State, one per session and tab, shared by that session's concurrent events."""

    def __init__(self, source: str = DRAWING) -> None:
        self.source, self.started = source, 0
        self.shown = self.followed = 0  # the tickets of the answer on screen and of the last one followed up
        self.lock = threading.Lock()

    def __deepcopy__(self, memo: dict) -> "Screen":  # gr.State copies its value for each new session
        return Screen(self.source)

    def start(self, source: str | None = None) -> int:
        """A prediction starts (and puts `source` on screen, if given): its ticket."""
        with self.lock:
            self.source = source or self.source
            self.started += 1
            return self.started

    def switch(self, source: str) -> int | None:
        """Put `source` on screen, starting a prediction, unless it is on screen already (None)."""
        with self.lock:
            if self.source == source:
                return None
            self.source, self.started = source, self.started + 1
            return self.started

    def shows(self, ticket: int, source: str) -> bool:
        return ticket == self.started and source == self.source

    def show(self, ticket: int, source: str) -> bool:
        """Whether the answer of `ticket` shows (see shows); if it does, it is the answer on screen."""
        with self.lock:
            if not self.shows(ticket, source):
                return False
            self.shown = ticket
            return True

    def follow(self) -> bool:
        """Whether the answer on screen still needs its follow-up (routing maps, Fig. 4); once per answer."""
        with self.lock:
            if self.followed == self.shown:
                return False
            self.followed = self.shown
            return True


def shown(handler: Callable[..., Sequence], outputs: Sequence[gr.components.Component], source: str,
          switch: bool = False, tab_select: bool = False) -> Callable[..., dict]:
    """An event function: `handler`'s view keyed by `outputs`, or no update at all when the Screen (its
    first input) says the view is not for what is on screen. `switch`: the event puts `source` on
    screen; `tab_select`: it does only if `source` is not on screen yet (a tab selected again, or by the
    page's own script after an upload, has nothing new to say)."""
    def run(screen: Screen, *inputs: Any) -> dict:
        ticket = screen.switch(source) if tab_select else screen.start(source if switch else None)
        view = handler(*inputs) if ticket is not None else None
        if view is None or not screen.show(ticket, source):
            return {o: gr.skip() for o in outputs}
        return dict(zip(outputs, view))
    return run


def predict_upload(client: ApiClient, path: str | None, tab: Tab = DIGIT_TAB) -> View:
    return predict_png(client, Path(path).read_bytes() if path else None, tab)


def upload_tab_id(tab: Tab) -> str:
    return f"{tab.prefix}upload-tab"


def predict_example(client: ApiClient, index: int, tab: Tab = DIGIT_TAB) -> tuple:
    """The example `index` of the tab, shown in the upload (the Upload tab selected, in a tab with a pad;
    the same event, so no tab select of its own follows), and its view."""
    path = str(tab.examples[index])
    upload_in_view = (gr.Tabs(selected=upload_tab_id(tab)),) if tab.canvas else ()
    return *upload_in_view, path, *predict_upload(client, path, tab)


def perturb(client: ApiClient, capsules: list[list[float]] | None, digit: int | None, *deltas: float,
            model: str = DEFAULT_MODEL) -> Image.Image | None:
    """The reconstruction from `digit`'s capsule with `deltas` (one per dimension) added to it."""
    if capsules is None or digit is None:
        return None
    capsule = np.asarray(capsules, dtype=np.float32)[digit] + np.asarray(deltas, dtype=np.float32)
    try:
        return plots.digit(client.reconstruct([digit], capsule[None], model)[0])
    except ApiError as error:
        gr.Warning(str(error))
        return None


def fig4_tiles(client: ApiClient, capsule: np.ndarray, digit: int, model: str = DEFAULT_MODEL) -> np.ndarray:
    """Fig. 4 for one capsule: (16, 11, S, S) at the model's input size S, row d adds OFFSETS to
    dimension d; one batch call."""
    dims, steps = CAPSULE_DIM, len(OFFSETS)
    batch = np.repeat(capsule[None, None], dims, 0).repeat(steps, 1)  # (16, 11, 16)
    batch[np.arange(dims), :, np.arange(dims)] += OFFSETS
    tiles = client.reconstruct([digit] * (dims * steps), batch.reshape(-1, dims), model)
    return tiles.reshape(dims, steps, *tiles.shape[1:])


def fig4(client: ApiClient, capsules: list[list[float]] | None, digit: int | None,
         model: str = DEFAULT_MODEL) -> Image.Image | None:
    if capsules is None or digit is None:
        return None
    try:
        tiles = fig4_tiles(client, np.asarray(capsules, dtype=np.float32)[digit], digit, model)
    except ApiError as error:
        gr.Warning(str(error))
        return None
    return plots.fig4_grid(tiles, OFFSETS)


def model_footer(client: ApiClient, model: str = DEFAULT_MODEL) -> str:
    try:
        card = client.model(model)
    except ApiError as error:
        return str(error)
    return footer_text(card["served_as"], card["version"], card["providers"][0], client.base_url)


def capsule_choices(client: ApiClient, model: str) -> gr.Radio | dict:
    """The capsule radio's choices, named by the model's classes; left as they are if the API cannot say."""
    try:
        names = client.classes(model)
    except ApiError:
        return gr.skip()
    return gr.Radio(choices=[(name, j) for j, name in enumerate(names)])


# -------------------------------------------------------------------------------------------------
INTRO = f"""# CapsNet: draw a digit (or two), show a garment, watch the capsules
Each of the {NUM_CLASSES} class capsules is a {CAPSULE_DIM}-D vector; its **length** says whether that
class is present and its **direction** says how it is drawn. The decoder redraws the input from the
winning capsule alone. Move the sliders to change one dimension at a time, as in section 5.1 of
[Dynamic Routing Between Capsules](https://arxiv.org/abs/1710.09829).

**Digit**: one handwritten digit (MNIST). **Two digits**: two overlapping digits (MultiMNIST, section 6),
each redrawn from its own capsule, in red and green over the input as in Fig. 5. **Fashion**: one garment
(Fashion-MNIST).
"""
CSS = """
.status { min-height: 4.5em; }
.pixels img { image-rendering: pixelated; }
"""


# What follows an answer (its routing maps, the perturbed capsule and Fig. 4) waits until the browser has
# drawn the answer, so that neither its work on the server nor the page's own for a new event takes the
# CPU the browser needs to show it. The wait is in the browser, before the event is sent: a frame for the
# new outputs, their images loaded, another frame (at most a second).
AFTER_PAINT = """(...inputs) => new Promise(resolve => requestAnimationFrame(() => {
    const go = () => resolve(inputs);
    const loading = [...document.images].filter(image => !image.complete).map(image => new Promise(loaded => {
        image.addEventListener('load', loaded, {once: true});
        image.addEventListener('error', loaded, {once: true});
    }));
    Promise.all(loading).then(() => requestAnimationFrame(() => setTimeout(go)));
    setTimeout(go, 1000);
}))"""


def picture(label: str, elem_id: str) -> gr.Image:
    """A model-sized image (input, reconstruction), shown crisp."""
    return gr.Image(label=label, format="png", height=200, buttons=[], elem_id=elem_id, elem_classes="pixels")


class Inputs(NamedTuple):
    """A tab's inputs: the drawing pad and its Predict button in a Draw tab, beside an Upload tab (tabs with
    a pad), the upload, and the examples below."""

    pad: gr.HTML | None
    button: gr.Button | None
    tabs: gr.Tabs | None  # Draw and Upload
    draw_tab: gr.Tab | None
    upload_tab: gr.Tab | None
    upload: gr.Image
    examples: gr.Dataset


def inputs(tab: Tab) -> Inputs:
    upload = gr.Image(type="filepath", sources=["upload", "clipboard"], label=f"An image of {tab.subject}",
                      height=360, elem_id=f"{tab.prefix}upload", render=False)
    pad = button = tabs = draw_tab = upload_tab = None
    if tab.canvas:
        with gr.Tabs(elem_id=f"{tab.prefix}inputs") as tabs:
            with gr.Tab("Draw", id=f"{tab.prefix}draw") as draw_tab:
                pad = drawing_pad(f"Draw {tab.subject}", f"{tab.prefix}sketch", CANVAS, BRUSH_RADIUS)
                button = gr.Button("Predict", variant="primary")
            with gr.Tab("Upload", id=upload_tab_id(tab)) as upload_tab:
                upload.render()
    else:
        upload.render()
    # A dataset rather than gr.Examples: a click is one event that shows the example and answers it
    # (gr.Examples loads the example in one event and the upload's change answers in a second).
    examples = gr.Dataset(components=[upload], samples=[[str(p)] for p in tab.examples], type="index",
                          label=tab.examples_label, elem_id=f"{tab.prefix}examples")
    return Inputs(pad, button, tabs, draw_tab, upload_tab, upload, examples)


def answer_column(tab: Tab) -> tuple[gr.Markdown, list[gr.Image], gr.Image]:
    """The status, the tab's pictures two to a row, and the capsule lengths."""
    status = gr.Markdown(tab.prompt, elem_id=f"{tab.prefix}status", elem_classes="status")
    pictures = []
    for row in range(0, len(tab.pictures), 2):
        with gr.Row():
            pictures += [picture(label, f"{tab.prefix}{name}") for label, name in tab.pictures[row:row + 2]]
    lengths = gr.Image(label="Capsule lengths", format="png", buttons=[], elem_id=f"{tab.prefix}lengths")
    return status, pictures, lengths


def routing_column(tab: Tab) -> gr.Image:
    grid = primary_grid(tab.size)
    first = "The predicted digits come first." if tab.view is PairView else f"The predicted {tab.noun} comes first."
    gr.Markdown(
        f"### Routing\nWhere the votes went: for each {tab.noun}, the {grid}x{grid} PrimaryCaps grid weighted by the "
        "coupling c<sub>ij</sub> and the vote length ‖û<sub>j|i</sub>‖, on one scale. " + first
    )
    return gr.Image(label="Routing maps", format="png", show_label=False, buttons=["fullscreen"],
                    elem_id=f"{tab.prefix}routing")


class Panel(NamedTuple):
    """The perturbation panel's parts that an answer redraws."""

    digit: gr.Radio  # the capsule to perturb
    sliders: list[gr.Slider]  # one delta per dimension
    perturbed: gr.Image
    grid: gr.Image  # Fig. 4


def perturbation_panel(client: ApiClient, tab: Tab, capsules: gr.State) -> Panel:
    """The chosen capsule, its 16 sliders, a reset, the perturbed drawing and the Fig. 4 grid, redrawn when
    the person picks a capsule or moves a slider (a new answer's follow-up redraws them too)."""
    p = tab.prefix
    with gr.Row(equal_height=False):
        with gr.Column(scale=5, min_width=360):
            gr.Markdown(
                f"### Perturb the capsule\nEach slider adds a delta to one of the {CAPSULE_DIM} dimensions of the "
                f"chosen {tab.noun} capsule; the decoder redraws it when you let go."
            )
            with gr.Row():
                with gr.Column(min_width=200):
                    digit = gr.Radio(choices=[(name, j) for j, name in enumerate(plots.DIGITS)],
                                     label=f"Decode the capsule of {tab.noun}", info=tab.pick_info,
                                     elem_id=f"{p}capsule")
                    reset = gr.Button("Reset sliders")
                perturbed = picture("Perturbed", f"{p}perturbed")
            sliders = []
            with gr.Row():
                for column in range(2):
                    with gr.Column(min_width=200):
                        for k in range(column * CAPSULE_DIM // 2, (column + 1) * CAPSULE_DIM // 2):
                            sliders.append(gr.Slider(-PERTURB_LIMIT, PERTURB_LIMIT, value=0.0, step=PERTURB_STEP,
                                                     label=f"dim {k + 1}", elem_id=f"{p}dim-{k + 1}"))
        with gr.Column(scale=4, min_width=360):
            gr.Markdown(
                "### Fig. 4: every dimension at once\nRow d adds −0.25 … +0.25 (steps of 0.05) to dimension d "
                "of the chosen capsule, as in the paper's Fig. 4."
            )
            grid = gr.Image(label="Dimension perturbations", format="png", show_label=False,
                            buttons=["fullscreen", "download"], elem_id=f"{p}grid")
    api = p.replace("-", "_")
    redraw = dict(fn=partial(perturb, client, model=tab.model), inputs=[capsules, digit, *sliders], outputs=perturbed)
    regrid = dict(fn=partial(fig4, client, model=tab.model), inputs=[capsules, digit], outputs=grid)
    digit.input(**redraw, **LIVE).then(**regrid)
    gr.on([s.release for s in sliders], **redraw, **LIVE, api_name=f"{api}perturb")
    reset.click(lambda: [0.0] * CAPSULE_DIM, None, sliders, api_visibility="private").then(**redraw)
    return Panel(digit, sliders, perturbed, grid)


def follow_up(client: ApiClient, tab: Tab, routing: gr.Image, panel: Panel, screen: Screen,
              answer: dict[str, Any] | None, *deltas: float) -> Iterator[dict]:
    """What follows the answer on screen, each part as soon as it is drawn: its routing maps, its capsule
    (the one the answer's view picked) perturbed by the sliders, its Fig. 4 grid. Nothing when that answer
    has been followed up already (by the follow-up of a prediction whose answer was dropped, see Screen).
    Everything but the sliders comes from the session's state, as it is when this runs."""
    if not screen.follow():
        yield {routing: gr.skip()}
        return
    yield {routing: routing_view(client, answer, tab)}
    capsules, digit = (answer["capsules"], picked(answer)) if answer else (None, None)
    yield {panel.perturbed: perturb(client, capsules, digit, *deltas, model=tab.model)}
    yield {panel.grid: fig4(client, capsules, digit, model=tab.model)}


def model_tab(client: ApiClient, tab: Tab, footer: gr.Markdown) -> gr.Radio:
    """One model's tab, wired to the API: inputs, the answer, the routing and the perturbation panel.
    Returns the radio of capsules, whose choices the page names once the API has said the classes.

    Every answer is one event, and its follow-up (routing maps, perturbed capsule, Fig. 4) a second that
    waits until the browser has drawn the answer: Gradio's page does work for every event on every
    component with a progress status, so fewer events answer sooner (an example: 425 -> 229 ms here)."""
    with gr.Tab(tab.title, id=tab.model) as page:
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=360):
                pad, button, tabs, draw_tab, upload_tab, upload, examples = inputs(tab)
            with gr.Column(scale=5, min_width=360):
                status, pictures, lengths = answer_column(tab)
            with gr.Column(scale=4, min_width=360):
                routing = routing_column(tab)
        capsules = gr.State(None)
        panel = perturbation_panel(client, tab, capsules)

    answer, screen = gr.State(None), gr.State(Screen(DRAWING if tab.canvas else UPLOAD))
    views = [status, *pictures, lengths, capsules, panel.digit, footer, answer]
    api = tab.prefix.replace("-", "_")
    follow = dict(fn=partial(follow_up, client, tab, routing, panel), inputs=[screen, answer, *panel.sliders],
                  outputs=[routing, panel.perturbed, panel.grid], show_progress="hidden", js=AFTER_PAINT)
    drawn, uploaded = partial(predict_drawing, client, tab=tab), partial(predict_upload, client, tab=tab)
    prompt = partial(predict_png, client, None, tab=tab)  # nothing to answer: the tab's prompt
    if pad is not None:  # .input fires as each stroke ends
        # A stroke and the Predict click are one event, so the browser runs them in turn: a click during a
        # stroke's prediction waits and then reads the canvas as it is by then.
        gr.on([pad.input, button.click], shown(drawn, views, DRAWING), [screen, pad], views, **LIVE,
              api_name=f"{api}predict_drawing").then(**follow)
        pad.clear(shown(prompt, views, DRAWING, switch=True), [screen], views,
                  api_visibility="private").then(**follow)  # and the prompt again
        # The tab in view answers: switching to Draw reads the drawing (or asks for one), to Upload the image.
        draw_tab.select(shown(drawn, views, DRAWING, tab_select=True), [screen, pad], views, **LIVE,
                        api_visibility="private").then(**follow)
        upload_tab.select(shown(uploaded, views, UPLOAD, tab_select=True), [screen, upload], views, **LIVE,
                          api_visibility="private").then(**follow)
    # An upload (a file or the clipboard), a cleared upload and an example: each is one event that answers.
    upload.upload(shown(uploaded, views, UPLOAD, switch=True), [screen, upload], views, **LIVE,
                  api_name=f"{api}predict_upload").then(**follow)
    # A cleared upload asks again without reading the upload: after an example, its clear event can still
    # carry the example's file.
    upload.clear(shown(prompt, views, UPLOAD, switch=True), [screen], views, **LIVE,
                 api_visibility="private").then(**follow)
    shows_example = [tabs, upload] if tabs is not None else [upload]
    examples.click(shown(partial(predict_example, client, tab=tab), [*shows_example, *views], UPLOAD, switch=True),
                   [screen, examples], [*shows_example, *views], **LIVE, api_visibility="private").then(**follow)
    page.select(partial(model_footer, client, tab.model), None, footer, show_progress="hidden",
                api_visibility="private")
    return panel.digit


def build_demo(settings: DemoSettings) -> gr.Blocks:
    client = ApiClient(settings.api_url, settings.timeout_s)
    with gr.Blocks(title="CapsNet demo", analytics_enabled=False) as demo:
        gr.Markdown(INTRO)
        footer = gr.Markdown(elem_id="footer", render=False)  # the model of the tab in view, below every tab
        with gr.Tabs():
            radios = [model_tab(client, tab, footer) for tab in TABS]
        footer.render()
        demo.load(partial(model_footer, client), None, footer, api_name="model")
        for tab, radio in zip(TABS, radios):
            demo.load(partial(capsule_choices, client, tab.model), None, radio, api_visibility="private")
    return demo


def launch(settings: DemoSettings, **kwargs) -> gr.Blocks:
    """Build the demo and serve it on settings.host:settings.port (kwargs go to Blocks.launch)."""
    demo = build_demo(settings).queue(default_concurrency_limit=8)  # handlers wait on HTTP, not the CPU
    demo.launch(
        server_name=settings.host,
        server_port=settings.port,
        theme=gr.themes.Soft(primary_hue="orange"),
        css=CSS,
        footer_links=["api"],
        **kwargs,
    )
    return demo


def main() -> None:
    launch(get_settings())
