"""Equivariance: which of a class capsule's 16 numbers follow rotation, scale, shear, shifts and stroke
thickness, and whether its length (the answer) holds, on a shipped graph (section 5.1, Fig. 4).

$ python -m benchmarks.equivariance                        # models/mnist, 500 test digits, 13 steps a sweep
$ python -m benchmarks.equivariance --model affine --n 200 --out benchmarks/results/equivariance_affine --figure ''

Section 5.1 perturbs one dimension of the correct digit capsule and watches the decoder's drawing change
(Fig. 4: scale and thickness, a localized part, stroke thickness, localized skew, width and translation).
This goes the other way: it transforms the input (app/imaging/transform.py, as POST /explain does) and
asks which dimensions of v_j, the true class's capsule, move with the transform. N test digits the model
reads right, spread evenly over the classes, are each swept once per transform of SWEEPS, STEPS values
read as one batch by ONNX Runtime (CPUExecutionProvider, the fp32 capsnet.onnx). Per digit, the Pearson r
of each of the 16 dimensions with the transform's value, averaged over the digits whose answer held at
every step (the others are counted, not correlated). A dimension means something only within its class
capsule (the decoder reads the masked v_j, section 4.1), so each class's top dimension is reported too.
Also the share of answers that held, at each step and throughout, and the true class's length along the
sweep (mean and minimum: section 3's presence should not move). A correlation over a sweep, not a causal
probe. Writes benchmarks/results/equivariance.json and .md and the figure docs/explain/equivariance.png.
Not a test.
"""

import argparse
import json
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnxruntime as ort

from app.imaging.transform import TRANSFORMS, TransformName, sweep
from model import contract
from tests.harness import machine

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
FIGURE = REPO / "docs" / "explain" / "equivariance.png"
# -----------------------------------------------------------------------------------------------
SWEEPS: dict[TransformName, tuple[float, float]] = {  # start, stop: TRANSFORMS' defaults or narrower
    "rotate": (-30.0, 30.0),
    "scale": (0.8, 1.2),
    "shear": (-30.0, 30.0),
    "shift_x": (-4.0, 4.0),
    "shift_y": (-4.0, 4.0),
    "thickness": (-0.5, 1.5),  # lopsided: erosion removes thin strokes, dilation only widens them
}
PER_CLASS = ("rotate", "scale")  # the transforms the figure shows per class capsule
STEPS = 13  # values per sweep: the identity is one of them in every range above
N_DIGITS = 500
SEED = 0
TOP = 3  # dimensions listed per transform
# -----------------------------------------------------------------------------------------------


class Sweep(NamedTuple):
    """One digit under one transform's values: every class's length and the true class's capsule v_j."""

    lengths: np.ndarray  # (steps, NUM_CLASSES)
    capsule: np.ndarray  # (steps, CAPSULE_DIM)


def r4(x) -> list | float:
    """Numbers for the JSON: rounded to 4 places, numpy made plain."""
    return np.round(np.asarray(x, np.float64), 4).tolist()


