"""The answers of /predict, /explain and /reconstruct, built below the routes: a route reads its request
and makes one call here; this module prepares the image, has the engine read it (app/engine.py batches
every run) and writes the response's JSON bytes from the graphs' outputs.

Paper: `Dynamic Routing Between Capsules` - Sabour, Frosst & Hinton, NIPS 2017
    https://arxiv.org/abs/1710.09829

predict     one image -> PredictResponse: the class capsules' lengths, the runner-up, doubts, the
            capsules, the reconstruction (each object's, for a model of several), the routing
explain     one image and a sweep of one transform over the model's input, run as one batch ->
            ExplainResponse: per step the lengths and the followed capsule (a capsule's length
            says whether its entity is there, section 2; its direction how it is drawn, section 5.1)
reconstruct class capsules -> the decoder's drawings (Fig. 4's perturbations)
"""

import time

import numpy as np
import orjson
from fastapi.concurrency import run_in_threadpool
from PIL import Image

from app import imaging
from app.couplings import coupling_changes, iteration_maps, routing_maps
from app.engine import Engine, Outputs
from app.imaging.transform import TRANSFORMS, TransformName, sweep
from app.schemas import COEFFICIENTS, INPUT, ITERATIONS
from model import contract

# A small picture (both bounds, its sides by its header) is prepared on the event loop: it costs about
# what the hop to the thread pool would, and its worst case, a dot scaled up to have its stroke measured,
# is bounded (app/imaging/digit.py: MAX_THINNING, eroded)
INLINE_BYTES = 16 * 1024
INLINE_SIDE = 64

# Halfway between the margin loss's targets (Eq. 4): a capsule this long is neither clearly absent
# (< m- = 0.1) nor clearly present (> m+ = 0.9).
UNDECIDED_LENGTH = (contract.M_PLUS + contract.M_MINUS) / 2

# A model of several objects (MultiMNIST's pairs) names that many in every image, a single digit's too, whose second
# capsule is often long (a part of the digit read as another digit). Shorter than this, the last one named is
# seldom one of a pair and often a single digit's phantom: multimnist through /predict, 2026-11-28, 400 held-out
# pairs (0.5% drawn large, 0.9% at 36x36) against 400 single test digits (21% and 23%)
FEWER_OBJECTS_LENGTH = 0.3

# The parts of /predict's answer that need no output but the class capsules' (contract.CAPSULE_OUTPUTS); an
# answer of no others is read from them alone (Engine.predict's lean)
CAPSULE_PARTS = frozenset({"capsules", INPUT})


# --- the image in ----------------------------------------------------------------------------------
async def load_input(data: bytes, preprocess: str, engine: Engine, max_pixels: int) -> imaging.Prepared:
    """Bytes -> the model's (size, size) input and its warnings (the card's preprocessing; `none`: the
    image as it is; `auto` and its alias `mnist`: the card's). A small picture (at most INLINE_BYTES, and
    INLINE_SIDE px a side by its header) is prepared on the event loop, any other in the thread pool; a small
    plain grey PNG is decoded without Pillow (imaging.plain_grey_png)."""
    how = engine.spec.preprocessing
    kind = "none" if preprocess == "none" else how.kind

    def prepared(image: Image.Image) -> imaging.Prepared:
        return imaging.preprocess(imaging.load(image), kind, engine.size, how.ink_box)

    if len(data) > INLINE_BYTES:
        return await run_in_threadpool(lambda: prepared(imaging.open_image(data, max_pixels)))
    if (pixels := imaging.plain_grey_png(data, INLINE_SIDE, max_pixels)) is not None:
        return imaging.preprocess(pixels, kind, engine.size, how.ink_box)
    image = imaging.open_image(data, max_pixels)  # its header only
    return prepared(image) if max(image.size) <= INLINE_SIDE else await run_in_threadpool(prepared, image)


