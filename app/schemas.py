"""Request and response bodies of the HTTP contract (docs/ARCHITECTURE.md), named by role.

Shapes are in the schemas (min/max lengths) so that the OpenAPI document says them and
schemathesis checks them; the examples have the real shapes.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from app.imaging.transform import TransformName
from model import contract

# Every shipped model has 10 classes of 16D capsules; the image, grid and primary-capsule sizes are each
# model's own (GET /models), so the schemas give MNIST's in examples only.
C, D, S, G = contract.NUM_CLASSES, contract.CAPSULE_DIM, contract.IMAGE_SIZE, contract.PRIMARY_GRID
CAPSULE_LIMIT = 1000.0  # digit capsules are squashed (length < 1); the bound keeps float32 finite


# Lengths of fixed-length lists (in Annotated types): one item per class, or a capsule's D numbers
PER_CLASS = Field(min_length=C, max_length=C)
PER_DIM = Field(min_length=D, max_length=D)
Unit = Annotated[float, Field(ge=0.0, le=1.0)]


def as_written(value: Any) -> Any:
    """A query's number as people write it: pydantic reads a query's text as Python's int() and float() do,
    which take digits grouped by underscores (`0_1` is 1, `1_0.5` is 10.5); such a text is refused, not read
    as another number."""
    if isinstance(value, str) and "_" in value:
        raise ValueError(f"{value!r} is not a number as written in a query: leave out the underscores")
    return value


# on a query's number, after its Query (before it, FastAPI's document loses the Query's bounds)
WRITTEN = BeforeValidator(as_written)
Square = Annotated[
    list[list[Unit]],
    Field(
        description="the model's input size squared (28x28 for MNIST, 36x36 for "
        "MultiMNIST), pixels in [0, 1], rows first"
    ),
]
PNG_EXAMPLE = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAABwAAAAcCAAAAABXZoBIAAAAwUlEQVR42mNgGDaAEUKF"
    "pD77sfTFHeyS9xQYGBg+X4UKPuk6w8DAwMDAAuGm6l/TMnSweCzLwPDntSTDozPIOhkYGBgYBA3PmDIw/Lh1XShnGi5nBP+9"
    "KIRLTuzl/2AokwlDMlv0/U1cGq1//rPD6fHWf7tZcclxnv1hhVNj3b9tOOW8f3+wxCUnfPffMlxyzKf/3VbGJan2758vLjn5"
    "B/+KGXF78Z8JLjnbT+iSSGFrw8Nw9wuKJAsy56LzO+ITGABpETyQcCy90wAAAABJRU5ErkJggg=="
)  # test image 0, a 7
# /predict?include= parts asked for by name only: routing.coefficients (11,520 numbers for MNIST, nine tenths of
# the answer's bytes, which routing.maps sum up) and routing.iterations
COEFFICIENTS = "coefficients"
ITERATIONS = "iterations"
INPUT = "input"  # the image the model saw, as a PNG
INCLUDE_DEFAULT = ("capsules", "reconstruction", "routing", INPUT)  # /predict without ?include=
INCLUDE_OPTIONS = (*INCLUDE_DEFAULT, COEFFICIENTS, ITERATIONS)  # /predict?include=
DRAWING_OPTIONS = ("image", "png")  # /reconstruct?include=
# ?preprocess= of /predict and /explain. `mnist` is an alias of `auto`, its name from when every served model
# read digits: it is taken and does what auto does, so that clients written then keep working.
Preprocess = Literal["auto", "mnist", "none"]
PREPROCESS_DESCRIPTION = (
    "auto: the preprocessing the model's card names (GET /models: digit finds the paper and the ink in photos, "
    "scans and canvases, keeps the digit's parts, brings its stroke into MNIST's range, fits its ink box and "
    "centres its mass; digit-pair does the same for two overlapping digits; garment trims the background, fits "
    "the frame and negates). mnist: an alias of auto. none: the image is already the "
    "model's input (28x28 or its size), white on black"
)

# ?model= of every route that reads a model (app/deps.py's get_engine, PredictQuery)
MODEL_DESCRIPTION = "the served model to use (GET /models lists them); default: the default model, mnist"
MODEL_EXAMPLES = ["mnist", "multimnist", "fashion-mnist"]
MODEL_NAME_LENGTH = 64


# --- /predict -------------------------------------------------------------------------------------
class PredictQuery(BaseModel):
    """/predict's query parameters (app/deps.py's read_query reads them)."""

    include: str | None = Field(
        None,
        description=f"comma list of {', '.join(INCLUDE_OPTIONS)} to return (default: {', '.join(INCLUDE_DEFAULT)}; "
        f"empty: none). routing: routing.maps; {INPUT}: the image the model saw, a PNG; {COEFFICIENTS}: "
        f"routing.coefficients, every c_ij; {ITERATIONS}: routing.iterations, dynamic routing iteration by iteration "
        "(Procedure 1; 422 for a model whose graph does not have them)",
        examples=[",".join(INCLUDE_DEFAULT), ",".join(INCLUDE_OPTIONS)],
    )
    preprocess: Preprocess = Field("auto", description=PREPROCESS_DESCRIPTION)
    model: str | None = Field(
        None, description=MODEL_DESCRIPTION, examples=MODEL_EXAMPLES, max_length=MODEL_NAME_LENGTH
    )


class PredictRequest(BaseModel):
    """JSON form of /predict (the other is multipart with a `file` field)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"image": PNG_EXAMPLE}]})
    image: str = Field(
        min_length=1, description="the image file as base64, or as a data URL (data:image/png;base64,...)"
    )


