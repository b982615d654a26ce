"""What each dimension of a class capsule does to the decoder's drawing (section 5.1, Fig. 4), measured.

$ python -m training.dimensions            # docs/dimensions.md, from the shipped cards
$ python -m training.dimensions --check    # exit 1 if it is stale (what the tests check)
$ python -m training.dimensions --relabel  # the shipped cards' labels given again from their measures (then render)
$ python -m training.export --describe models/*   # measure the cards' sections again (then render)

The paper perturbs one of the 16 dimensions of the correct digit's class capsule v_j by steps of 0.05 in
[-0.25, 0.25] and decodes it (Fig. 4), and names what the dimensions do: "scale and thickness",
"localized part", "stroke thickness", "localized skew", "width and translation". Here every class
capsule j and dimension d gets numbers. For up to EXAMPLES test examples of class j that the model
reads right, the decoder draws v_j with v_j[d] moved by -PERTURB_LIMIT and by +PERTURB_LIMIT, all other
class capsules zeroed (section 4.1), and `changes` compares the two drawings (minus -> plus), averaged
over the examples:

    ink      ln(m+ / m-), m = the drawing's ink mass (sum of its pixels): stroke thickness
    width    ln(w+ / w-), w = sqrt(12 mu20): the length of a uniform bar with the ink's horizontal spread
    height   ln(h+ / h-), h = sqrt(12 mu02)
    slant    degrees, atan(-mu11 / mu02): the shear of the ink's principal axis, + leans the top right
    x, y     px, the ink's centre of mass (y down)
    local    how much more of |plus - minus| falls in its most-changed WINDOW x WINDOW region than of the
             drawing's own ink in its densest one, as a share of what is left: 0 a change spread like the
             ink, 1 a change in one small region (a part: a loop, a tail, a bar)

The examples (training/cards.py dimension_examples) are a model's own test set; the affine model's are
MNIST's test digits centred on 40x40, so that a digit's own variation is measured, not its place on the
canvas. The MultiMNIST model's are its test pairs (section 6) read right, each giving an example to both its
classes: its decoder learnt to draw each digit of a pair alone from that digit's capsule, so those are the
capsules its dimensions describe, while a lone digit on 36x36 is an input it never saw.

The effects have different units, so each is scaled by its spread over all the model's class dimensions
(the RMS of a signed effect, whose zero means no change; the standard deviation about the mean for
locality, which is never zero): a score says how unusual that effect of this dimension is among the
model's 160, and the dimension is labelled by its largest (`dominant`), signed for the + direction. Its
share of the squared scores says how clearly it dominates (1: alone; 1/7: no more than any other). Where
several dimensions of a class get the same label, each is followed by its next largest effect, and by the
one after where they still share it, each if at least half a typical effect (`distinct`): "taller, thicker
stroke" and "taller, slants left".
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort

from model import contract
from model.card import DimensionEffect, Dimensions, Norm, read_dimensions

EXAMPLES = 100  # correctly read test examples per class, first in file order
WINDOW = 7  # px: a part of a digit (a loop, a tail) in the 20 px ink box; a quarter of the 28 px frame
QUIET = 0.25  # a dimension that changes its drawing by less than this share of the model's median: "little change"
EPS = 1e-8
LOG_RATIOS = ("ink", "width", "height")  # ln(plus / minus); the other effects are plus - minus
SIGNED = (*LOG_RATIOS, "slant", "x", "y")
EFFECTS = (*SIGNED, "local")
LABELS = {  # effect -> (label of +, label of -)
    "ink": ("thicker stroke", "thinner stroke"),
    "width": ("wider", "narrower"),
    "height": ("taller", "shorter"),
    "slant": ("slants right", "slants left"),
    "x": ("moves right", "moves left"),
    "y": ("moves down", "moves up"),
}
# A garment has no strokes: more ink is a fuller or brighter one (preprocessing kind -> the ink's labels).
INK_LABELS = {"garment": ("more ink", "less ink")}
QUIET_LABEL = "little change"
QUALIFIERS = 2  # at most this many next effects follow a label that dimensions of a class share
QUALIFIER_SCORE = 0.5  # and each is at least half as large as a typical effect (its spread)
# A change large in its own units (summary): ink, width or height x1.25 or /1.25, 10° of slant, 1 px.
SIZEABLE = {**dict.fromkeys(LOG_RATIOS, float(np.log(1.25))), "slant": 10.0, "x": 1.0, "y": 1.0}
# The paper's names for what dimensions do (Fig. 4) and the effects measured here that stand for them.
PAPER = {
    "scale and thickness": ("ink", "width", "height"),
    "localized part": ("local",),
    "stroke thickness": ("ink",),
    "localized skew": ("slant", "local"),
    "width and translation": ("width", "x"),
}
METHOD = (
    f"section 5.1, Fig. 4: each dimension d of the class capsule v_j moved by -{contract.PERTURB_LIMIT} and "
    f"+{contract.PERTURB_LIMIT} (other class capsules zeroed) and drawn by decoder.onnx; measures of the + "
    "drawing against the - one, averaged over the class's examples (training/dimensions.py); label: the "
    "effect with the largest (measure - centre) / spread over the model's class dimensions, signed for +, "
    f"and where dimensions of a class share it, the next largest, up to {QUALIFIERS}, each with a score of at "
    f"least {QUALIFIER_SCORE}"
)
DOC = Path(__file__).resolve().parents[1] / "docs" / "dimensions.md"
COMMAND = "python -m training.dimensions"


# --- measures of drawings --------------------------------------------------------------------------
def moments(images: np.ndarray) -> dict[str, np.ndarray]:
    """Ink mass, centre, width, height and slant of images (..., H, W) from their raw and central
    moments: m = sum I, (x, y) = centre of mass, mu20, mu02, mu11 the second central moments / m."""
    h, w = images.shape[-2:]
    ys, xs = np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64)
    mass = np.maximum(images.sum((-2, -1)), EPS)
    rows, cols = images.sum(-1), images.sum(-2)  # (..., H), (..., W)
    x, y = (cols * xs).sum(-1) / mass, (rows * ys).sum(-1) / mass
    dx, dy = xs - x[..., None], ys - y[..., None]
    mu20, mu02 = (cols * dx**2).sum(-1) / mass, (rows * dy**2).sum(-1) / mass
    mu11 = np.einsum("...hw,...h,...w->...", images, dy, dx) / mass
    return {
        "ink": mass,
        "width": np.sqrt(12 * mu20),
        "height": np.sqrt(12 * mu02),
        "slant": np.degrees(np.arctan(-mu11 / np.maximum(mu02, EPS))),
        "x": x,
        "y": y,
    }


def windows(images: np.ndarray, size: int = WINDOW) -> np.ndarray:
    """The sum of every size x size window of images (N, H, W), flattened: (N, (H - size + 1) * (W - size + 1))."""
    c = np.pad(np.cumsum(np.cumsum(images, -2), -1), ((0, 0), (1, 0), (1, 0)))
    sums = c[:, size:, size:] - c[:, :-size, size:] - c[:, size:, :-size] + c[:, :-size, :-size]
    return sums.reshape(len(images), -1)


def changes(base: np.ndarray, minus: np.ndarray, plus: np.ndarray) -> dict[str, float]:
    """What going from the drawing `minus` to `plus` does (the module's effects), averaged over examples
    (N, H, W each; `base` is the unperturbed drawing). Also `change`, sum |plus - minus| over the base's
    ink; where the most-changed window lies (`local_x`, `local_y`: px from the base's centre of mass); and
    what happens in it (`local_ink`: the signed change's sum over that of |change|, + adds ink)."""
    before, after, ref = moments(minus), moments(plus), moments(base)
    out = {k: np.log(np.maximum(after[k], EPS) / np.maximum(before[k], EPS)) for k in LOG_RATIOS}
    out.update({k: after[k] - before[k] for k in SIGNED if k not in LOG_RATIOS})
    delta = plus - minus
    magnitude = windows(np.abs(delta))
    n, best = np.arange(len(delta)), magnitude.argmax(1)
    share = magnitude[n, best] / np.maximum(np.abs(delta).sum((-2, -1)), EPS)
    ink_share = windows(base).max(1) / ref["ink"]
    out["local"] = (share - ink_share) / np.maximum(1 - ink_share, EPS)
    out["change"] = np.abs(delta).sum((-2, -1)) / ref["ink"]
    row, col = np.divmod(best, delta.shape[-1] - WINDOW + 1)
    out["local_x"], out["local_y"] = col + (WINDOW - 1) / 2 - ref["x"], row + (WINDOW - 1) / 2 - ref["y"]
    out["local_ink"] = windows(delta)[n, best] / np.maximum(magnitude[n, best], EPS)
    return {k: float(v.mean()) for k, v in out.items()}


# --- a model's capsules, perturbed and drawn ---------------------------------------------------------
def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def read_right(
    capsnet: ort.InferenceSession, images: np.ndarray, labels: np.ndarray, per_class: int, batch_size: int = 250
) -> list[np.ndarray]:
    """The class capsules v_j (n_j, D) of the first per_class examples of each class j that the model reads
    right, in file order. images: (N, S, S) uint8; labels: (N, objects), an image read right when its
    `objects` longest capsules are its labels (section 6's metric; the argmax for one object). An image
    of several objects gives an example to each of its classes, its capsule of that class."""
    classes, dim = {o.name: o.shape for o in capsnet.get_outputs()}[contract.CAPSULES][1:]
    found: list[list[np.ndarray]] = [[] for _ in range(classes)]
    for start in range(0, len(images), batch_size):
        if min(len(f) for f in found) >= per_class:
            break
        x = images[start : start + batch_size, None].astype(np.float32) / 255
        lengths, capsules = capsnet.run([contract.LENGTHS, contract.CAPSULES], {contract.IMAGE: x})
        y = labels[start : start + batch_size]
        longest = np.sort(np.argsort(-lengths, 1)[:, : y.shape[1]], 1)
        for i in np.flatnonzero((longest == np.sort(y, 1)).all(1)):
            for j in y[i]:
                found[j].append(capsules[i, j])
    return [np.array(f[:per_class], np.float32).reshape(-1, dim) for f in found]


def class_changes(decoder: ort.InferenceSession, capsules: np.ndarray, j: int, dims: list[int]) -> list[dict]:
    """`changes` for each dimension d of dims: the decoder's drawings of v_j (capsules (n, D) of class j)
    with v_j[d] - PERTURB_LIMIT and + PERTURB_LIMIT, the other class capsules zeroed (section 4.1)."""
    (n, dim), classes = capsules.shape, decoder.get_inputs()[0].shape[1]
    batch = np.zeros((1 + 2 * len(dims), n, classes, dim), np.float32)  # the drawing, then -/+ of each dim
    batch[:, :, j] = capsules
    for k, d in enumerate(dims):
        batch[1 + 2 * k, :, j, d] -= contract.PERTURB_LIMIT
        batch[2 + 2 * k, :, j, d] += contract.PERTURB_LIMIT
    (drawings,) = decoder.run(None, {contract.CAPSULES: batch.reshape(-1, classes, dim)})
    drawings = drawings.reshape(len(batch), n, *drawings.shape[1:]).astype(np.float64)
    return [changes(drawings[0], drawings[1 + 2 * k], drawings[2 + 2 * k]) for k in range(len(dims))]


# --- from measures to labels -------------------------------------------------------------------------
def norms(measured: list[dict]) -> dict[str, Norm]:
    """Each effect's centre and spread over all the model's class dimensions: 0 and the RMS for a signed
    effect (0 is no change, and either sign is as much of one), the mean and standard deviation for
    locality (never 0: some window always holds more of a change than of the ink)."""
    values = {k: np.array([m[k] for m in measured]) for k in EFFECTS}
    out = {k: (0.0, np.sqrt((values[k] ** 2).mean())) for k in SIGNED}
    out["local"] = (values["local"].mean(), values["local"].std())
    return {k: Norm(centre=float(centre), spread=max(float(spread), EPS)) for k, (centre, spread) in out.items()}


def scores(measures: dict[str, float], norm: dict[str, Norm]) -> dict[str, float]:
    """(measure - centre) / spread of each effect; locality only where it is above the model's mean (a
    change more spread out than usual is no effect of its own)."""
    z = {k: (measures[k] - norm[k].centre) / norm[k].spread for k in EFFECTS}
    return {**z, "local": max(z["local"], 0.0)}


def part(x: float, y: float) -> str:
    """Where a region lies from the ink's centre (x, y px, y down): "top left", ..., or "middle" within
    half a window."""
    half = WINDOW / 2
    vertical = "top" if y < -half else "bottom" if y > half else ""
    horizontal = "left" if x < -half else "right" if x > half else ""
    return f"{vertical} {horizontal}".strip() or "middle"


def label_of(effect: str, measures: dict[str, float], kind: str) -> str:
    """A short label of what + does: the effect's LABELS by sign (the ink's by preprocessing kind), or for
    a local change what it does in its region (adds ink, removes ink or, about as much of both,
    reshapes) and where."""
    if effect != "local":
        plus, minus = INK_LABELS.get(kind, LABELS["ink"]) if effect == "ink" else LABELS[effect]
        return plus if measures[effect] > 0 else minus
    ink = measures["local_ink"]
    verb = "adds ink" if ink > 1 / 3 else "removes ink" if ink < -1 / 3 else "reshapes"
    return f"local: {verb} {part(measures['local_x'], measures['local_y'])}"


def dominant(
    dim: int, measures: dict[str, float], norm: dict[str, Norm], quiet_below: float, kind: str
) -> DimensionEffect:
    """The dimension's dominant effect (largest |score|), its label (label_of) and its share of the
    squared scores; labelled QUIET_LABEL when the whole drawing changes less than quiet_below."""
    z = scores(measures, norm)
    effect = max(EFFECTS, key=lambda k: abs(z[k]))
    share = z[effect] ** 2 / max(sum(v**2 for v in z.values()), EPS)
    label = QUIET_LABEL if measures["change"] < quiet_below else label_of(effect, measures, kind)
    return DimensionEffect(dim=dim, label=label, effect=effect, share=round(share, 3), measures=measures)


def distinct(entries: list[DimensionEffect], norm: dict[str, Norm], kind: str) -> list[DimensionEffect]:
    """One class's dimensions (dominant's), each label that several of them share followed by that dimension's
    next largest effect, and by the one after where they still share it (at most QUALIFIERS), each only when
    its |score| is at least QUALIFIER_SCORE: "taller, thicker stroke" and "taller, slants left". Dimensions
    that differ by traces alone keep their shared label. A local effect named after another loses "local: "."""
    labels = {e.dim: e.label for e in entries}  # label_of's words hold no ", ": a qualified label is never a plain one
    qualifiers = dict.fromkeys(labels, 0)
    for depth in range(QUALIFIERS):
        shared = Counter(labels.values())
        for e in entries:
            if e.label == QUIET_LABEL or shared[labels[e.dim]] < 2 or qualifiers[e.dim] < depth:
                continue
            z = scores(e.measures, norm)
            after = sorted((k for k in EFFECTS if k != e.effect), key=lambda k: -abs(z[k]))[depth]
            if abs(z[after]) >= QUALIFIER_SCORE:
                labels[e.dim] += f", {label_of(after, e.measures, kind).removeprefix('local: ')}"
                qualifiers[e.dim] += 1
    return [e.model_copy(update={"label": labels[e.dim]}) for e in entries]


def labelled(dims: Dimensions, kind: str) -> Dimensions:
    """A section with every label given again from its own measures, norms and quiet_below (dominant, distinct),
    and the METHOD that says how."""

    def labels(entries: list[DimensionEffect]) -> list[DimensionEffect]:
        plain = [dominant(e.dim, e.measures, dims.norms, dims.quiet_below, kind) for e in entries]
        return distinct(plain, dims.norms, kind)

    classes = {c: labels(entries) for c, entries in dims.classes.items()}
    return dims.model_copy(update={"method": METHOD, "classes": classes})


def describe(
    capsnet_path: Path,
    decoder_path: Path,
    images: np.ndarray,
    labels: np.ndarray,
    classes: list[str],
    kind: str,
    examples: str,
    per_class: int = EXAMPLES,
) -> dict:
    """The card's dimensions section (model/card.py Dimensions) of a model's two graphs.

    Args:
        images: (N, S, S) uint8 test examples in the model's input size; labels: (N, objects) their classes.
        classes: the class names (the serving section's), in capsule order.
        kind: the model's preprocessing kind (contract.PREPROCESSING; label_of).
        examples: what images are, in words (the section's `examples`).
    """
    capsnet, decoder = session(capsnet_path), session(decoder_path)
    capsules = read_right(capsnet, images, labels, per_class)
    dims = list(range(capsules[0].shape[1]))
    measured = [class_changes(decoder, v, j, dims) if len(v) else [] for j, v in enumerate(capsules)]
    rounded = [[{k: round(v, 4) for k, v in m.items()} for m in ms] for ms in measured]
    every = [m for ms in rounded for m in ms]
    if not every:
        raise ValueError(f"{capsnet_path} reads none of the {len(images)} examples right: no dimension to measure")
    norm = norms(every)
    quiet_below = round(QUIET * float(np.median([m["change"] for m in every])), 4)
    section = Dimensions(
        method=METHOD,
        perturbation=(-contract.PERTURB_LIMIT, contract.PERTURB_LIMIT),
        examples=examples,
        examples_per_class={c: len(v) for c, v in zip(classes, capsules, strict=True)},
        window=WINDOW,
        norms=norm,
        quiet_below=quiet_below,
        classes={
            c: distinct([dominant(d, m, norm, quiet_below, kind) for d, m in enumerate(ms)], norm, kind)
            for c, ms in zip(classes, rounded, strict=True)
        },
    )
    return section.model_dump(mode="json")


# --- documents -----------------------------------------------------------------------------------------
def table(dims: Dimensions, shares: bool = False) -> str:
    """Dimensions (rows) x classes (columns), each cell the dimension's label (and its share); "—" for a
    class without examples."""
    columns = list(dims.classes.values())
    lines = ["| dim | " + " | ".join(dims.classes) + " |", "|---:|" + "---|" * len(columns)]
    for d in range(max(len(c) for c in columns)):
        cells = ["—" if d >= len(c) else f"{c[d].label} ({c[d].share:.2f})" if shares else c[d].label for c in columns]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def every_score(dims: Dimensions) -> list[tuple[DimensionEffect, dict[str, float]]]:
    """Every class dimension of a section with its scores."""
    return [(e, scores(e.measures, dims.norms)) for entries in dims.classes.values() for e in entries]


def typical(dims: Dimensions) -> str:
    """Each effect's spread (its norm) in its own units: what a typical dimension does from - to +."""
    size = {k: f"x{np.exp(dims.norms[k].spread):.2f}" for k in LOG_RATIOS}
    size.update(slant=f"{dims.norms['slant'].spread:.1f}°", x=f"{dims.norms['x'].spread:.1f} px")
    size.update(y=f"{dims.norms['y'].spread:.1f} px", local=f"±{dims.norms['local'].spread:.2f}")
    return ", ".join(f"{k} {size[k]}" for k in EFFECTS)


def summary(dims: Dimensions) -> str:
    """How many class dimensions each effect dominates, how clearly, and the effects' typical sizes."""
    scored = every_score(dims)
    counts = Counter(e.effect for e, _ in scored)
    quiet = sum(e.label == QUIET_LABEL for e, _ in scored)
    shares = np.array([e.share for e, _ in scored])
    return (
        f"Dominant effect of the {len(scored)} class dimensions: "
        + ", ".join(f"{k} {counts[k]}" for k in EFFECTS)
        + f" ({quiet} of them with {QUIET_LABEL}); its share: median {np.median(shares):.2f}, "
        f"{(shares >= 0.5).sum()} at 0.5 or more. A typical dimension's effect from -{contract.PERTURB_LIMIT} to "
        f"+{contract.PERTURB_LIMIT} (each effect's spread, its score of 1): {typical(dims)}. In their own units, "
        f"the ink, width and height change by a factor of 1.25 or more in {sizeable(scored, 'ink')}, "
        f"{sizeable(scored, 'width')} and {sizeable(scored, 'height')} dimensions, the slant by 10° or more in "
        f"{sizeable(scored, 'slant')}, and the centre moves 1 px or more in {sizeable(scored, 'x', 'y')}."
    )


def sizeable(scored: list[tuple[DimensionEffect, dict[str, float]]], *effects: str) -> int:
    """How many class dimensions change any of effects by SIZEABLE or more."""
    return sum(any(abs(e.measures[k]) >= SIZEABLE[k] for k in effects) for e, _ in scored)


def paper_check(dims: Dimensions) -> str:
    """The paper's Fig. 4 names against the measures: per name, the class dimensions whose dominant
    effect is one of its effects, and those where each of its effects is at least typical (|score| >= 1,
    as large as the model's RMS, or for locality a standard deviation above its mean)."""
    scored = every_score(dims)
    lines = [
        "| Fig. 4 | measured as | dominant | each at least typical |",
        "|---|---|---:|---:|",
    ]
    for name, effects in PAPER.items():
        dominated = sum(e.effect in effects for e, _ in scored)
        together = sum(all(abs(z[k]) >= 1 for k in effects) for _, z in scored)
        lines.append(f"| {name} | {', '.join(effects)} | {dominated} | {together} |")
    return "\n".join(lines)


def model_section(name: str, card: dict) -> str:
    dims = read_dimensions(card)
    if dims is None:
        return f"## {name}\n\nIts card has no `{contract.DIMENSIONS}` section.\n"
    return (
        f"## {name}\n\nExamples: {dims.examples} ({sum(dims.examples_per_class.values()):,} in all). "
        f"Label (share of the dominant effect's squared score):\n\n{table(dims, shares=True)}\n\n"
        f"{summary(dims)}\n\n{paper_check(dims)}\n"
    )


def document(cards: dict[str, dict]) -> str:
    """docs/dimensions.md: the method (the module's docstring), the labels, then each model's table,
    counts and Fig. 4 check."""
    method = __doc__.split("\n\n", 2)[2]  # the module's account of the method, without its usage lines
    signed = [" / ".join(v) for v in (*LABELS.values(), *INK_LABELS.values())]
    labels = (
        f"Here EXAMPLES = {EXAMPLES}, PERTURB_LIMIT = {contract.PERTURB_LIMIT} and WINDOW = {WINDOW} px. The labels: "
        f"{', '.join(signed)} (a garment's ink); `local: <adds ink | removes ink | reshapes> <part>` (the most-changed "
        f"window, seen from the ink's centre); `{QUIET_LABEL}` where the drawing changes less than {QUIET} of the "
        "model's median change; a label that dimensions of one class share, followed by each one's next largest "
        f"effect, and the one after while they still share it (at most {QUALIFIERS}, each with a score of at least "
        f"{QUALIFIER_SCORE}: `taller, thicker stroke`)."
    )
    return (
        f"# What each capsule dimension does\n\nGenerated by `{COMMAND}` from the shipped cards' "
        f"`{contract.DIMENSIONS}` sections (training/dimensions.py); do not edit.\n\n{method}\n{labels}\n\n"
        + "\n".join(model_section(name, card) for name, card in cards.items())
    )


def render(check: bool = False) -> int:
    """Write docs/dimensions.md from the shipped cards; check: only say whether it is stale (1) or not (0)."""
    cards = {name: json.loads((folder / contract.MODEL_CARD).read_text()) for name, folder in contract.SHIPPED.items()}
    doc = document(cards)
    if check:
        stale = DOC.read_text() != doc
        print(f"stale: {DOC}; run {COMMAND}" if stale else "up to date")
        return int(stale)
    DOC.write_text(doc)
    print(f"wrote {DOC}")
    return 0


def relabel() -> None:
    """Give every shipped card's labels again from its measures (labelled), the rest of each card as it is."""
    for folder in contract.SHIPPED.values():
        path = folder / contract.MODEL_CARD
        card = json.loads(path.read_text())
        dims = read_dimensions(card)
        if dims is not None:
            kind = card[contract.SERVING]["preprocessing"]["kind"]
            card[contract.DIMENSIONS] = labelled(dims, kind).model_dump(mode="json")
            path.write_text(json.dumps(card, indent=2) + "\n")
            print(f"relabelled {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    what = p.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="exit 1 if docs/dimensions.md is stale")
    what.add_argument("--relabel", action="store_true", help="give the shipped cards' labels again, then write the doc")
    args = p.parse_args(argv)
    if args.relabel:
        relabel()
    return render(args.check)


if __name__ == "__main__":
    sys.exit(main())
