"""A model folder's card (capsnet.json): the one description of a model, and its `serving` schema.

Training writes the card (training/export.py builds the serving section with `build_serving`, so it
is valid by construction); the service reads it with `read_serving`, takes every size it needs from it,
never from module constants, and checks it against the ONNX graphs' own inputs and outputs
(app/engine.py); app/imaging/ takes the preprocessing, the demo its tabs (through GET /models). A card
without the section, or with one that does not parse, stops start-up with a sentence naming the folder.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from model import contract


class _Section(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Input(_Section):
    size: int = Field(ge=17, le=1024, description="side of the square input image, px (17: a 1x1 primary grid)")
    channels: Literal[1]
    pixels: str = "float32 in [0, 1], the object white on black"  # contract.PIXEL_RANGE


class Preprocessing(_Section):
    """How a picture becomes the model's input (app/imaging/registry.py)."""

    kind: Literal[contract.PREPROCESSING]  # type: ignore[valid-type]
    ink_box: int = Field(ge=4, description="longer side (px) of the object's ink box in the model's input")


class PrimaryCapsules(_Section):
    types: int = Field(ge=1)
    dim: int = Field(ge=1)
    grid: int = Field(ge=1)
    count: int = Field(ge=1)


class ClassCapsules(_Section):
    count: int = Field(ge=2)
    dim: int = Field(ge=1)


class Routing(_Section):
    kind: str = Field(description="dynamic (Procedure 1), em or qp: model/routing.py")
    iterations: int = Field(ge=0)


class Serving(_Section):
    """The card's serving section: what the model reads and what its capsules are."""

    task: str
    input: Input
    preprocessing: Preprocessing
    classes: list[str]
    objects: int = Field(ge=1, description="objects in one image: the longest capsules that name them")
    primary_capsules: PrimaryCapsules
    class_capsules: ClassCapsules
    routing: Routing

    @property
    def size(self) -> int:
        return self.input.size


def build_serving(
    model_config: dict, task: str, preprocessing: Preprocessing, classes: list[str], objects: int
) -> Serving:
    """The serving section of a model built from its CapsNetConfig (as a dict) and what it was trained
    to read; checked as `read_serving` checks it, so training cannot write a card the service refuses."""
    size, p = model_config["image_size"], model_config["primary_types"]
    grid = contract.primary_grid(size)
    section = Serving(
        task=task,
        input=Input(size=size, channels=1),
        preprocessing=preprocessing,
        classes=list(classes),
        objects=objects,
        primary_capsules=PrimaryCapsules(types=p, dim=model_config["primary_dim"], grid=grid, count=p * grid * grid),
        class_capsules=ClassCapsules(count=model_config["num_classes"], dim=model_config["caps_dim"]),
        routing=Routing(kind=model_config["routing"], iterations=model_config["routing_iters"]),
    )
    return read_serving({contract.SERVING: section.model_dump()}, "the exported model")


def read_serving(card: dict, where: str) -> Serving:
    """The card's serving section, checked; a ValueError that names `where` if it is missing or wrong."""
    section = card.get(contract.SERVING)
    if section is None:
        raise ValueError(
            f"the card in {where} has no `{contract.SERVING}` section (input size, preprocessing, "
            "classes); write it with `python -m training.export --describe DIR`"
        )
    try:
        serving = Serving.model_validate(section)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"the card in {where} has a bad `{contract.SERVING}` section: {problems}") from None
    p = serving.primary_capsules
    if len(serving.classes) != serving.class_capsules.count or serving.objects > serving.class_capsules.count:
        raise ValueError(
            f"the card in {where} names {len(serving.classes)} classes for "
            f"{serving.class_capsules.count} class capsules and {serving.objects} objects"
        )
    if p.count != p.types * p.grid * p.grid or p.grid != contract.primary_grid(serving.size):
        raise ValueError(
            f"the card in {where} says {p.types} primary types on a {p.grid}x{p.grid} grid "
            f"({p.count} capsules) for a {serving.size}x{serving.size} input; the network leaves a "
            f"{contract.primary_grid(serving.size)}x{contract.primary_grid(serving.size)} grid"
        )
    return serving


# --- what each class-capsule dimension does (section 5.1, Fig. 4; training/dimensions.py) ----------------
class DimensionEffect(_Section):
    """One dimension of one class capsule: what moving it from -PERTURB_LIMIT to +PERTURB_LIMIT does to the
    decoder's drawing."""

    dim: int = Field(ge=0)
    label: str = Field(
        description="what the + direction does, in a few words; where dimensions of the class share them, followed "
        "by the dimension's next largest effects (training/dimensions.py distinct)",
        examples=["thicker stroke", "taller, slants left"],
    )
    effect: str = Field(description="the dominant measured effect (training/dimensions.py EFFECTS)", examples=["ink"])
    share: float = Field(ge=0, le=1, description="the dominant effect's share of the dimension's squared scores")
    measures: dict[str, float] = Field(description="every measured effect, averaged over the class's examples")


class Norm(_Section):
    """How an effect becomes a score: (measure - centre) / spread, over all the model's class dimensions."""

    centre: float
    spread: float = Field(gt=0)


class Dimensions(_Section):
    """The card's dimensions section: per class, its capsule's dimensions in order."""

    method: str
    perturbation: tuple[float, float] = Field(description="the two values added to one dimension")
    examples: str = Field(description="the examples each class's figures are averaged over")
    examples_per_class: dict[str, int]
    window: int = Field(ge=1, description="side (px) of the region whose share of the change says how local it is")
    norms: dict[str, Norm]
    quiet_below: float = Field(ge=0, description="a dimension whose `change` is below this is labelled little change")
    classes: dict[str, list[DimensionEffect]]


def read_dimensions(card: dict) -> Dimensions | None:
    """The card's dimensions section, checked (a pydantic ValidationError if wrong), or None without one."""
    section = card.get(contract.DIMENSIONS)
    return None if section is None else Dimensions.model_validate(section)
