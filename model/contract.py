"""The contract between training and serving: ONNX names, shapes, pixel convention, file names.

This is the one place these names are spelled (docs/ARCHITECTURE.md, "Contracts"). It imports no torch so
that the serving path (app/, frontend/) can read it for free. Like timm's `_cfg`, it also says what
the model expects as input so nobody has to guess the preprocessing.
"""

from pathlib import Path

# --- input convention ----------------------------------------------------------------------------
IMAGE_SIZE = 28  # MNIST: 28x28, one channel
INK_BOX = 20  # LeCun's MNIST digits are fitted into 20x20 and centred by mass in 28x28
# MNIST's stroke widths as fractions of the digit's longer side (the 20 px box), as app.imaging.digit measures
# them (`python -m benchmarks.robustness --strokes`, 2,000 training digits): median, and 1st and 99th
# percentiles; strokes outside the range are reshaped to the median.
STROKE_MEDIAN = 0.125
STROKE_RANGE = (0.071, 0.25)
PIXEL_RANGE = (0.0, 1.0)  # float32, white digit (1.0) on black (0.0)
# A picture sent to the service is read box-reduced to at most WORK_SIZE px a side, and has at most MAX_PIXELS
# (CAPSNET_MAX_PIXELS' default); the demo sends one the service refuses as too large reduced to WORK_SIZE
WORK_SIZE = 1024
MAX_PIXELS = 40_000_000
MULTIMNIST_SIZE = 36  # two MNIST digits, each shifted up to 4 px, overlaid (section 6)
AFFINE_SIZE = 40  # MNIST digits at random positions on a 40x40 canvas (section 5.2)

# --- network sizes (paper, section 4) ------------------------------------------------------------
NUM_CLASSES = 10
PRIMARY_TYPES = 32  # PrimaryCaps capsule types (channels of 8D capsules)
PRIMARY_DIM = 8
PRIMARY_GRID = 6  # 28x28 input -> 6x6 grid, capsule index i = type*36 + row*6 + col
NUM_PRIMARY = PRIMARY_TYPES * PRIMARY_GRID * PRIMARY_GRID  # 1152
CAPSULE_DIM = 16  # DigitCaps dimension
M_PLUS, M_MINUS, LAMBDA_ABSENT = 0.9, 0.1, 0.5  # margin loss, Eq. 4

# --- perturbation range of the paper's Fig. 4 ----------------------------------------------------
PERTURB_LIMIT = 0.25
PERTURB_STEP = 0.05

# --- ONNX names ----------------------------------------------------------------------------------
IMAGE = "image"
LENGTHS = "lengths"
CAPSULES = "capsules"
ROUTING = "routing"
RECONSTRUCTION = "reconstruction"
VOTE_LENGTHS = "vote_lengths"  # ||u_hat_j|i||, for the per-class routing maps
# Procedure 1 iteration by iteration (dynamic routing's graphs only): the c_ij that iteration r = 1..R used
# (r = 1: uniform 1/classes; r = R: ROUTING), and per image the mean |delta b_ij| that iteration r adds to the
# logits (the paper's Fig. A.1; the last: what an R+1-th iteration would add)
ROUTING_ITERATIONS = "routing_iterations"
LOGIT_CHANGES = "logit_changes"
BATCH = "N"

CAPSNET_INPUTS = (IMAGE,)
CAPSNET_OUTPUTS = (LENGTHS, CAPSULES, ROUTING, RECONSTRUCTION, VOTE_LENGTHS)
CAPSNET_ITERATION_OUTPUTS = (ROUTING_ITERATIONS, LOGIT_CHANGES)  # optional, after CAPSNET_OUTPUTS
CAPSULE_OUTPUTS = (LENGTHS, CAPSULES)  # the class capsules: what an answer without routing or drawing reads
DYNAMIC_ROUTING = "dynamic"  # Procedure 1, the routing whose graphs have CAPSNET_ITERATION_OUTPUTS
DECODER_INPUTS = (CAPSULES,)
DECODER_OUTPUTS = (RECONSTRUCTION,)


def primary_grid(image_size: int) -> int:
    """Side of the primary capsules' grid: what conv1 (9x9, stride 1) and PrimaryCaps (9x9, stride 2)
    leave of a square input (28 -> 6, 36 -> 10, 40 -> 12)."""
    return (image_size - 8 - 9) // 2 + 1


