"""One run of the plan, on the machine that trains it: its task, its model, fit(), its test, its result.

$ python -m training.campaign.runs multimnist --pack PACK --work WORK --deadline 1764000000

The supervisor starts one such process per run. Each reads only the pack (data, starting weights,
the font bank) and writes only WORK/<name>/: fit's checkpoints and curves, log lines on stdout, and
result.json, what the run did (time, images, its starting point, its learning rate) and its test
figures, measured here in PyTorch (fp32) so that nothing heavier than the weights has to come back.
The run's deadline is the supervisor's; fit gets it less the time its test takes (TEST_RESERVE).

Kinds:
  digits     a CapsNet on shifted MNIST or Fashion-MNIST (training.train.ShiftedDigits): the paper's
             recipe, Fashion with flips, EM routing
  flagship   the served MNIST model, continued on MNIST, font digits and coarse scans
             (training.finetune.FontMix with the pack's font bank; TrainConfig.low_res)
  pairs      MultiMNIST's CapsNet (section 6: training.experiments.multimnist.PairTask)
  pairs-cnn  the paper's MultiMNIST CNN baseline (training.baselines.PairCNN) on the same pairs
  affine     section 5.2: a CapsNet or a CNN on translated 40x40 digits, stopped at stop_at, tested on
             expanded MNIST and the affNIST-like set (training.experiments.affine)
"""

import argparse
import datetime
import json
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from model import contract
from model.capsnet import CapsNet, CapsNetConfig
from training import data, pairs
from training.baselines import PairCNN, PaperCNN, num_params
from training.campaign import plan
from training.config import TrainConfig, augment
from training.evaluate import evaluate
from training.experiments import affine, multimnist
from training.finetune import FineTuneConfig, FontMix
from training.fit import Batch, Run, StepOut, fit, hardware
from training.train import ShiftedDigits, load_splits

KINDS = ("digits", "flagship", "pairs", "pairs-cnn", "affine")
TEST_RESERVE = {"pairs": 150.0, "pairs-cnn": 90.0, "affine": 45.0}  # s kept for the test; 30 for the others
TEST_PAIRS = 100  # pairs per MNIST test digit on the GPU: 1,000,000 pairs (the paper's 1,000: 10M)
AFFINE_TEST_SEED = 2017  # training.experiments.affine's default: the shipped card's test sets
FONT_BANK = "fonts.npz"  # the pack's rendered font digits: images (N, 28, 28) uint8, labels (N,)


def locate(pack: Path, item: str) -> Path | None:
    """Where an item of the pack (e.g. "data/mnist", "start/mnist.pt") is: in whichever load holds it."""
    return next((load / item for load in sorted(pack.glob("load-*")) if (load / item).exists()), None)


def items(spec: plan.Spec) -> list[str]:
    """What a run reads from the pack: its data, its starting weights, the font bank."""
    start = [f"start/{spec.start}.pt"] if spec.start else []
    return [f"data/{spec.dataset}", *start, *([FONT_BANK] if spec.kind == "flagship" else [])]


def need(pack: Path, item: str) -> Path:
    if (path := locate(pack, item)) is None:
        raise FileNotFoundError(f"{item} is in no load of {pack} (training.campaign.pack)")
    return path


class PairCNNTask(multimnist.PairTask):
    """PairTask's pairs for the section-6 CNN: sigmoid cross entropy on the two classes present."""

    def loss(self, model: nn.Module, batch: Batch) -> StepOut:
        logits = model(batch.x)
        return StepOut(PairCNN.pair_loss(logits, batch.y), pairs.both_right(logits, batch.y))

    def validate(self, model: nn.Module) -> dict | None:
        if len(self.val) == 0:
            return None
        return {"acc": 1 - pair_error(model, self.val, 1, self.seed + 1, self.max_shift) / 100}