class Reconstruction(BaseModel):
    image: Square
    png: str = Field(description="the same image as a PNG data URL", examples=[PNG_EXAMPLE])


class Drawing(BaseModel):
    """A /reconstruct drawing: the fields its ?include= asks for (both by default)."""

    image: Square | None = None
    png: str | None = Field(None, description="the same image as a PNG data URL", examples=[PNG_EXAMPLE])


Maps = Annotated[list[list[list[float]]], PER_CLASS]  # per class, a map on the primary grid


class RoutingIteration(BaseModel):
    """Iteration r of Procedure 1 (dynamic routing): where its couplings took each class's evidence from,
    and how much it moved the routing."""

    iteration: int = Field(
        ge=1, description="r, from 1 (uniform couplings, c_ij = 1/classes) to R (the final c_ij, routing.maps')"
    )
    maps: Maps = Field(
        description="routing.maps with this iteration's couplings: per class j, Σ over the primary types of "
        "c_ij·||u_hat_j|i|| on the primary grid (6x6 for MNIST), c_ij = softmax_j(b_ij) (Eq. 3)"
    )
    logit_change: float = Field(
        ge=0.0,
        description="mean over i, j of |Δb_ij| = |u_hat_j|i · v_j|, the agreement this iteration adds to the "
        "routing logits, v_j after r iterations (the paper's Fig. A.1); the last: what an iteration R+1 "
        "would add",
    )
    coupling_change: float = Field(
        ge=0.0,
        le=1.0,
        description="mean over i, j of |c_ij of this iteration - c_ij of the one before|: how far it moved "
        "the couplings (0 for r = 1)",
    )


class Routing(BaseModel):
    """How the primary capsules were routed to the class capsules: ?include=routing gives the maps,
    ?include=coefficients the coefficients, ?include=iterations the iterations (models with dynamic routing)."""

    coefficients: list[Annotated[list[float], PER_CLASS]] | None = Field(
        None,
        description="the routing coefficients of the primary capsules x 10 classes (MNIST: 1152 = 32 types on a "
        "6x6 grid, i = type*36 + row*6 + col; GET /models): for dynamic routing the final c_ij of Procedure 1 "
        "(each row sums to 1), for EM the responsibilities R_ij (rows sum to 1), for QP routing the "
        "learned coefficients (no softmax: any sign, rows need not sum to 1; docs/routing.md)",
    )
    maps: Maps | None = Field(
        None,
        description="per class j, a map on the primary grid (6x6 for MNIST): Σ over the primary types of "
        "c_ij·||u_hat_j|i||: how much of class j's evidence routing took from each place",
    )
    iterations: list[RoutingIteration] | None = Field(
        None,
        min_length=1,
        description="dynamic routing, iteration by iteration (Procedure 1, r = 1..R; R = 3 for every shipped "
        "model): each iteration's maps, logit change and coupling change",
    )


