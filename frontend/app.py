"""The CapsNet demo: draw a digit, see its capsules and the routing, perturb the 16 dimensions.

A Gradio app that asks the API over HTTP (it imports neither app/ nor torch) and lets a person
explore the model the way section 5.1 and Fig. 4 of the paper (Sabour, Frosst & Hinton 2017,
"Dynamic Routing Between Capsules", https://arxiv.org/abs/1710.09829) do.

$ python -m app                 # the API, http://localhost:8000
$ python -m frontend            # the demo, http://127.0.0.1:7860
$ CAPSNET_DEMO_API_URL=http://api:8000 CAPSNET_DEMO_HOST=0.0.0.0 python -m frontend
"""
import base64
import io
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, NamedTuple

import gradio as gr
import httpx
import numpy as np
from PIL import Image
from pydantic_settings import BaseSettings, SettingsConfigDict

from frontend import plots
from model.contract import CAPSULE_DIM, IMAGE_SIZE, NUM_CLASSES, PERTURB_LIMIT, PERTURB_STEP


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


EXAMPLES = sorted(Path(__file__).parent.joinpath("examples").glob("*.png"))  # MNIST t10k, one per class
# The paper's Fig. 4 perturbations: -0.25, -0.20, ..., +0.25 (11 steps of 0.05).
OFFSETS = np.linspace(-PERTURB_LIMIT, PERTURB_LIMIT, round(2 * PERTURB_LIMIT / PERTURB_STEP) + 1)
DRAW_A_DIGIT = "✏️ Draw a digit on the canvas, or upload one or pick an example."
LIVE = dict(trigger_mode="always_last", show_progress="minimal")  # while one call runs, only the last new one waits
CANVAS = 400  # px, square
# The brush's radius (Gradio's Brush.default_size is a radius, its strokes are circles of it): a 28 px
# pen is MNIST's median stroke for a digit about 250 px tall, and within MNIST's range of widths
# (contract.STROKE_RANGE) for any digit taller than 120 px on this canvas, so the API need not reshape
# it. The canvas is white paper with a black pen whatever the theme, and the API reads the ink from alpha.
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

    def call(self, method: str, path: str, **kwargs) -> dict[str, Any]:
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
        return response.json()

    def predict(self, png: bytes) -> dict[str, Any]:
        return self.call(
            "POST",
            "/predict",
            params={"include": "capsules,reconstruction,routing", "preprocess": "mnist"},
            files={"file": ("digit.png", png, "image/png")},
        )

    def reconstruct(self, digits: list[int], capsules: np.ndarray) -> np.ndarray:
        """Decode capsules (n, 16), each placed at its digit's slot, in one batch: (n, 28, 28)."""
        items = [{"digit": int(d), "capsule": c.tolist()} for d, c in zip(digits, capsules)]
        answer = self.call("POST", "/reconstruct", json={"items": items})
        return np.array([r["image"] for r in answer["items"]], dtype=np.float32)

    def model(self) -> dict[str, Any]:
        return self.call("GET", "/model")


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
# Handlers: plain functions of (client, inputs) -> outputs, bound to the UI in build_demo().
class PredictView(NamedTuple):
    """What one prediction shows, in the order of the UI outputs."""

    status: str
    input: Image.Image | None  # the 28x28 image the model saw
    reconstruction: Image.Image | None
    lengths: Image.Image | None  # bar chart with m+ and m-
    routing: Image.Image | None  # per-class 6x6 routing maps, predicted class first
    capsules: list[list[float]] | None  # (10, 16), kept in gr.State for the perturbation panel
    digit: int | None  # the capsule to perturb: the prediction
    footer: str | dict  # model, version and provider; gr.skip() keeps the last one


def message_view(status: str) -> PredictView:
    return PredictView(status, None, None, None, None, None, None, gr.skip())


def drawing_png(editor: dict[str, Any] | None) -> bytes | None:
    """The sketchpad's strokes as one RGBA PNG (ink in alpha, background left out), None if empty."""
    layers = [layer for layer in (editor or {}).get("layers") or [] if layer is not None]
    if not layers:
        return None
    strokes = Image.new("RGBA", layers[0].size, (0, 0, 0, 0))
    for layer in layers:
        strokes = Image.alpha_composite(strokes, layer.convert("RGBA"))
    if strokes.getchannel("A").getextrema()[1] == 0:
        return None
    buffer = io.BytesIO()
    strokes.save(buffer, format="PNG")
    return buffer.getvalue()