def ranked(lengths: np.ndarray) -> np.ndarray:
    """Class indices, longest capsule first (ties: the lower index, as argmax)."""
    return np.argsort(-lengths, kind="stable")


async def read(
    prepared: imaging.Prepared, engine: Engine, iterations: bool, lean: bool = False
) -> tuple[Outputs, imaging.Prepared]:
    """The model's outputs for the prepared input (with iterations, CAPSNET_ITERATION_OUTPUTS too; lean: at
    least the class capsules', contract.CAPSULE_OUTPUTS, all that the caller reads of a single image). Of
    several candidates (a drawing at several scales) the one its own answer explains best: the objects'
    capsules, each decoded alone (one decoder batch for every candidate), redraw the candidate with the
    least squared error per unit of its ink: section 6's reconstructions (Fig. 5) turned into a test of the fit."""
    if prepared.candidates is None:
        return await engine.predict(prepared.image, iterations, lean), prepared
    images = prepared.candidates
    outputs = await engine.predict_many(images, iterations)
    named = [ranked(out[contract.LENGTHS])[: engine.spec.objects] for out in outputs]
    drawings = await engine.reconstruct(
        np.concatenate(named),
        np.concatenate([out[contract.CAPSULES][c] for out, c in zip(outputs, named, strict=True)]),
    )
    explained = drawings.reshape(len(images), engine.spec.objects, *images.shape[1:]).max(axis=1)
    error = ((explained - images) ** 2).sum(axis=(1, 2)) / np.maximum((images**2).sum(axis=(1, 2)), 1e-6)
    best = int(np.argmin(error))
    return outputs[best], prepared._replace(image=images[best], candidates=None)


# --- /predict ----------------------------------------------------------------------------------------
def doubts(lengths: np.ndarray, order: np.ndarray, classes: list[str], objects: int = 1) -> list[str]:
    """Sentences for an answer the model is unsure of, read from the capsule lengths, their order
    (longest first) and how many objects an image holds (the longest `objects` capsules name them)."""
    notes = []
    last, next_ = int(order[objects - 1]), int(order[objects])
    if lengths[last] < contract.M_MINUS:
        which = "no class capsule is long: the longest" if objects == 1 else f"capsule {objects} of {objects} expected"
        notes.append(
            f"{which} ({classes[last]}) is {lengths[last]:.2f}, below m- = {contract.M_MINUS}; the image "
            f"may not show {'what the model reads' if objects == 1 else f'{objects} objects'}"
        )
    elif objects > 1 and lengths[last] < FEWER_OBJECTS_LENGTH:
        notes.append(
            f"capsule {objects} of {objects} expected ({classes[last]}) is short, {lengths[last]:.2f}: the image "
            f"may show fewer than {objects} objects, and that one be a guess"
        )
    if lengths[next_] >= UNDECIDED_LENGTH:
        notes.append(
            f"the runner-up {classes[next_]} is also long ({lengths[next_]:.2f} against "
            f"{lengths[last]:.2f}); the answer is ambiguous"
        )
    return notes


def image_field(x: np.ndarray) -> dict:
    return {"image": x, "png": imaging.png_data_url(x)}


def model_info(engine: Engine) -> dict:
    """Which graph answered (schemas.ModelInfo)."""
    return {
        "name": engine.name,
        "version": engine.version,
        "provider": engine.providers[0],
        "precision": engine.precision,
    }


async def draw_objects(outputs: Outputs, engine: Engine) -> np.ndarray:
    """Each object of a several-object model (MultiMNIST) drawn from its own capsule, longest first:
    (objects, size, size), one decoder batch (section 6: each digit reconstructed alone)."""
    named = ranked(outputs[contract.LENGTHS])[: engine.spec.objects]
    return await engine.reconstruct(named, outputs[contract.CAPSULES][named])