class ModelInfo(BaseModel):
    name: str = Field(description="the served model (?model=)", examples=["mnist"])
    version: str = Field(
        description="first 12 hex digits of the sha256 of the graph that answered "
        "(capsnet.onnx, or capsnet.int8.onnx: see precision)",
        examples=["6d67e9936c01"],
    )
    provider: str = Field(description="the ONNX Runtime execution provider in use", examples=["CPUExecutionProvider"])
    precision: Literal["fp32", "int8"] = Field(
        description="which graph answered: capsnet.onnx (fp32) or its int8-quantised variant (CPU)"
    )


class RunnerUp(BaseModel):
    digit: int = Field(ge=0, le=C - 1, description="the class (index) with the longest capsule after the answer's")
    label: str = Field(description="its name (a digit, or a Fashion-MNIST class)", examples=["1"])
    length: float = Field(ge=0.0, le=1.0, description="its capsule length ||v_j||")


class Object(BaseModel):
    """One of the objects of a several-object model (MultiMNIST): a long capsule and its drawing."""

    digit: int = Field(ge=0, le=C - 1, description="its class (index)")
    label: str = Field(examples=["3"])
    length: float = Field(ge=0.0, le=1.0, description="its capsule length ||v_j||")
    reconstruction: Reconstruction | None = Field(None, description="the decoder's drawing from this capsule alone")


def _predict_example() -> dict:
    probabilities = [0.01] * C
    probabilities[7], probabilities[1] = 0.98, 0.06
    return {
        "prediction": 7,
        "label": "7",
        "probabilities": probabilities,
        "runner_up": {"digit": 1, "label": "1", "length": 0.06},
        "warnings": [],
        "capsules": [[0.0] * D for _ in range(C)],
        "reconstruction": {"image": [[0.0] * S for _ in range(S)], "png": PNG_EXAMPLE},
        "routing": {"maps": [[[0.5] * G for _ in range(G)] for _ in range(C)]},
        "input": PNG_EXAMPLE,
        "model": {"name": "mnist", "version": "6d67e9936c01", "provider": "CPUExecutionProvider", "precision": "int8"},
    }


class PredictResponse(BaseModel):
    """What the model says about one image. `include` picks capsules, reconstruction, routing and input (all four
    by default) and routing's coefficients and iterations (only when named)."""

    model_config = ConfigDict(json_schema_extra={"examples": [_predict_example()]})
    prediction: int = Field(ge=0, le=C - 1, description="the class (index) with the longest capsule")
    label: str = Field(description="its name: the digit, or a Fashion-MNIST class", examples=["7"])
    probabilities: Annotated[list[Unit], PER_CLASS] = Field(
        description="capsule lengths ||v_j||, each in [0, 1], independent (not a softmax)"
    )
    runner_up: RunnerUp = Field(
        description="the longest capsule after the answer's (after both digits' for MultiMNIST): "
        "how close another answer came"
    )
    objects: list[Object] | None = Field(
        None,
        description="a model whose images hold several objects (MultiMNIST: "
        "two digits): the longest capsules, longest first, each with its drawing",
    )
    overlay: str | None = Field(
        None,
        description="several objects: their reconstructions over the dimmed input as a "
        "PNG data URL, the first in red and the second in green (the paper's Fig. 5)",
    )
    warnings: list[str] = Field(
        description="sentences about an unusual input or a doubtful answer (very low "
        "contrast, other shapes left out, a blob rather than strokes, no capsule longer than "
        "m- = 0.1, a runner-up above 0.5); empty when there is nothing to say",
        examples=[
            [
                "very low contrast: the ink differs from the paper by 0.12 of the full range; "
                "a darker pen or more light would help"
            ]
        ],
    )
    capsules: Annotated[list[Annotated[list[float], PER_DIM]], PER_CLASS] | None = Field(
        None, description="class capsules v_j, 10x16"
    )
    reconstruction: Reconstruction | None = Field(None, description="the decoder's drawing of the longest capsule")
    routing: Routing | None = Field(
        None, description="include=routing: the final couplings and their maps; include=iterations: every iteration"
    )
    input: str | None = Field(
        None,
        description=f"include={INPUT}: the image the model saw (its input size), as a PNG data URL",
        examples=[PNG_EXAMPLE],
    )
    model: ModelInfo