@torch.no_grad()
def pair_error(model: nn.Module, split: data.Split, per_digit: int, seed: int, max_shift: int) -> float:
    """% of a split's fixed pairs (pairs.iter_pairs, each digit moved up to max_shift px) whose two largest
    scores are not the two digits."""
    was_training = model.training
    model.eval()
    right = [
        pairs.both_right(affine.logits(model, b.images), b.labels).cpu()
        for b in pairs.iter_pairs(split, per_digit, seed, 500, max_shift)
    ]
    model.train(was_training)
    return 100 * (1 - torch.cat(right).float().mean().item())


def starting_weights(spec: plan.Spec, pack: Path) -> dict | None:
    """The packed checkpoint the run starts from (training.compact's keys and `source`), or None."""
    if spec.start is None:
        return None
    return torch.load(need(pack, f"start/{spec.start}.pt"), map_location="cpu", weights_only=True)


def configs(spec: plan.Spec, pack: Path, work: Path, deadline: float, device: str, smoke: bool):
    """The run's TrainConfig (the spec's settings, the pack's data, its deadline less its test's) and
    the CapsNetConfig of its model: the spec's, or the starting checkpoint's with the spec's loss settings
    (plan.LOSS_SETTINGS; its architecture is the checkpoint's)."""
    settings = {**spec.train, **(plan.SMOKE_TRAIN if smoke else {})}
    if smoke:
        settings["epochs"] = 2
    config = TrainConfig(
        dataset=spec.dataset,
        data_dir=str(need(pack, f"data/{spec.dataset}")),
        device=device,
        compile=device.startswith("cuda"),
        out=str(work / spec.name),
        init=str(need(pack, f"start/{spec.start}.pt")) if spec.start else "",
        deadline=max(0.0, deadline - TEST_RESERVE.get(spec.kind, 30.0)),
        **settings,
    )
    start = starting_weights(spec, pack)
    size = {"pairs": contract.MULTIMNIST_SIZE, "affine": contract.AFFINE_SIZE}.get(spec.kind, contract.IMAGE_SIZE)
    model_config = (
        CapsNetConfig(**{**start["config"], **spec.capsnet})
        if start
        else CapsNetConfig(image_size=size, **spec.capsnet)
    )
    return config, model_config


def build(spec: plan.Spec, model_config: CapsNetConfig) -> nn.Module:
    if spec.kind == "pairs-cnn":
        return PairCNN(contract.MULTIMNIST_SIZE)
    if spec.kind == "affine" and spec.model == "paper-cnn":
        return PaperCNN(contract.AFFINE_SIZE)
    if spec.kind == "affine" and spec.model == "pooled-cnn":
        return affine.BaselineCNN(contract.AFFINE_SIZE)
    return CapsNet(model_config)


def font_bank(pack: Path, device: str) -> tuple[data.Split, data.Split]:
    """The pack's font digits: the training bank and the held-out renders (FONT_BANK's `val_` arrays)."""
    with np.load(need(pack, FONT_BANK)) as f:
        return (
            data.Split(torch.from_numpy(f["images"]), torch.from_numpy(f["labels"]).long()).to(device),
            data.Split(torch.from_numpy(f["val_images"]), torch.from_numpy(f["val_labels"]).long()).to(device),
        )