def predict_png(client: ApiClient, png: bytes | None) -> PredictView:
    if png is None:
        return message_view(DRAW_A_DIGIT)
    try:
        answer = client.predict(png)
    except ApiError as error:
        return message_view(str(error))
    lengths = np.asarray(answer["probabilities"], dtype=np.float32)
    prediction, model, runner_up = int(answer["prediction"]), answer["model"], answer["runner_up"]
    order = [prediction] + [int(j) for j in np.argsort(-lengths) if j != prediction]
    status = (
        f"## Prediction: **{prediction}**\n"
        f"Capsule length ‖v<sub>{prediction}</sub>‖ = {lengths[prediction]:.3f}; "
        f"runner-up {runner_up['digit']} at {runner_up['length']:.3f}."
        + "".join(f"\n\n⚠️ {warning}" for warning in answer["warnings"])
    )
    return PredictView(
        status=status,
        input=plots.digit(np.asarray(decode_data_url(answer["input"]).convert("L"))),
        reconstruction=plots.digit(np.asarray(answer["reconstruction"]["image"])),
        lengths=plots.lengths_chart(lengths, prediction),
        routing=plots.routing_heatmaps(np.asarray(answer["routing"]["maps"]), lengths, order),
        capsules=answer["capsules"],
        digit=prediction,
        footer=footer_text(model["name"], model["version"], model["provider"], client.base_url),
    )


def predict_drawing(client: ApiClient, editor: dict[str, Any] | None) -> PredictView:
    return predict_png(client, drawing_png(editor))


def predict_upload(client: ApiClient, path: str | None) -> PredictView:
    return predict_png(client, Path(path).read_bytes() if path else None)


def perturb(client: ApiClient, capsules: list[list[float]] | None, digit: int | None, *deltas: float) -> Image.Image | None:
    """The reconstruction from `digit`'s capsule with `deltas` (one per dimension) added to it."""
    if capsules is None or digit is None:
        return None
    capsule = np.asarray(capsules, dtype=np.float32)[digit] + np.asarray(deltas, dtype=np.float32)
    try:
        return plots.digit(client.reconstruct([digit], capsule[None])[0])
    except ApiError as error:
        gr.Warning(str(error))
        return None


def fig4_tiles(client: ApiClient, capsule: np.ndarray, digit: int) -> np.ndarray:
    """Fig. 4 for one capsule: (16, 11, 28, 28), row d adds OFFSETS to dimension d; one batch call."""
    dims, steps = CAPSULE_DIM, len(OFFSETS)
    batch = np.repeat(capsule[None, None], dims, 0).repeat(steps, 1)  # (16, 11, 16)
    batch[np.arange(dims), :, np.arange(dims)] += OFFSETS
    tiles = client.reconstruct([digit] * (dims * steps), batch.reshape(-1, dims))
    return tiles.reshape(dims, steps, IMAGE_SIZE, IMAGE_SIZE)


def fig4(client: ApiClient, capsules: list[list[float]] | None, digit: int | None) -> Image.Image | None:
    if capsules is None or digit is None:
        return None
    try:
        tiles = fig4_tiles(client, np.asarray(capsules, dtype=np.float32)[digit], digit)
    except ApiError as error:
        gr.Warning(str(error))
        return None
    return plots.fig4_grid(tiles, OFFSETS)


def model_footer(client: ApiClient) -> str:
    try:
        card = client.model()
    except ApiError as error:
        return str(error)
    return footer_text(card["name"], card["version"], card["providers"][0], client.base_url)


# -------------------------------------------------------------------------------------------------
INTRO = f"""# CapsNet: draw a digit, watch its capsules
Each of the {NUM_CLASSES} digit capsules is a {CAPSULE_DIM}-D vector; its **length** says whether that
digit is present and its **direction** says how it is drawn. The decoder redraws the digit from the
winning capsule alone. Move the sliders to change one dimension at a time, as in section 5.1 of
[Dynamic Routing Between Capsules](https://arxiv.org/abs/1710.09829).
"""
CSS = """
#status { min-height: 4.5em; }
#seen img, #reconstruction img, #perturbed img { image-rendering: pixelated; }
"""