def capsnet_shapes(image_size: int = IMAGE_SIZE, routing_iters: int | None = None) -> dict[str, tuple]:
    """The graph's shapes for a square input of image_size (28: MNIST, 36: MultiMNIST); with routing_iters
    (R of Procedure 1), CAPSNET_ITERATION_OUTPUTS' too."""
    primary = PRIMARY_TYPES * primary_grid(image_size) ** 2
    shapes = {
        IMAGE: (BATCH, 1, image_size, image_size),
        LENGTHS: (BATCH, NUM_CLASSES),
        CAPSULES: (BATCH, NUM_CLASSES, CAPSULE_DIM),
        ROUTING: (BATCH, primary, NUM_CLASSES),
        RECONSTRUCTION: (BATCH, image_size, image_size),
        VOTE_LENGTHS: (BATCH, primary, NUM_CLASSES),
    }
    if routing_iters is not None:
        shapes[ROUTING_ITERATIONS] = (BATCH, routing_iters, primary, NUM_CLASSES)
        shapes[LOGIT_CHANGES] = (BATCH, routing_iters)
    return shapes


def capsnet_outputs(image_size: int, routing: str, routing_iters: int) -> dict[str, tuple]:
    """The CapsNet graph's outputs, in order, with their shapes, for a model's input size and routing (its
    card's model_config): CAPSNET_OUTPUTS, then for dynamic routing CAPSNET_ITERATION_OUTPUTS of its R."""
    iterated = routing == DYNAMIC_ROUTING
    shapes = capsnet_shapes(image_size, routing_iters if iterated else None)
    return {name: shapes[name] for name in CAPSNET_OUTPUTS + (CAPSNET_ITERATION_OUTPUTS if iterated else ())}


CAPSNET_SHAPES = capsnet_shapes(IMAGE_SIZE)
DECODER_SHAPES = {k: CAPSNET_SHAPES[k] for k in DECODER_INPUTS + DECODER_OUTPUTS}

# --- shipped artefacts ---------------------------------------------------------------------------
# Every model folder holds the same files: CAPSNET_ONNX, DECODER_ONNX and MODEL_CARD (the one description
# of the model: what it reads, its classes, its measured figures), CAPSNET_INT8_ONNX where it ships.
CAPSNET_ONNX = "capsnet.onnx"
DECODER_ONNX = "decoder.onnx"
CAPSNET_INT8_ONNX = "capsnet.int8.onnx"  # the CPU variant of CAPSNET_ONNX (training/quantize.py), where it ships
MODEL_CARD = "capsnet.json"
MODELS_DIR = Path(__file__).resolve().parents[1] / "models"  # the repository's (and the image's) models/

# The trained models the repository ships, each in MODELS_DIR/<name>/, in the order the service lists
# them and the demo shows them: the flagship first, then the paper's experiments (docs/results.md).
SHIPPED = {name: MODELS_DIR / name for name in ("mnist", "fashion-mnist", "multimnist", "affine")}

# --- what a model folder says about serving it (its card's "serving" section, model/card.py) ----------
SERVING = "serving"
# How a picture becomes the model's input (app/imaging/registry.py): `digit` finds one digit and fits its ink box
# as LeCun's MNIST did; `digit-pair` two overlapping digits, their union's ink box fitted as the
# MultiMNIST training pairs' was; `garment` one object on a plain background, cropped and fitted into
# the frame as Fashion-MNIST's product photos were, its grey levels kept.
PREPROCESSING = ("digit", "digit-pair", "garment")
# What each class-capsule dimension does to the decoder's drawing (model/card.py Dimensions, training/dimensions.py).
DIMENSIONS = "dimensions"


def model_folder(entry: str) -> tuple[str, Path]:
    """A served model as `NAME` (a shipped model) or `NAME=DIR` (a folder as training/export.py writes it)
    -> (name, folder); a ValueError with a sentence otherwise. The API's CAPSNET_MODELS and
    training/triton.py's --model read it."""
    name, _, folder = entry.partition("=")
    name = name.strip()
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ValueError(f"model name {name!r} must be letters, digits, -, _ or . (in {entry!r})")
    if folder.strip():
        return name, Path(folder.strip())
    if name not in SHIPPED:
        raise ValueError(
            f"no shipped model is called {name!r} (shipped: {', '.join(SHIPPED)}); name a folder as {name}=DIR"
        )
    return name, SHIPPED[name]
