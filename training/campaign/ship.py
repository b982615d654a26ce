"""Back on the CPU: export what a window trained, measure it on its ONNX graph, ship it only if better.

$ python -m training.campaign ship COLLECTED [COLLECTED ...]    # the folders of the collect calls, oldest first

For each run that can replace a shipped model (plan.Spec.ships) and whose weights came back, the
checkpoint is joined from its parts, exported to a scratch model folder of its own (graphs, parity, card:
training.export), and its held-out metric is measured on the exported graph beside the shipped
graph's, on the same images, in this process:
  mnist           MNIST test accuracy, and the robustness suite (benchmarks.robustness) kind by kind:
                  it ships only if no kind reads worse; its int8 graph is made as the shipped one was
  fashion-mnist   Fashion-MNIST test accuracy
  multimnist      both-labels-right accuracy on `pairs_per_digit` pairs per MNIST test digit
A candidate replaces models/<name> only when strictly better; of two runs that ship the same model, in the
plan's order, the second measures itself against what the first left there. Every run's window then goes into the
ledger (training/campaign/ledger.py), and docs/results.md is rendered again.
"""

import datetime
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from model import contract
from training import data
from training.campaign import ledger, plan
from training.campaign.collect import RESULTS
from training.cards import PAIR_SEED
from training.evaluate import evaluate_onnx, load_checkpoint
from training.experiments import multimnist
from training.experiments import results as results_doc
from training.export import export_checkpoint
from training.quantize import quantize_model


def gather(dirs: list[Path], scratch: Path) -> tuple[dict[str, dict], dict[str, Path]]:
    """The runs' results and their joined checkpoints from the collect folders (a later folder wins)."""
    results, weights = {}, {}
    for folder in dirs:
        if (folder / RESULTS).exists():
            with tarfile.open(folder / RESULTS) as tar:
                tar.extractall(scratch / "results", filter="data")
        for first in sorted(folder.glob("*.pt.00")):
            joined = scratch / "weights" / first.name.removesuffix(".00")
            joined.parent.mkdir(parents=True, exist_ok=True)
            parts = sorted(folder.glob(first.name.removesuffix("00") + "[0-9][0-9]"))
            joined.write_bytes(b"".join(p.read_bytes() for p in parts))
            weights[joined.stem] = joined
    for path in sorted((scratch / "results").glob("*/result.json")):
        results[path.parent.name] = json.loads(path.read_text())
    return results, weights


def accuracy(graph: Path, images: np.ndarray, labels: np.ndarray) -> float:
    return evaluate_onnx(graph, images, labels)["accuracy"]


def robustness_suite(model_dir: Path, n: int | None, mnist_dir: Path, out: Path) -> dict[str, float | None]:
    """Each kind's accuracy of the robustness suite on a model folder (`python -m benchmarks.robustness`,
    n images a kind, None: the suite's own number), made from mnist_dir's test digits. A command, not an
    import: benchmarks/ imports training/, never the other way."""
    sizes = [] if n is None else ["--n", str(n)]
    command = [sys.executable, "-m", "benchmarks.robustness", "--model-dir", str(model_dir), *sizes]
    subprocess.run([*command, "--mnist-dir", str(mnist_dir), "--out", str(out)], check=True)
    return {kind: r["accuracy"] for kind, r in json.loads(out.read_text())["kinds"].items()}


def compare(
    spec: plan.Spec,
    checkpoint: Path,
    shipped: Path,
    candidate: Path,
    data_dirs: dict[str, Path],
    pairs_per_digit: int,
    robustness_n: int | None,
) -> dict:
    """Export the checkpoint to `candidate` and measure it beside `shipped`: the decision, with its figures."""
    if spec.ships == "multimnist":
        test = data.load(data_dirs["mnist"])["test"]
        model, ckpt = load_checkpoint(checkpoint)
        multimnist.export_shipped(model, ckpt, test, candidate, pairs_per_digit, PAIR_SEED)
        ours, theirs = (
            multimnist.evaluate_onnx(d / contract.CAPSNET_ONNX, test, pairs_per_digit, PAIR_SEED)["accuracy"]
            for d in (candidate, shipped)
        )
        metric = f"both labels right on {pairs_per_digit * len(test):,} test pairs"
    else:
        dataset = "mnist" if spec.ships == "mnist" else "fashion-mnist"
        export_checkpoint(checkpoint, candidate, data_dirs[dataset])
        test = data.load(data_dirs[dataset])["test"]
        images, labels = test.images.numpy(), test.labels.numpy()
        ours, theirs = (accuracy(d / contract.CAPSNET_ONNX, images, labels) for d in (candidate, shipped))
        metric = f"{dataset} test accuracy ({len(labels):,} images)"
    decision = {"metric": metric, "candidate": round(100 * ours, 3), "shipped": round(100 * theirs, 3)}
    better = ours > theirs
    if spec.ships == "mnist":
        kinds = {
            name: robustness_suite(folder, robustness_n, data_dirs["mnist"], candidate.parent / f"{name}.json")
            for name, folder in (("candidate", candidate), ("shipped", shipped))
        }
        fell = [k for k in kinds["candidate"] if (kinds["candidate"][k] or 0) < (kinds["shipped"][k] or 0)]
        decision["robustness_fell"] = fell
        better = better and not fell
        if better:
            quantize_model(candidate, data_dirs["mnist"])
    decision["replaced"] = better
    return decision


def ship(
    dirs: list[Path],
    models_root: Path,
    data_dirs: dict[str, Path],
    ledger_path: Path = ledger.LEDGER,
    pairs_per_digit: int = 1,
    robustness_n: int | None = None,
    render: bool = True,
    log=print,
) -> dict[str, dict]:
    """Ship what is better, record every run in the ledger; returns the decisions by run."""
    window = datetime.date.today().isoformat()
    decisions: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        results, weights = gather(dirs, scratch)
        for spec in plan.PLAN:
            if spec.ships is None or spec.name not in weights:
                continue
            candidate = scratch / "candidates" / spec.name / spec.ships
            shipped = models_root / spec.ships
            decision = compare(spec, weights[spec.name], shipped, candidate, data_dirs, pairs_per_digit, robustness_n)
            if decision["replaced"]:
                shutil.rmtree(shipped)
                shutil.copytree(candidate, shipped)
            decisions[spec.name] = decision
            verdict = "shipped" if decision["replaced"] else "not shipped"
            log(f"{spec.name}: {decision['metric']}: {decision['candidate']}% vs {decision['shipped']}%: {verdict}")
        book = ledger.read(ledger_path)
        for name, result in results.items():
            if result.get("smoke") and ledger_path == ledger.LEDGER:
                continue  # a preflight's runs are not training
            ledger.record(book, result, window, decisions.get(name))
        ledger.write(book, ledger_path)
    if render:
        results_doc.main([])
    return decisions
