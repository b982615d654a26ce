"""The Transform panel's data: a sweep of one transform over the answer's input, read by the tab's model
and by its partner (another served model of the same kind: mnist beside affine), and what it shows at
the slider's value.

The sweep runs on the image the model saw (the answer's `input`, sent back with preprocess=none), so the
curves describe that very input; the partner gets the same pixels centred on its own frame. One
POST /explain per model answers every step at once; moving the slider only redraws.
"""

import io
from typing import Any, NamedTuple

import numpy as np
from PIL import Image

from frontend import plots
from frontend.client import ApiClient
from frontend.tabs import Tab
from frontend.views import decode_data_url
from model.contract import CAPSULE_DIM

PARTNER = (37, 99, 235)  # the partner model's line, beside the tab's model in WINNER


class SweepRange(NamedTuple):
    """What the panel offers for one of the API's transforms: a label, the range and the slider's step."""

    label: str
    start: float
    stop: float
    step: float
    unit: str  # after a value: "°", "x", " px"

    @property
    def steps(self) -> int:
        return round((self.stop - self.start) / self.step) + 1

    @property
    def identity(self) -> float:
        return 1.0 if self.unit == "x" else 0.0


SWEEPS = {
    "rotate": SweepRange("Rotate", -45.0, 45.0, 5.0, "°"),
    "scale": SweepRange("Scale", 0.7, 1.3, 0.05, "x"),
    "shear": SweepRange("Shear (slant)", -30.0, 30.0, 5.0, "°"),
    "shift_x": SweepRange("Move sideways", -4.0, 4.0, 0.5, " px"),
    "shift_y": SweepRange("Move down", -4.0, 4.0, 0.5, " px"),
    "thickness": SweepRange("Stroke thickness", -1.0, 2.0, 0.25, " px"),
}
DEFAULT = "rotate"


class Sweep(NamedTuple):
    transform: str
    values: np.ndarray  # (steps,)
    followed: int  # the class whose capsule every step shows
    answers: list[tuple[str, dict[str, Any]]]  # (model, its /explain answer): the tab's model, then its partner


def image_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def framed(pixels: np.ndarray, size: int) -> np.ndarray:
    """A square uint8 input centred on a size x size black frame (padded, or cropped about its centre)."""
    side = pixels.shape[0]
    if side >= size:
        start = (side - size) // 2
        return pixels[start : start + size, start : start + size]
    before = (size - side) // 2
    return np.pad(pixels, ((before, size - side - before),) * 2)


def explain(client: ApiClient, tab: Tab, answer: dict[str, Any], transform: str, followed: int) -> Sweep:
    """The sweep of `transform` over the answer's input for the tab's model and its partner (one call each)."""
    spec = SWEEPS[transform]
    seen = np.asarray(decode_data_url(answer["input"]).convert("L"))
    runs = [(tab.model, seen)]
    if tab.partner is not None:
        runs.append((tab.partner.model, framed(seen, tab.partner.size)))
    answers = [
        (
            model,
            client.explain(image_bytes(pixels), model, transform, spec.start, spec.stop, spec.steps, followed),
        )
        for model, pixels in runs
    ]
    values = np.asarray([step["value"] for step in answers[0][1]["steps"]], np.float32)
    return Sweep(transform, values, followed, answers)


def step_at(sweep: Sweep, value: float) -> int:
    return int(np.argmin(np.abs(sweep.values - value)))


def holds(sweep: Sweep, answer: dict[str, Any]) -> str:
    """Where along the sweep the model still names the followed class, in words."""
    kept = [s["value"] for s in answer["steps"] if s["prediction"] == sweep.followed]
    unit = SWEEPS[sweep.transform].unit
    if not kept:
        return "never"
    if len(kept) == len(sweep.values):
        return "over the whole sweep"
    return f"from {min(kept):g}{unit} to {max(kept):g}{unit}" + (
        "" if len(kept) == round((max(kept) - min(kept)) / SWEEPS[sweep.transform].step) + 1 else ", with gaps"
    )


def dimension_labels(tab: Tab, followed: int) -> list[str]:
    """The dimensions counted from 0, as the API's arrays and the card: "dim 6: thicker stroke" where the card
    describes the capsule's dimensions, else "dim 6"."""
    words = (tab.dimensions or {}).get(tab.classes[followed])
    return [f"dim {d}: {words[d]}" if words else f"dim {d}" for d in range(CAPSULE_DIM)]


def shown(sweep: Sweep, tab: Tab, value: float) -> dict[str, Any]:
    """The panel at the slider's value: the words, each model's transformed input and capsule drawing,
    the lengths along the sweep and the followed capsule's 16 dimensions along it."""
    at, spec = step_at(sweep, value), SWEEPS[sweep.transform]
    name = tab.classes[sweep.followed]
    lines = [f"**{spec.label} {sweep.values[at]:g}{spec.unit}**, following the {name} capsule:"]
    for model, answer in sweep.answers:
        step = answer["steps"][at]
        length = step["lengths"][sweep.followed]
        lines.append(
            f"- `{model}` reads **{step['label']}** here (‖v<sub>{name}</sub>‖ = {length:.2f}); "
            f"it reads {name} {holds(sweep, answer)}"
        )
    pictures = {}
    for role, (_, answer) in zip(("", "partner_"), sweep.answers, strict=False):
        step = answer["steps"][at]
        pictures[f"{role}input"] = plots.digit(np.asarray(decode_data_url(step["input"]).convert("L")), scale=5)
        pictures[f"{role}drawn"] = plots.digit(
            np.asarray(decode_data_url(step["reconstruction"]).convert("L")), scale=5
        )
    colours = (plots.WINNER, PARTNER)
    series = [
        (model, np.asarray([s["lengths"] for s in answer["steps"]], np.float32), colour)
        for (model, answer), colour in zip(sweep.answers, colours, strict=False)
    ]
    capsules = np.asarray([s["capsule"] for s in sweep.answers[0][1]["steps"]], np.float32)
    unit = {"°": "degrees", "x": "scale factor", " px": "pixels"}[spec.unit]
    return {
        "status": "\n".join(lines),
        **pictures,
        "lengths": plots.sweep_lengths(sweep.values, series, sweep.followed, at, tab.classes, f"{spec.label}, {unit}"),
        "dimensions": plots.sweep_dimensions(sweep.values, capsules, at, dimension_labels(tab, sweep.followed)),
    }