def build_demo(settings: DemoSettings) -> gr.Blocks:
    client = ApiClient(settings.api_url, settings.timeout_s)
    paper = Image.new("RGB", (CANVAS, CANVAS), "white")  # black ink on white paper; the API reads the ink from alpha
    blank = {"background": paper, "layers": [], "composite": None}  # as a value, it also selects the brush

    with gr.Blocks(title="CapsNet demo", analytics_enabled=False) as demo:
        gr.Markdown(INTRO)
        with gr.Row(equal_height=False):
            with gr.Column(scale=4, min_width=360):
                with gr.Tabs():
                    with gr.Tab("Draw", id="draw"):
                        sketch = gr.Sketchpad(
                            value=blank,
                            type="pil",
                            format="png",
                            canvas_size=paper.size,
                            fixed_canvas=True,
                            brush=gr.Brush(colors=["#000000"], color_mode="fixed", default_size=BRUSH_RADIUS),
                            layers=False,
                            transforms=(),
                            label="Draw a digit",
                            elem_id="sketch",
                        )
                        predict_button = gr.Button("Predict", variant="primary")
                    with gr.Tab("Upload", id="upload"):
                        upload = gr.Image(type="filepath", sources=["upload", "clipboard"], label="An image of a digit", height=360)
                gr.Examples(examples=[[str(p)] for p in EXAMPLES], inputs=[upload], label="MNIST test digits")
            with gr.Column(scale=5, min_width=360):
                status = gr.Markdown(DRAW_A_DIGIT, elem_id="status")
                with gr.Row():
                    seen = gr.Image(label="Model input", format="png", height=200, buttons=[], elem_id="seen")
                    reconstruction = gr.Image(label="Reconstruction", format="png", height=200, buttons=[], elem_id="reconstruction")
                lengths = gr.Image(label="Capsule lengths", format="png", buttons=[], elem_id="lengths")
            with gr.Column(scale=4, min_width=360):
                gr.Markdown(
                    "### Routing\nWhere the votes went: for each digit, the 6x6 PrimaryCaps grid weighted by the "
                    "coupling c<sub>ij</sub> and the vote length ‖û<sub>j|i</sub>‖, on one scale. "
                    "The predicted digit comes first."
                )
                routing = gr.Image(label="Routing maps", format="png", show_label=False, buttons=["fullscreen"], elem_id="routing")

        capsules = gr.State(None)
        with gr.Row(equal_height=False):
            with gr.Column(scale=5, min_width=360):
                gr.Markdown(
                    "### Perturb the capsule\nEach slider adds a delta to one of the 16 dimensions of the chosen "
                    "digit capsule; the decoder redraws it when you let go."
                )
                with gr.Row():
                    with gr.Column(min_width=200):
                        digit = gr.Radio(
                            choices=[(str(j), j) for j in range(NUM_CLASSES)],
                            label="Decode the capsule of digit",
                            info="What does the 3-capsule see? Pick any digit.",
                        )
                        reset = gr.Button("Reset sliders")
                    perturbed = gr.Image(label="Perturbed", format="png", height=200, buttons=[], elem_id="perturbed")
                sliders = []
                with gr.Row():
                    for column in range(2):
                        with gr.Column(min_width=200):
                            for k in range(column * CAPSULE_DIM // 2, (column + 1) * CAPSULE_DIM // 2):
                                sliders.append(
                                    gr.Slider(
                                        -PERTURB_LIMIT, PERTURB_LIMIT, value=0.0, step=PERTURB_STEP, label=f"dim {k + 1}", elem_id=f"dim-{k + 1}"
                                    )
                                )
            with gr.Column(scale=4, min_width=360):
                gr.Markdown(
                    "### Fig. 4: every dimension at once\nRow d adds −0.25 … +0.25 (steps of 0.05) to dimension d "
                    "of the chosen capsule, as in the paper's Fig. 4."
                )
                grid = gr.Image(label="Dimension perturbations", format="png", show_label=False, buttons=["fullscreen", "download"], elem_id="grid")
        footer = gr.Markdown(elem_id="footer")

        # ---- events
        views = [status, seen, reconstruction, lengths, routing, capsules, digit, footer]
        redraw = dict(fn=partial(perturb, client), inputs=[capsules, digit, *sliders], outputs=perturbed)
        regrid = dict(fn=partial(fig4, client), inputs=[capsules, digit], outputs=grid)
        drawn = [sketch.input, predict_button.click]  # .input fires after each stroke (.change does not)
        gr.on(drawn, partial(predict_drawing, client), [sketch], views, **LIVE, api_name="predict_drawing").then(
            **redraw
        ).then(**regrid)
        upload.change(partial(predict_upload, client), [upload], views, **LIVE, api_name="predict_upload").then(
            **redraw
        ).then(**regrid)
        # An example or upload replaces the drawing (gr.Tabs(selected=...) does not switch away from a sketchpad).
        upload.change(lambda: blank, None, sketch, api_visibility="private")
        sketch.clear(lambda: blank, None, sketch, api_visibility="private")  # fresh paper, brush in hand
        digit.input(**redraw, **LIVE).then(**regrid)
        gr.on([s.release for s in sliders], **redraw, **LIVE, api_name="perturb")
        reset.click(lambda: [0.0] * CAPSULE_DIM, None, sliders, api_visibility="private").then(**redraw)
        demo.load(partial(model_footer, client), None, footer, api_name="model")
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