def train_and_test(
    spec: plan.Spec, config: TrainConfig, model: nn.Module, pack: Path, smoke: bool, log
) -> tuple[Run, dict]:
    """fit() on the spec's task, then its test figures (percentages) on the kept weights."""
    splits = load_splits(config)
    test = splits["test"]
    if smoke:
        test = data.Split(test.images[: plan.SMOKE_TEST], test.labels[: plan.SMOKE_TEST])
    if spec.kind == "digits":
        assert isinstance(model, CapsNet)  # build() makes CapsNets of this kind
        task = ShiftedDigits(splits, config.max_shift, config.eval_batch_size, augment(config))
        run = fit(model, task, config, log)
        return run, {"test_accuracy": 100 * evaluate(model, test, config.eval_batch_size)["accuracy"]}
    if spec.kind == "flagship":
        assert isinstance(model, CapsNet)
        bank, font_val = font_bank(pack, config.device)
        tune = FineTuneConfig(
            font_share=0.2 if len(bank) else 0.0,
            augment_mnist=0.5,
            epoch_images=config.batch_size * (8 if smoke else 400),
        )
        run = fit(model, FontMix.of(splits, bank, font_val, tune, config), config, log)
        figures = {"test_accuracy": 100 * evaluate(model, test, config.eval_batch_size)["accuracy"]}
        if len(font_val):
            figures["fonts_val_accuracy"] = 100 * evaluate(model, font_val, config.eval_batch_size)["accuracy"]
        return run, figures
    if spec.kind in ("pairs", "pairs-cnn"):
        task_class = multimnist.PairTask if spec.kind == "pairs" else PairCNNTask
        run = fit(model, task_class(splits, config.seed, config.scale, config.pair_shift), config, log)
        per_digit = 1 if smoke else TEST_PAIRS
        error = pair_error(model, test, per_digit, config.seed + 2, config.pair_shift)
        # the same on as many training digits, each paired once, unscaled as the test's: an error near the
        # test's says the model underfits (more training is the lever), one well below it that it overfits
        seen = data.Split(splits["train"].images[: len(test)], splits["train"].labels[: len(test)])
        train_error = pair_error(model, seen, 1, config.seed + 3, config.pair_shift)
        return run, {"test_error": error, "test_pairs": per_digit * len(test), "train_error": train_error}
    if spec.kind == "affine":
        run = fit(model, affine.TranslatedDigits(splits, config.seed), config, log)
        tests = affine.test_sets(test, AFFINE_TEST_SEED)
        return run, {f"{k} accuracy": affine.accuracy(model, x, test.labels) for k, x in tests.items()}
    raise ValueError(f"unknown kind {spec.kind!r}; the kinds are {', '.join(KINDS)}")


def run_one(spec: plan.Spec, pack: Path, work: Path, deadline: float, device: str, smoke: bool, log=print) -> dict:
    """Train and test one run; writes and returns WORK/<name>/result.json."""
    began = time.time()
    config, model_config = configs(spec, pack, work, deadline, device, smoke)
    torch.manual_seed(config.seed)
    model = build(spec, model_config)
    start = starting_weights(spec, pack)
    source = start.get("source") if start else None
    log(
        f"{spec.name}: {type(model).__name__} {num_params(model):,} parameters on {hardware(device)}, "
        f"{'from ' + source['model'] + ' ' + source['version'] if source else 'from seed ' + str(config.seed)}, "
        f"lr {config.lr:g} x{config.lr_decay:g} per epoch, until {datetime.datetime.fromtimestamp(deadline):%H:%M:%S}"
    )
    run, figures = train_and_test(spec, config, model, pack, smoke, log)
    best_val = max((h["val_acc"] for h in run.history if "val_acc" in h), default=None)
    result = {
        "name": spec.name,
        "spec": spec.record(),
        "hardware": run.hardware,
        "precision": run.precision,
        "started_from": source,
        "lr": config.lr,
        "lr_decay": config.lr_decay,
        "parameters": num_params(model),
        "epochs_run": run.epochs_run,
        "kept_epoch": run.kept_epoch,
        "images_seen": run.epochs_run * run.images_per_epoch,
        "images_per_s": round(run.epochs_run * run.images_per_epoch / max(run.train_seconds, 1e-9)),
        "train_seconds": round(run.train_seconds, 1),
        "wall_seconds": round(time.time() - began, 1),
        "best_val_accuracy": None if best_val is None else 100 * best_val,
        "stopped_at_target": bool(config.stop_at and best_val is not None and best_val >= config.stop_at),
        "test": {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()},
        "smoke": smoke,
        "finished": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    (work / spec.name / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    log("result " + json.dumps(result["test"]))
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.campaign.runs", description=__doc__.splitlines()[0])
    p.add_argument("name", help="a run of training/campaign/plan.py")
    p.add_argument("--pack", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--deadline", type=float, required=True, help="Unix time by which the run has ended")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--smoke", action="store_true", help="the preflight's sizes (plan.SMOKE_TRAIN)")
    args = p.parse_args(argv)
    (spec,) = plan.by_name([args.name])
    run_one(spec, args.pack, args.work, args.deadline, args.device, args.smoke, partial(print, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