# --- /reconstruct ---------------------------------------------------------------------------------
Capsule = Annotated[
    list[Annotated[float, Field(ge=-CAPSULE_LIMIT, le=CAPSULE_LIMIT, allow_inf_nan=False, strict=True)]],
    Field(min_length=D, max_length=D, description="a 16D digit capsule, finite numbers within ±1000"),
]


Digit = Annotated[
    int, Field(ge=0, le=C - 1, strict=True, description="which digit capsule to fill (the others stay zero)")
]


class ReconstructItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    digit: Digit
    capsule: Capsule


class ReconstructRequest(BaseModel):
    """One capsule (`digit` + `capsule`) or a batch (`items`)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [{"required": ["digit", "capsule"]}, {"required": ["items"]}],
            "examples": [
                {"digit": 7, "capsule": [0.05] * D},
                {"items": [{"digit": 3, "capsule": [0.0] * D}, {"digit": 3, "capsule": [0.25, *[0.0] * (D - 1)]}]},
            ],
        },
    )
    # None means "not sent" (a sent null is rejected): defaults are not validated. The types are what a request
    # may send, which None is not, hence the ignores
    digit: Digit = None  # type: ignore[assignment]  # None: not sent
    capsule: Capsule = None  # type: ignore[assignment]  # None: not sent
    items: list[ReconstructItem] = Field(
        None,  # type: ignore[arg-type]  # None: not sent
        min_length=1,
        description="a batch, at most max_reconstruct_batch items (256 by default)",
    )

    @model_validator(mode="after")
    def _one_form(self) -> "ReconstructRequest":
        single = self.digit is not None or self.capsule is not None
        if self.items is not None and single:
            raise ValueError("send either digit and capsule, or items, not both")
        if self.items is None and (self.digit is None or self.capsule is None):
            raise ValueError("send digit (0-9) and capsule (16 numbers), or items (a list of them)")
        return self

    def as_items(self) -> list[ReconstructItem]:
        return self.items if self.items is not None else [ReconstructItem(digit=self.digit, capsule=self.capsule)]


class ReconstructResponse(BaseModel):
    """One reconstruction per requested capsule, in order, at the model's input size."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"items": [{"image": [[0.0] * S for _ in range(S)], "png": PNG_EXAMPLE}]}]}
    )
    items: list[Drawing]


# --- /explain -------------------------------------------------------------------------------------
EXPLAIN_OPTIONS = ("inputs", "reconstructions", "capsules")  # /explain?include=
EXPLAIN_DEFAULT = ("inputs", "reconstructions")
SWEEP_STEPS = 19  # /explain's default: -45..45 degrees in 5 degree steps
MAX_SWEEP_STEPS = 64  # one batch of the default max_batch


class Followed(BaseModel):
    digit: int = Field(ge=0, le=C - 1, description="the class whose capsule the sweep follows")
    label: str = Field(examples=["7"])


class SweepStep(BaseModel):
    """The model's answer for the input under one value of the transform."""

    value: float = Field(description="the transform's parameter at this step (its unit: `unit`)")
    prediction: int = Field(ge=0, le=C - 1, description="the class with the longest capsule at this step")
    label: str = Field(examples=["7"])
    lengths: Annotated[list[Unit], PER_CLASS] = Field(description="capsule lengths ||v_j|| at this step")
    capsule: Annotated[list[float], PER_DIM] = Field(description="the followed class's capsule v_j at this step")
    capsules: Annotated[list[Annotated[list[float], PER_DIM]], PER_CLASS] | None = Field(
        None, description="every class capsule, 10x16 (include=capsules)"
    )
    input: str | None = Field(None, description="the transformed input as a PNG data URL (include=inputs)")
    reconstruction: str | None = Field(
        None,
        description="the decoder's drawing of the followed capsule alone, PNG data URL (include=reconstructions)",
    )


