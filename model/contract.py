"""The contract between training and serving: ONNX names, shapes, pixel convention, file names.

This is the one place these names are spelled (DESIGN.md, "ONNX contract"). It imports no torch so
that the serving path (app/, frontend/) can read it for free. Like timm's `_cfg`, it also says what
the model expects as input so nobody has to guess the preprocessing.
"""
from pathlib import Path

# --- input convention ----------------------------------------------------------------------------
IMAGE_SIZE = 28  # MNIST: 28x28, one channel
INK_BOX = 20  # LeCun's MNIST digits are fitted into 20x20 and centred by mass in 28x28
PIXEL_RANGE = (0.0, 1.0)  # float32, white digit (1.0) on black (0.0)

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
VOTE_LENGTHS = "vote_lengths"  # ||u_hat_j|i||, for the per-class routing maps (not in DESIGN.md's first draft)
BATCH = "N"

CAPSNET_INPUTS = (IMAGE,)
CAPSNET_OUTPUTS = (LENGTHS, CAPSULES, ROUTING, RECONSTRUCTION, VOTE_LENGTHS)
DECODER_INPUTS = (CAPSULES,)
DECODER_OUTPUTS = (RECONSTRUCTION,)

CAPSNET_SHAPES = {
    IMAGE: (BATCH, 1, IMAGE_SIZE, IMAGE_SIZE),
    LENGTHS: (BATCH, NUM_CLASSES),
    CAPSULES: (BATCH, NUM_CLASSES, CAPSULE_DIM),
    ROUTING: (BATCH, NUM_PRIMARY, NUM_CLASSES),
    RECONSTRUCTION: (BATCH, IMAGE_SIZE, IMAGE_SIZE),
    VOTE_LENGTHS: (BATCH, NUM_PRIMARY, NUM_CLASSES),
}
DECODER_SHAPES = {
    CAPSULES: (BATCH, NUM_CLASSES, CAPSULE_DIM),
    RECONSTRUCTION: (BATCH, IMAGE_SIZE, IMAGE_SIZE),
}

# --- shipped artefacts ---------------------------------------------------------------------------
MODEL_DIR = Path(__file__).resolve().parent
CAPSNET_ONNX = "capsnet.onnx"
DECODER_ONNX = "decoder.onnx"
MODEL_CARD = "capsnet.json"