def routing_iterations(outputs: Outputs, engine: Engine) -> list[dict]:
    """Procedure 1 iteration by iteration (schemas.RoutingIteration): each iteration's routing maps (its
    c_ij times ||u_hat_j|i||), the mean |delta b_ij| it adds (Fig. A.1) and how far it moved the c_ij."""
    couplings = outputs[contract.ROUTING_ITERATIONS]  # (R, primary, classes)
    primary = engine.spec.primary_capsules
    maps = iteration_maps(couplings, outputs[contract.VOTE_LENGTHS], primary.types, primary.grid)
    changes = zip(maps, outputs[contract.LOGIT_CHANGES], coupling_changes(couplings), strict=True)
    return [
        {"iteration": r, "maps": m, "logit_change": logit, "coupling_change": coupling}
        for r, (m, logit, coupling) in enumerate(changes, start=1)
    ]


def render_prediction(
    outputs: Outputs, prepared: imaging.Prepared, include: set[str], engine: Engine, drawings: np.ndarray | None = None
) -> bytes:
    """The PredictResponse JSON, straight from the arrays (orjson writes float32 as float32). A model
    whose images hold several objects also gets them, with their drawings (draw_objects) and overlay."""
    lengths, classes, objects = outputs[contract.LENGTHS], engine.spec.classes, engine.spec.objects
    order = ranked(lengths)
    first, second = int(order[0]), int(order[objects])
    body: dict = {
        "prediction": first,
        "label": classes[first],
        "probabilities": lengths,
        "runner_up": {"digit": second, "label": classes[second], "length": lengths[second]},
        "warnings": prepared.warnings + doubts(lengths, order, classes, objects),
    }
    if objects > 1:
        body["objects"] = [{"digit": int(j), "label": classes[j], "length": lengths[j]} for j in order[:objects]]
        if drawings is not None:
            for item, drawing in zip(body["objects"], drawings, strict=True):
                item["reconstruction"] = image_field(drawing)
            body["overlay"] = imaging.png_data_url(imaging.overlay(prepared.image, drawings))
    if "capsules" in include:
        body["capsules"] = outputs[contract.CAPSULES]
    if "reconstruction" in include:
        body["reconstruction"] = image_field(outputs[contract.RECONSTRUCTION])
    routing: dict = {}
    if COEFFICIENTS in include:
        routing[COEFFICIENTS] = outputs[contract.ROUTING]
    if "routing" in include:
        primary = engine.spec.primary_capsules
        votes = outputs[contract.VOTE_LENGTHS]
        routing["maps"] = routing_maps(outputs[contract.ROUTING], votes, primary.types, primary.grid)
    if ITERATIONS in include:
        routing[ITERATIONS] = routing_iterations(outputs, engine)
    if routing:
        body["routing"] = routing
    if INPUT in include:
        body[INPUT] = imaging.png_data_url(prepared.image)
    body["model"] = model_info(engine)
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


async def predict(
    data: bytes, preprocess: str, include: set[str], engine: Engine, max_pixels: int
) -> tuple[bytes, dict[str, float]]:
    """/predict's answer to an image file: prepared, read (with the iteration outputs when `include` names
    them), each object drawn for a model of several when the reconstruction is asked for, rendered; and the
    seconds each of those stages took (`prepare`, `model`: the runs with their batching, `render`)."""
    begun = time.perf_counter()
    prepared = await load_input(data, preprocess, engine, max_pixels)
    prepared_at = time.perf_counter()
    outputs, prepared = await read(prepared, engine, ITERATIONS in include, lean=include <= CAPSULE_PARTS)
    several = engine.spec.objects > 1 and "reconstruction" in include
    drawings = await draw_objects(outputs, engine) if several else None
    read_at = time.perf_counter()
    body = render_prediction(outputs, prepared, include, engine, drawings)
    stages = {"prepare": prepared_at - begun, "model": read_at - prepared_at, "render": time.perf_counter() - read_at}
    return body, stages