class ExplainResponse(BaseModel):
    """A sweep of one transform over the model's input, run as one batch: how the capsules move."""

    transform: TransformName
    unit: str = Field(examples=["degrees"])
    follow: Followed = Field(description="the answer for the untransformed input, unless ?follow= names a class")
    original: SweepStep = Field(description="the untransformed input (value: the transform's identity)")
    steps: list[SweepStep] = Field(description="one per value, in order")
    input: str = Field(description="the untransformed input (the model's size) as a PNG data URL")
    warnings: list[str] = Field(description="sentences about the input, as /predict's")
    model: ModelInfo


# --- health ---------------------------------------------------------------------------------------
class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    status: Literal["ready"] = "ready"
    providers: list[str] = Field(description="the default model's", examples=[["CPUExecutionProvider"]])
    precision: Literal["fp32", "int8"] = Field(description="the default model's graph (CAPSNET_PRECISION)")
    models: list[str] = Field(description="every served model, all warm", examples=[["mnist", "multimnist"]])


class ModelEntry(BaseModel):
    name: str = Field(description="what ?model= takes", examples=["multimnist"])
    default: bool = Field(description="the model of requests without ?model=")
    title: str = Field(description="the card's name", examples=["capsnet-multimnist"])
    version: str = Field(description="first 12 hex digits of the served graph's sha256", examples=["fcd7fd993df3"])
    task: str = Field(examples=["two overlapping handwritten digits (section 6)"])
    input_size: int = Field(description="side of the square input and of the reconstructions, px", examples=[36])
    preprocessing: Literal[contract.PREPROCESSING] = Field(description="what preprocess=auto does")  # type: ignore[valid-type]
    objects: int = Field(description="objects in one image, named by the longest capsules", examples=[2])
    classes: list[str] = Field(examples=[[str(d) for d in range(C)]])
    accuracy: float | None = Field(
        description="held-out accuracy from the model card (see metric and test_set)", examples=[0.8706]
    )
    metric: str = Field(examples=["both labels right: the two longest capsules are the two digits' classes"])
    test_set: str
    dimensions: dict[str, list[str]] | None = Field(
        description="what raising each dimension of a class capsule does to the decoder's drawing, in a few "
        "words (section 5.1, Fig. 4; the card's `dimensions` section, measured by training/dimensions.py): "
        "class label -> one label per capsule dimension, in order (none for a class the model read no "
        "example of right); null for a card without the section",
        examples=[{"1": ["local: reshapes top", "shorter", "local: adds ink top", "...", "local: adds ink middle"]}],
    )
    routing_iterations: int | None = Field(
        description="R, when the served graph exports every routing iteration (/predict?include=iterations); "
        "null when it does not (EM and QP routing, graphs exported before)",
        examples=[3],
    )
    precision: Literal["fp32", "int8"]
    provider: str = Field(examples=["CPUExecutionProvider"])
    ready: bool
    state: str = Field(examples=["ready"])


class Models(BaseModel):
    default: str = Field(examples=["mnist"])
    models: list[ModelEntry]


class Batching(BaseModel):
    max_batch: int = Field(description="most images per ONNX Runtime run; 1 = batching off")
    max_wait_ms: float = Field(description="how long a batch under load waits to fill up")
    max_queue: int = Field(description="most requests waiting; beyond it 503")


class ModelCard(BaseModel):
    """capsnet.json (the model card written by training/export.py) plus what runs it here."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "name": "capsnet-mnist",
                    "served_as": "mnist",
                    "version": "e25c18606710",
                    "test_accuracy": 0.996,
                    "providers": ["CPUExecutionProvider"],
                    "batching": {"max_batch": 64, "max_wait_ms": 2.0, "max_queue": 1024},
                }
            ]
        },
    )
    name: str
    served_as: str = Field(description="what ?model= calls it here")
    version: str
    providers: list[str] = Field(description="session.get_providers(): what really runs the model")
    precision: Literal["fp32", "int8"] = Field(
        description="the graph in use: version is its sha256's first 12 "
        "hex digits (the card's own for fp32, int8.version for int8)"
    )
    batching: Batching


class ErrorMessage(BaseModel):
    detail: str = Field(examples=["the file is not a PNG, JPEG, BMP, GIF or WebP image"])


def errors(described: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """A route's `responses=` for OpenAPI: each status an ErrorMessage, with what it means."""
    return {status: {"model": ErrorMessage, "description": text} for status, text in described.items()}


