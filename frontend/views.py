"""Views: what one answer of the API shows, as named fields, and the same as Gradio updates keyed by component.

A view is plain data (a NamedTuple), made from the API's JSON without Gradio's help and testable alone;
`updates` hands each field to the component of the same name in a tab's layout.
"""

import base64
import io
from collections.abc import Mapping
from typing import Any, NamedTuple

import gradio as gr
import numpy as np
from PIL import Image

from frontend import plots
from frontend.screen import ANSWER


def decode_data_url(url: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def footer_text(name: str, version: str, provider: str, api_url: str) -> str:
    kind = "CPU" if provider.startswith("CPU") else "GPU"
    return f"Model **{name}** · version `{version}` · runs on **{kind}** ({provider}) · API {api_url}"


def seen_image(answer: dict[str, Any]) -> Image.Image:
    """The image the model saw, at its input size, enlarged."""
    return plots.digit(np.asarray(decode_data_url(answer["input"]).convert("L")))


def marks(answer: dict[str, Any]) -> dict[int, plots.RGB]:
    """The answered classes and their colours: the prediction, or each object of a pair (red, green)."""
    if "objects" in answer:
        return {int(o["digit"]): colour for o, colour in zip(answer["objects"], plots.PAIR_COLOURS, strict=True)}
    return {int(answer["prediction"]): plots.WINNER}


def picked(answer: dict[str, Any]) -> int:
    """The capsule a view perturbs first: the prediction, or the first object of a pair."""
    return next(iter(marks(answer)))


def lengths_chart(answer: dict[str, Any], names: list[str]) -> Image.Image:
    return plots.lengths_chart(np.asarray(answer["probabilities"], dtype=np.float32), marks(answer), names)


def routing_maps(answer: dict[str, Any], names: list[str], iteration: int | None = None) -> Image.Image:
    """The routing maps, the answered classes first, then by capsule length: those of routing iteration r
    (1-based) where the answer has every iteration's, else the final ones; on the scale of the brightest
    map of any iteration, so that stepping through them shows the votes gathering."""
    lengths = np.asarray(answer["probabilities"], dtype=np.float32)
    marked = marks(answer)
    order = list(marked) + [int(j) for j in np.argsort(-lengths) if j not in marked]
    iterations = answer["routing"].get("iterations")
    chosen = iterations[iteration - 1]["maps"] if iterations and iteration else answer["routing"]["maps"]
    every = [np.asarray(it["maps"], dtype=np.float32) for it in iterations or []]
    maps = np.asarray(chosen, dtype=np.float32)
    top = max(float(m.max()) for m in [maps, *every])
    return plots.routing_heatmaps(maps, lengths, order, marked, names, top=top)


def runner_up_and_warnings(answer: dict[str, Any]) -> str:
    runner_up = answer["runner_up"]
    warnings = "".join(f"\n\n⚠️ {warning}" for warning in answer["warnings"])
    return f"runner-up {runner_up['label']} at {runner_up['length']:.3f}." + warnings


def answer_footer(answer: dict[str, Any], api_url: str) -> str:
    model = answer["model"]
    return footer_text(model["name"], model["version"], model["provider"], api_url)


class PredictView(NamedTuple):
    """One object (a digit, a garment). What shows at once; the routing maps follow from `answer`."""

    status: str
    input: Image.Image | None  # the image the model saw, at its input size (28x28, 40x40), enlarged
    reconstruction: Image.Image | None
    lengths: Image.Image | None  # bar chart with m+ and m-
    capsules: list[list[float]] | None  # (10, 16), kept in gr.State for the perturbation panel
    digit: int | None  # the capsule to perturb: the prediction
    footer: str | dict  # model, version and provider; gr.skip() keeps the last one
    answer: dict[str, Any] | None  # the API's answer, in gr.State for the routing maps

    @classmethod
    def of(cls, answer: dict[str, Any], names: list[str], api_url: str) -> "PredictView":
        prediction, label = int(answer["prediction"]), answer["label"]
        length = answer["probabilities"][prediction]
        status = (
            f"## Prediction: **{label}**\n"
            f"Capsule length ‖v<sub>{label}</sub>‖ = {length:.3f}; " + runner_up_and_warnings(answer)
        )
        reconstruction = plots.digit(np.asarray(answer["reconstruction"]["image"]))
        return cls(
            status,
            seen_image(answer),
            reconstruction,
            lengths_chart(answer, names),
            answer["capsules"],
            picked(answer),
            answer_footer(answer, api_url),
            answer,
        )


class PairView(NamedTuple):
    """Two overlapping digits (the paper's section 6 and Fig. 5)."""

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
        status = (
            f"## Digits: **{first['label']}** and **{second['label']}**\n"
            f"Capsule lengths ‖v<sub>{first['label']}</sub>‖ = {first['length']:.3f} (red) and "
            f"‖v<sub>{second['label']}</sub>‖ = {second['length']:.3f} (green); " + runner_up_and_warnings(answer)
        )
        drawings = [
            plots.digit(np.asarray(o["reconstruction"]["image"]), colour=colour)
            for o, colour in zip(objects, plots.PAIR_COLOURS, strict=True)
        ]
        overlay = plots.enlarge(decode_data_url(answer["overlay"]).convert("RGB"))
        first_drawn, second_drawn = drawings
        return cls(
            status,
            seen_image(answer),
            overlay,
            first_drawn,
            second_drawn,
            lengths_chart(answer, names),
            answer["capsules"],
            picked(answer),
            answer_footer(answer, api_url),
            answer,
        )


View = PredictView | PairView
VIEWS: dict[int, type[View]] = {1: PredictView, 2: PairView}  # by the objects in one image (GET /models: objects)
# (field, label, elem_id) of each view's pictures, shown above the lengths chart
PICTURES: dict[type[View], tuple[tuple[str, str, str], ...]] = {
    PredictView: (("input", "Model input", "seen"), ("reconstruction", "Reconstruction", "reconstruction")),
    PairView: (
        ("input", "Model input", "seen"),
        ("overlay", "Both redrawn (Fig. 5)", "overlay"),
        ("first", "First digit redrawn", "first"),
        ("second", "Second digit redrawn", "second"),
    ),
}


def message_view(view: type[View], status: str) -> View:
    """Words only (nothing drawn yet, an API error): every picture blank, the footer kept."""
    blank = dict.fromkeys(view._fields)
    return view(**{**blank, "status": status, "footer": gr.skip()})


def updates(view: View, components: Mapping[str, gr.components.Component]) -> dict[Any, Any]:
    """The view as Gradio updates: each field to the component of its name (a tab's `outputs`), and the
    API's answer under screen.ANSWER, for the Screen (screen.gated takes it out)."""
    fields = view._asdict()
    answer = fields.pop("answer")
    return {**{components[name]: value for name, value in fields.items()}, ANSWER: answer}