# --- /explain ----------------------------------------------------------------------------------------
def step(outputs: Outputs, value: float, follow: int, engine: Engine, include: set[str]) -> dict:
    """One step's answer: lengths, the winner, the followed capsule (and every capsule on request)."""
    lengths, capsules = outputs[contract.LENGTHS], outputs[contract.CAPSULES]
    winner = int(np.argmax(lengths))
    item = {
        "value": value,
        "prediction": winner,
        "label": engine.spec.classes[winner],
        "lengths": lengths,
        "capsule": capsules[follow],
    }
    if "capsules" in include:
        item["capsules"] = capsules
    return item


def render_sweep(
    transform: TransformName,
    values: np.ndarray,
    follow: int,
    original: Outputs,
    outputs: list[Outputs],
    images: np.ndarray,
    drawings: np.ndarray | None,
    prepared: imaging.Prepared,
    include: set[str],
    engine: Engine,
) -> bytes:
    """The ExplainResponse JSON; its PNGs, one or two a step, are why it runs off the event loop."""
    spec = TRANSFORMS[transform]
    steps = [step(out, float(v), follow, engine, include) for out, v in zip(outputs, values, strict=True)]
    if "inputs" in include:
        for item, image in zip(steps, images, strict=True):
            item["input"] = imaging.png_data_url(image)
    if drawings is not None:
        for item, drawing in zip(steps, drawings, strict=True):
            item["reconstruction"] = imaging.png_data_url(drawing)
    body = {
        "transform": transform,
        "unit": spec.unit,
        "follow": {"digit": follow, "label": engine.spec.classes[follow]},
        "original": step(original, spec.identity, follow, engine, include),
        "steps": steps,
        "input": imaging.png_data_url(prepared.image),
        "warnings": prepared.warnings,
        "model": model_info(engine),
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


async def explain(
    data: bytes,
    preprocess: str,
    engine: Engine,
    max_pixels: int,
    transform: TransformName,
    values: np.ndarray,
    follow: int | None,
    include: set[str],
) -> bytes:
    """/explain's answer: the image prepared as /predict prepares it, then transformed once per value
    (app/imaging/transform.py) and read as one batch; with `reconstructions`, the decoder draws the
    followed capsule (default: the answer's) at every step in one more batch."""
    prepared = await load_input(data, preprocess, engine, max_pixels)
    original, prepared = await read(prepared, engine, iterations=False, lean=True)
    chosen = int(np.argmax(original[contract.LENGTHS])) if follow is None else follow
    images = await run_in_threadpool(sweep, prepared.image, transform, values)
    outputs = await engine.predict_many(images)
    drawings = None
    if "reconstructions" in include:
        capsules = np.stack([out[contract.CAPSULES][chosen] for out in outputs])
        drawings = await engine.reconstruct(np.full(len(outputs), chosen), capsules)
    return await run_in_threadpool(
        render_sweep, transform, values, chosen, original, outputs, images, drawings, prepared, include, engine
    )


# --- /reconstruct ------------------------------------------------------------------------------------
def render_drawings(images: np.ndarray, include: set[str]) -> bytes:
    """The drawings as JSON: pixels and/or PNG data URLs, as `include` asks (a PNG each: off the event loop)."""
    items = [
        {
            **({"image": image} if "image" in include else {}),
            **({"png": imaging.png_data_url(image)} if "png" in include else {}),
        }
        for image in images
    ]
    return orjson.dumps({"items": items}, option=orjson.OPT_SERIALIZE_NUMPY)


async def reconstruct(digits: np.ndarray, capsules: np.ndarray, include: set[str], engine: Engine) -> bytes:
    """/reconstruct's answer: each class (digits, (n,)) drawn by the decoder from its capsule ((n, 16)),
    the other class capsules zeroed (section 4.1)."""
    images = await engine.reconstruct(digits, capsules)
    return await run_in_threadpool(render_drawings, images, include)