# --- /v2/models/NAME/infer (the Open Inference Protocol) ----------------------------------------------
# Each served graph takes its own tensor (GET /v2/models/NAME says which), so each has its own request
# schema, made from the graph's input when the models are loaded (app/routes/inference_protocol.py
# documents one infer operation per graph); the response is the same for all.
def infer_request_schema(tensor: str, dims: list[int], low: float, high: float, rows: int, outputs: list[str]) -> dict:
    """The JSON request of one graph's infer, as a JSON Schema: its one input `tensor` of shape
    [rows, *dims], `data` nested as the shape with numbers in [low, high], and which of `outputs` to return.

    NOTE JSON Schema cannot say that shape[0] is the number of rows in `data`; the description says it.
    """
    value = {"type": "number", "minimum": low, "maximum": high}
    for d in reversed(dims):
        value = {"type": "array", "items": value, "minItems": d, "maxItems": d}
    shape = {
        "type": "array",
        "prefixItems": [{"type": "integer", "minimum": 1, "maximum": rows}] + [{"const": d} for d in dims],
        "items": False,
        "minItems": len(dims) + 1,
        "description": f"[rows, {', '.join(map(str, dims))}]: rows is the number of rows in data, 1 to {rows}",
    }
    data = {
        "type": "array",
        "items": value,
        "minItems": 1,
        "maxItems": rows,
        "description": f"the tensor nested as its shape (or flat, row-major, as tritonclient sends it), numbers "
        f"in [{low:g}, {high:g}]",
    }
    parameters = {
        "type": "object",
        "properties": {"binary_data_size": False},
        "description": "binary_data_size belongs to the binary form (application/octet-stream)",
    }
    tensor_schema = {
        "type": "object",
        "required": ["name", "datatype", "shape", "data"],
        "properties": {
            "name": {"const": tensor},
            "datatype": {"const": "FP32"},
            "shape": shape,
            "data": data,
            "parameters": parameters,
        },
    }
    output = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"enum": outputs},
            "parameters": {
                "type": "object",
                "properties": {
                    "binary_data": {
                        "type": "boolean",
                        "description": "return this output as bytes after the JSON response",
                    }
                },
            },
        },
    }
    return {
        "title": f"InferRequest[{tensor}]",
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": {"type": "string", "description": "returned as the response's id"},
            "parameters": {
                "type": "object",
                "properties": {
                    "binary_data_output": {
                        "type": "boolean",
                        "description": "every output as bytes after the JSON response, unless an output says otherwise",
                    }
                },
            },
            "inputs": {"type": "array", "items": tensor_schema, "minItems": 1, "maxItems": 1},
            "outputs": {
                "type": "array",
                "items": output,
                "minItems": 1,
                "description": f"the outputs to return, at least one (default: all of {', '.join(outputs)}, as JSON)",
            },
        },
    }


class InferOutput(BaseModel):
    name: str = Field(description="one of the graph's outputs (GET /v2/models/NAME)", examples=["lengths"])
    datatype: Literal["FP32"]
    shape: list[int] = Field(examples=[[1, C]])
    data: list[float] | None = Field(None, description="the tensor's values, flat, row-major (a JSON output)")
    parameters: dict[str, int] | None = Field(
        None, description='a binary output: {"binary_data_size": its bytes in the body after the JSON response}'
    )


class InferResponse(BaseModel):
    """The outputs asked for, in order; binary ones follow the JSON in the body (application/octet-stream,
    the JSON's length in Inference-Header-Content-Length)."""

    model_name: str = Field(examples=["mnist"])
    model_version: str = Field(description="first 12 hex digits of the graph's sha256", examples=["969925246d42"])
    id: str | None = Field(None, description="the request's id, when it sent one")
    outputs: list[InferOutput]