def test_digits(model_dir: Path, data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """The MNIST test set as the model reads it, centred on its input size (cards.centred_test_images):
    (N, S, S) float32 in [0, 1], and the labels."""
    from training import cards, data

    card = json.loads((model_dir / contract.MODEL_CARD).read_text())
    images = cards.centred_test_images(card, data_dir)
    labels = data.read_idx(data.find_files(data_dir)["test_labels"]).astype(np.int64)
    return images.astype(np.float32) / 255.0, labels


def read(session: ort.InferenceSession, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lengths (N, 10) and capsules (N, 10, 16) of (N, S, S) inputs, one batch."""
    lengths, capsules = session.run([contract.LENGTHS, contract.CAPSULES], {contract.IMAGE: images[:, None]})
    return lengths, capsules


def choose(session: ort.InferenceSession, images: np.ndarray, labels: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Indices of n test digits the model reads right, drawn at random, as many of each class as n allows."""
    rng = np.random.default_rng(seed)
    chosen = []
    for digit, part in enumerate(np.array_split(np.arange(n), contract.NUM_CLASSES)):
        candidates = rng.permutation(np.flatnonzero(labels == digit))[: 2 * len(part)]  # room for misreads
        right = candidates[read(session, images[candidates])[0].argmax(1) == digit]
        chosen.append(right[: len(part)])
    return np.concatenate(chosen)


def run_sweep(session: ort.InferenceSession, image: np.ndarray, label: int, name: TransformName, values) -> Sweep:
    """One digit transformed by every value, read as one batch."""
    lengths, capsules = read(session, sweep(image, name, values))
    return Sweep(lengths, capsules[:, label])


def pearson(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Pearson r of each column of x (steps, D) with values (steps,); 0 for a column that does not move."""
    dx, dv = x - x.mean(0), values - values.mean()
    norm = np.sqrt((dx**2).sum(0) * (dv**2).sum())
    return np.divide(dx.T @ dv, norm, out=np.zeros(x.shape[1]), where=norm > 0)


def shares(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each column's share of x's straight-line change along values, slope**2 / sum(slope**2) (least
    squares): r says a dimension moves with the transform, this says how much of the capsule's move it is."""
    dx, dv = x - x.mean(0), values - values.mean()
    slope2 = (dx.T @ dv / (dv**2).sum()) ** 2
    return slope2 / slope2.sum() if slope2.sum() > 0 else slope2


def per_class(r: np.ndarray, share: np.ndarray, digit: int) -> dict:
    """One class capsule's dimensions over its held digits' r and shares (digits, 16): the mean r of each,
    and the top dimension, the one with the largest |mean r|."""
    mean_r = r.mean(0)
    top = int(np.abs(mean_r).argmax())
    return {
        "class": digit,
        "digits": len(r),
        "top_dim": top,
        "top_mean_r": r4(mean_r[top]),
        "top_share": r4(share[:, top].mean()),
        "mean_r": r4(mean_r),
    }


def summarise(sweeps: list[Sweep], labels: np.ndarray, values: np.ndarray) -> dict:
    """One transform over every digit: how often the answer held, the true length along the sweep, and
    the r of each dimension with the values over the digits whose answer held at every step."""
    right = np.stack([s.lengths.argmax(1) == label for s, label in zip(sweeps, labels, strict=True)])
    length = np.stack([s.lengths[:, label] for s, label in zip(sweeps, labels, strict=True)])
    held = right.all(1)
    capsules = [sweeps[i].capsule.astype(np.float64) for i in np.flatnonzero(held)]
    r = np.stack([pearson(x, values) for x in capsules])
    share = np.stack([shares(x, values) for x in capsules])
    kept = labels[held]
    classes = [per_class(r[kept == c], share[kept == c], c) for c in range(contract.NUM_CLASSES) if (kept == c).any()]
    top_in = np.bincount([c["top_dim"] for c in classes], minlength=contract.CAPSULE_DIM)
    mean_r, mean_abs_r, mean_share = r.mean(0), np.abs(r).mean(0), share.mean(0)
    return {
        "digits": len(sweeps),
        "held": int(held.sum()),
        "hold_rate": r4(held.mean()),
        "hold_by_step": r4(right.mean(0)),
        "length_mean": r4(length.mean()),
        "length_min": r4(length.min()),
        "length_mean_by_step": r4(length.mean(0)),
        "length_min_by_step": r4(length.min(0)),
        "mean_r": r4(mean_r),
        "mean_abs_r": r4(mean_abs_r),
        "mean_share": r4(mean_share),
        "top": [
            {
                "dim": int(d),
                "mean_r": r4(mean_r[d]),
                "mean_abs_r": r4(mean_abs_r[d]),
                "mean_share": r4(mean_share[d]),
                "top_in_classes": int(top_in[d]),
            }
            for d in np.argsort(-np.abs(mean_r))[:TOP]
        ],
        "classes": classes,
    }


def identity_gap(sweeps: list[Sweep], base: np.ndarray, values: np.ndarray, identity: float) -> float | None:
    """Largest |v_j at the sweep's identity step - v_j of the digit read untransformed| (base: (digits, 16)):
    near 0 when the steps line up with their values; None for a sweep without the identity."""
    at = np.flatnonzero(np.isclose(values, identity))
    if not at.size:
        return None
    return float(np.abs(np.stack([s.capsule[at[0]] for s in sweeps]) - base).max())


def measure(session: ort.InferenceSession, images: np.ndarray, labels: np.ndarray, steps: int) -> tuple[dict, dict]:
    """Every transform of SWEEPS over every digit (summarise's figures per transform), and the first
    digit's first sweep as the figure's example."""
    base = read(session, images)[1][np.arange(len(labels)), labels]
    transforms: dict[str, dict] = {}
    example: dict = {}
    for name, (start, stop) in SWEEPS.items():
        values = np.linspace(start, stop, steps)
        sweeps = [run_sweep(session, x, y, name, values) for x, y in zip(images, labels, strict=True)]
        transforms[name] = {
            "unit": TRANSFORMS[name].unit,
            "values": r4(values),
            "identity_gap": identity_gap(sweeps, base, values, TRANSFORMS[name].identity),
            **summarise(sweeps, labels, values),
        }
        example = example or {
            "transform": name,
            "label": int(labels[0]),
            "values": r4(values),
            "length": r4(sweeps[0].lengths[:, labels[0]]),
            "capsule": r4(sweeps[0].capsule),
            "r": r4(pearson(sweeps[0].capsule.astype(np.float64), values)),
        }
        t = transforms[name]
        print(
            f"{name}: held {t['held']}/{t['digits']}, top dims "
            + ", ".join(f"{d['dim']} ({d['mean_r']:+.2f})" for d in t["top"])
        )
    return transforms, example


def draw(result: dict, path: Path) -> None:
    """The figure: mean |r| per transform and dimension; mean r per class capsule for PER_CLASS; the
    example digit's 16 dimensions and its class length along its sweep."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    transforms, example = result["transforms"], result["example"]
    dims = np.arange(contract.CAPSULE_DIM)
    fig, axes = plt.subplots(2, 2, figsize=(14, 9.5))
    ax = axes[0, 0]
    mean_abs = np.array([t["mean_abs_r"] for t in transforms.values()])
    image = ax.imshow(mean_abs, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for (row, col), value in np.ndenumerate(mean_abs):
        ax.text(col, row, f"{value:.2f}"[1:], ha="center", va="center", fontsize=6.5, color="w" if value < 0.6 else "k")
    ax.set_yticks(range(len(transforms)), [f"{n} ({t['held']}/{t['digits']} held)" for n, t in transforms.items()])
    ax.set(xticks=dims, xlabel="dimension of the true class's capsule v_j", title="mean |r| over the held digits")
    fig.colorbar(image, ax=ax, label="mean |Pearson r| with the transform's value")
    for ax, name in zip((axes[0, 1], axes[1, 0]), PER_CLASS, strict=True):
        t = transforms[name]
        image = ax.imshow([c["mean_r"] for c in t["classes"]], cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        ax.scatter(
            [c["top_dim"] for c in t["classes"]], range(len(t["classes"])), marker="s", s=90, c="none", edgecolors="k"
        )
        ax.set_yticks(range(len(t["classes"])), [str(c["class"]) for c in t["classes"]])
        lo, hi = t["values"][0], t["values"][-1]
        ax.set(
            xticks=dims,
            xlabel="dimension",
            ylabel="class capsule",
            title=f"{name} {lo:g} to {hi:g} {t['unit']}: mean r per class (square: top)",
        )
        fig.colorbar(image, ax=ax, label="mean signed r")
    ax = axes[1, 1]
    values, capsule, r = np.array(example["values"]), np.array(example["capsule"]), np.array(example["r"])
    strongest = np.argsort(-np.abs(r))[:2]
    for d in dims:
        ax.plot(values, capsule[:, d], color="0.75", lw=0.8)
    for d in strongest:
        ax.plot(values, capsule[:, d], lw=2.2, label=f"dimension {d} (r = {r[d]:+.2f})")
    ax.set(
        xlabel=f"{example['transform']} ({transforms[example['transform']]['unit']})",
        ylabel="v_j's 16 numbers (grey: the rest)",
    )
    ax.set_title(f"one test digit (a {example['label']}): v_{example['label']} along the sweep")
    twin = ax.twinx()
    twin.plot(values, example["length"], "k--", lw=1.5, label="length ||v_j||")
    twin.set(ylim=(0, 1), ylabel="length ||v_j|| (dashed)")
    ax.legend(loc="lower left", fontsize=8)
    fig.suptitle(
        f"Which capsule dimensions follow the input's transform: {result['model']} model, "
        f"{result['digits']} MNIST test digits, Pearson r along {result['steps']}-step sweeps (section 5.1)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def markdown(result: dict) -> str:
    """The short report: per transform the hold rate, the true length and the top dimensions; per class
    capsule its top dimension."""
    head = (
        f"Equivariance of the {result['model']} model's class capsules ({result['graph']}, version "
        f"{result['version']}, {result['provider']}; {result['machine']}, {result['when']}): {result['digits']} "
        f"MNIST test digits read right ({', '.join(map(str, result['per_class']))} of the classes 0-9), each "
        f"swept by every transform in {result['steps']} steps, one batch a sweep. r: Pearson correlation of one "
        "dimension (0-15) of the true class's capsule v_j with the transform's value along one digit's sweep, "
        "averaged over the digits whose answer held at every step. Share of the move: the dimension's share of "
        "v_j's straight-line change along the sweep (slope squared over the sum of the 16), averaged likewise.\n\n"
        "| transform | range | answer held, every step | true length mean / min | top dimensions: mean r "
        "(top in how many classes; share of the move) |\n|---|---|---|---|---|\n"
    )
    rows = []
    for name, t in result["transforms"].items():
        top = ", ".join(
            f"{d['dim']}: {d['mean_r']:+.2f} ({d['top_in_classes']}; {100 * d['mean_share']:.0f}%)" for d in t["top"]
        )
        rows.append(
            f"| {name} | {t['values'][0]:g} to {t['values'][-1]:g} {t['unit']} | {100 * t['hold_rate']:.1f}% "
            f"({t['held']}/{t['digits']}) | {t['length_mean']:.3f} / {t['length_min']:.3f} | {top} |"
        )
    classes = "\n".join(
        f"| {name} | "
        + " | ".join(f"{c['top_dim']} ({c['top_mean_r']:+.2f}; {100 * c['top_share']:.0f}%)" for c in t["classes"])
        + " |"
        for name, t in result["transforms"].items()
    )
    digits = range(contract.NUM_CLASSES)
    return (
        head
        + "\n".join(rows)
        + "\n\nEach class capsule's top dimension (its mean r; share of the move):\n\n| transform | "
        + " | ".join(map(str, digits))
        + " |\n|---|"
        + "---|" * len(digits)
        + "\n"
        + classes
        + "\n"
    )


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.equivariance", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="mnist", choices=("mnist", "affine"), help="a shipped model of MNIST digits")
    p.add_argument("--data-dir", type=Path, default=Path("data/mnist"), help="MNIST's IDX files")
    p.add_argument("--n", type=int, default=N_DIGITS, help="test digits, spread evenly over the classes")
    p.add_argument("--steps", type=int, default=STEPS, help="values per sweep (odd: the identity is one)")
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--out", type=Path, default=RESULTS / "equivariance", help="writes OUT.json and OUT.md")
    p.add_argument("--figure", default=str(FIGURE), help="the PNG ('' for none)")
    args = p.parse_args(argv)
    if args.n < contract.NUM_CLASSES:
        p.error(f"--n must be at least {contract.NUM_CLASSES}, one digit per class")
    model_dir = contract.SHIPPED[args.model]
    session = ort.InferenceSession(str(model_dir / contract.CAPSNET_ONNX), providers=["CPUExecutionProvider"])
    images, labels = test_digits(model_dir, args.data_dir)
    chosen = choose(session, images, labels, args.n, args.seed)
    transforms, example = measure(session, images[chosen], labels[chosen], args.steps)
    result = {
        "model": args.model,
        "graph": f"models/{args.model}/{contract.CAPSNET_ONNX} (fp32)",
        "version": json.loads((model_dir / contract.MODEL_CARD).read_text())["version"],
        "provider": session.get_providers()[0],
        "onnxruntime": ort.__version__,
        "machine": machine(),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "seed": args.seed,
        "digits": len(chosen),
        "per_class": np.bincount(labels[chosen], minlength=contract.NUM_CLASSES).tolist(),
        "test_indices": chosen.tolist(),
        "steps": args.steps,
        "transforms": transforms,
        "example": {"test_index": int(chosen[0]), **example},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    if args.figure:
        draw(result, Path(args.figure))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
