"""The demo's tabs: one per model the API serves (GET /models), each shaped by what the model reads.

What a tab asks and shows follows from the model's entry in GET /models (its card's serving section:
input size, preprocessing kind, classes, objects per image); what is presentation only (the tab's label,
the prompt, the examples) follows from the preprocessing kind, never from the model's name. A model the
API serves gets a tab (the affine model: a Digit tab with a 40x40 input); one it does not serve gets none.
"""

import re
from pathlib import Path
from typing import Any, NamedTuple

from frontend.views import VIEWS, View

EXAMPLES_DIR = Path(__file__).parent / "examples"
EXAMPLES = sorted(EXAMPLES_DIR.joinpath("digits").glob("*.png"))  # MNIST t10k, one per class
PAIR_EXAMPLES = sorted(EXAMPLES_DIR.joinpath("pairs").glob("*.png"))  # generated MultiMNIST, named by both digits
FASHION_EXAMPLES = sorted(EXAMPLES_DIR.joinpath("fashion").glob("*.png"))  # Fashion-MNIST t10k, dark on white
DRAW_A_DIGIT = "✏️ Draw a digit on the canvas, or upload one or pick an example."
DRAW_TWO_DIGITS = "✏️ Draw two overlapping digits on the canvas, or upload a pair or pick an example."
SHOW_A_GARMENT = "👕 Upload a photo of one garment on a plain background, or pick an example."


class Look(NamedTuple):
    """How a tab presents models of one preprocessing kind (contract.PREPROCESSING)."""

    label: str  # the tab's label
    prefix: str  # of the tab's elem_ids and API names ("" for the digit tab, whose ids came first)
    subject: str  # what to draw or upload: "a digit"
    canvas: bool  # can it be drawn on the pad?
    prompt: str  # the status before there is anything to predict
    examples: list[Path]
    examples_label: str
    noun: str  # what one capsule stands for: "digit" or "class"
    pick_info: str  # under the radio that picks the capsule to perturb
    about: str = ""  # after the model's task in the page's introduction


LOOKS = {
    "digit": Look(
        label="Digit",
        prefix="",
        subject="a digit",
        canvas=True,
        prompt=DRAW_A_DIGIT,
        examples=EXAMPLES,
        examples_label="MNIST test digits",
        noun="digit",
        pick_info="The answer's digit first; pick any digit to see what its capsule draws.",
    ),
    "digit-pair": Look(
        label="Two digits",
        prefix="pair-",
        subject="two digits",
        canvas=True,
        prompt=DRAW_TWO_DIGITS,
        examples=PAIR_EXAMPLES,
        examples_label="Generated MultiMNIST pairs",
        noun="digit",
        pick_info="The red digit first; pick the green one, or any digit.",
        about=", each redrawn from its own capsule, in red and green over the input as in Fig. 5",
    ),
    "garment": Look(
        label="Fashion",
        prefix="fashion-",
        subject="a garment",
        canvas=False,
        prompt=SHOW_A_GARMENT,
        examples=FASHION_EXAMPLES,
        examples_label="Fashion-MNIST test images",
        noun="class",
        pick_info="The answer's class first; pick any class to see what its capsule draws.",
    ),
}


class Tab(NamedTuple):
    """One served model's tab: which model answers, what it reads and shows, and how it looks."""

    model: str  # the API's ?model=
    title: str  # the tab's label
    prefix: str  # of the tab's elem_ids and API names
    task: str  # what the model reads, in words (its card's)
    size: int  # the model's input side, px
    classes: list[str]  # the class of each capsule
    view: type[View]  # one object, or a pair
    look: Look
    dimensions: dict[str, list[str]] | None = None  # per class, what each capsule dimension does (GET /models)
    iterations: bool = False  # whether the model's answers can carry every routing iteration (GET /models)
    partner: "Tab | None" = None  # another served model of the same kind, swept beside this one (affine, mnist)


def tab_of(entry: dict[str, Any], title: str, prefix: str) -> Tab:
    """The tab of one entry of GET /models (app/schemas.py: ModelEntry)."""
    if entry["objects"] not in VIEWS:
        raise ValueError(
            f"model {entry['name']} names {entry['objects']} objects per image; "
            f"the demo shows {' or '.join(map(str, VIEWS))}"
        )
    return Tab(
        model=entry["name"],
        title=title,
        prefix=prefix,
        task=entry["task"],
        size=entry["input_size"],
        classes=list(entry["classes"]),
        view=VIEWS[entry["objects"]],
        look=LOOKS[entry["preprocessing"]],
        dimensions=entry.get("dimensions"),
        iterations=bool(entry.get("routing_iterations")),
    )


def tabs_from(models: dict[str, Any]) -> list[Tab]:
    """A tab per served model (GET /models' answer): the default model's first, then in the API's order.
    The first model of a preprocessing kind takes the kind's label and elem_id prefix ("Digit", "");
    another of the same kind adds its name ("Digit (affine)", "affine-")."""
    entries = sorted(models["models"], key=lambda entry: entry["name"] != models["default"])  # stable
    tabs: list[Tab] = []
    for entry in entries:
        look = LOOKS[entry["preprocessing"]]
        if any(tab.look is look for tab in tabs):
            title, prefix = f"{look.label} ({entry['name']})", re.sub(r"[^A-Za-z0-9_-]", "-", entry["name"]) + "-"
        else:
            title, prefix = look.label, look.prefix
        if prefix in {tab.prefix for tab in tabs}:  # a model named as another kind's prefix ("pair")
            prefix = f"{prefix}{len(tabs)}-"
        tabs.append(tab_of(entry, title, prefix))
    return [tab._replace(partner=partner(tab, tabs)) for tab in tabs]


def partner(tab: Tab, tabs: list[Tab]) -> Tab | None:
    """The first other tab of the same kind (same look and objects): its model's sweep is drawn beside."""
    return next((t for t in tabs if t is not tab and t.look is tab.look and t.view is tab.view), None)
