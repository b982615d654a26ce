"""Fine-tune a shipped MNIST CapsNet on typeset and outlined digits: its own weights, MNIST with
augmentations, and digits of training-only fonts.

$ nice -n 15 python -m training.finetune --precision fp32 --time-limit 3600   # models/mnist/ -> runs/finetune
$ python -m training.finetune --resume                                         # the same run, continued
$ python -m training.finetune --export /tmp/mnist-ft                           # its kept epoch -> a model folder

Starts from a model folder's graph (training.graphs.model_from_graphs: its weights, its card's
CapsNetConfig) and trains it with fit() like every run: Adam at a fine-tune's rate, decayed per step,
resumable checkpoints and the kept epoch chosen on MNIST's 5,000-image validation split. Each batch
holds font_share digits of a bank rendered once from training/fonts.py (fonts the robustness suite
does not use) and MNIST training digits for the rest. The font digits, and an augment_mnist share of
the MNIST ones, go through training.data.Augment (rotation, scale, shear, stroke jitter, elastic); the
rest of MNIST stays as the shipped model learnt it, so that it keeps its accuracy there. Every image
then gets the paper's ±2 px shift.

An epoch here is epoch_images draws, the MNIST digits and the bank's picked at random (with
replacement) by fit's augment generator, so that a run on a shared CPU, a fraction of a pass over
MNIST, still validates and checkpoints every few minutes. The log adds the accuracy on held-out
renders of the training fonts (another seed: val_fonts_acc) beside MNIST's.

--mixes 0.25,0.5,0.75,1 measures blends of the starting weights θ0 and the kept epoch's θ1 on the
validation splits, θ = (1 - α)·θ0 + α·θ1 (weight-space ensembling, WiSE-FT: Wortsman et al. 2022,
"Robust fine-tuning of zero-shot models", eq. 1): fine-tuning moves the weights within one basin, so a
blend keeps what the starting weights read well (MNIST) and most of what the fine-tune added (fonts).

--export writes the kept epoch (or its blend, --mix α) as a model folder (training.export.
export_checkpoint: the graphs, parity and the card measured on the exported graph) with a `fine_tune`
section in its card, and its int8 graph (training.quantize).

$ python -m training.finetune --mixes 0.25,0.5,0.75,1                   # choose α on validation
$ python -m training.finetune --mix 0.5 --export /tmp/mnist-ft           # export that blend
"""

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import torch
import torch.nn as nn

from model import contract
from model.capsnet import CapsNet
from training import cli, data, fonts
from training.compact import compact
from training.config import PRECISIONS, TrainConfig, augment
from training.evaluate import evaluate, load_checkpoint
from training.export import export_checkpoint
from training.fit import Batch, Run, StepOut, Task, fit, hardware
from training.graphs import model_from_graphs, sha256
from training.quantize import quantize_model
from training.train import load_splits

SETTINGS = "finetune.json"  # OUT/finetune.json: what the run adds to its TrainConfig


@dataclass
class FineTuneConfig:
    """The fine-tune's own settings (the rest is its TrainConfig); OUT/finetune.json, the card's `fine_tune`."""

    model_dir: str = str(contract.SHIPPED["mnist"])  # the model folder whose weights the run starts from
    font_share: float = 0.2  # fraction of every batch that is font digits
    augment_mnist: float = 0.25  # fraction of the batch's MNIST digits that are augmented too (fonts always are)
    font_images: int = 6000  # renders in the bank (every font's ten digits, in turn)
    font_val_images: int = 1000  # held-out renders, for the log's val_fonts_acc
    epoch_images: int = 12800  # draws per epoch (100 batches of 128: ~15 min on a shared 2-core CPU)

    def __post_init__(self):
        if not 0 <= self.font_share < 1:
            raise ValueError(f"font_share must be in [0, 1), got {self.font_share}")
        if not 0 <= self.augment_mnist <= 1:
            raise ValueError(f"augment_mnist must be in [0, 1], got {self.augment_mnist}")
        if min(self.font_images, self.font_val_images, self.epoch_images) < 1:
            raise ValueError("font_images, font_val_images and epoch_images must be at least 1")


class FontMix(Task):
    """MNIST training digits and font digits in every batch, the fonts and augment_mnist of MNIST augmented;
    validated on MNIST's split."""

    def __init__(
        self,
        splits: dict[str, data.Split],
        font_bank: data.Split,
        font_val: data.Split,
        font_share: float,
        augment_mnist: float,
        epoch_images: int,
        max_shift: int,
        augment: data.Augment,
        eval_batch_size: int = 500,
    ):
        self.train, self.val, self.fonts, self.font_val = splits["train"], splits["val"], font_bank, font_val
        self.train_size, self.font_share, self.max_shift = epoch_images, font_share, max_shift
        self.augment_mnist = augment_mnist
        self.augment, self.eval_batch_size = augment, eval_batch_size

    @classmethod
    def of(
        cls,
        splits: dict[str, data.Split],
        bank: data.Split,
        font_val: data.Split,
        tune: "FineTuneConfig",
        config: TrainConfig,
    ) -> "FontMix":
        """The mix that tune and config describe."""
        return cls(
            splits,
            bank,
            font_val,
            tune.font_share,
            tune.augment_mnist,
            tune.epoch_images,
            config.max_shift,
            augment(config),
            config.eval_batch_size,
        )

    def draw(self, idx: torch.Tensor, generator: torch.Generator) -> Batch:
        # NOTE idx only sets the batch size: the images are drawn at random (see the module's docstring)
        n_fonts = round(self.font_share * len(idx))
        n_plain = round((1 - self.augment_mnist) * (len(idx) - n_fonts))  # MNIST as the model learnt it
        device = self.train.images.device
        mnist = torch.randint(len(self.train), (len(idx) - n_fonts,), device=device, generator=generator)
        typed = torch.randint(
            max(1, len(self.fonts)), (n_fonts,), device=device, generator=generator
        )  # n_fonts 0: none
        images = torch.cat([self.train.images[mnist], self.fonts.images[typed]])  # (B, 28, 28) uint8
        labels = torch.cat([self.train.labels[mnist], self.fonts.labels[typed]])
        x = data.to_float(images)
        x = torch.cat([x[:n_plain], self.augment(x[n_plain:], generator)])
        return Batch(data.random_shift(x, self.max_shift, generator), labels)

    def loss(self, model: nn.Module, batch: Batch) -> StepOut:
        assert isinstance(model, CapsNet), "FontMix is for one process: a DDP wrapper has no loss()"
        out = model(batch.x, batch.y)  # the decoder draws the true class's capsule
        return StepOut(model.loss(out, batch.x, batch.y), out.lengths.argmax(1) == batch.y, out.votes)

    def validate(self, model: nn.Module) -> dict:
        assert isinstance(model, CapsNet)
        mnist = evaluate(model, self.val, self.eval_batch_size)
        if len(self.font_val) == 0:  # no fonts were installed where the bank was rendered
            return {"acc": mnist["accuracy"], "loss": mnist["loss"]}
        typed = evaluate(model, self.font_val, self.eval_batch_size)
        return {"acc": mnist["accuracy"], "loss": mnist["loss"], "fonts_acc": typed["accuracy"]}


def font_split(n: int, seed: int, device: str) -> data.Split:
    images, labels = fonts.render(n, seed)
    return data.Split(torch.from_numpy(images), torch.from_numpy(labels)).to(device)


def finetune(config: TrainConfig, tune: FineTuneConfig, log=print) -> Run:
    """Fine-tune tune.model_dir's model as config and tune say; returns fit's Run (the kept weights in OUT/best.pt)."""
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = Path(tune.model_dir)
    source = {"model_dir": str(model_dir), "version": sha256(model_dir / contract.CAPSNET_ONNX)[:12]}
    (out / SETTINGS).write_text(
        json.dumps({**asdict(tune), "source": source, "fonts": [str(p) for p in fonts.available()]}, indent=2) + "\n"
    )
    splits = load_splits(config)
    bank = font_split(tune.font_images, config.seed, config.device)
    font_val = font_split(tune.font_val_images, config.seed + 1, config.device)
    model = model_from_graphs(model_dir).train()
    log(
        f"fine-tuning {model_dir} ({source['version']}) on {hardware(config.device)}: {len(splits['train']):,} "
        f"MNIST training digits and {len(bank):,} font digits ({len(fonts.available())} fonts), "
        f"{100 * tune.font_share:g}% of each batch; {len(splits['val']):,} MNIST val"
    )
    return fit(model, FontMix.of(splits, bank, font_val, tune, config), config, log)


def blend(run_dir: Path, alpha: float) -> Path:
    """OUT/best.pt with its weights blended with the run's starting weights, (1 - α)·θ0 + α·θ1 (WiSE-FT
    eq. 1), as the checkpoint OUT/blend-α.pt (α = 1: best.pt itself)."""
    if alpha == 1:
        return run_dir / "best.pt"
    if not 0 <= alpha < 1:
        raise ValueError(f"the blend's α must be in [0, 1], got {alpha}")
    ckpt = torch.load(run_dir / "best.pt", map_location="cpu", weights_only=True)
    start = model_from_graphs(Path(json.loads((run_dir / SETTINGS).read_text())["model_dir"])).state_dict()
    ckpt["model"] = {k: (1 - alpha) * start[k] + alpha * v for k, v in ckpt["model"].items()}
    path = run_dir / f"blend-{alpha:g}.pt"
    torch.save(ckpt, path)
    return path


def compare_mixes(run_dir: Path, alphas: list[float], data_dir: Path | None = None, log=print) -> list[dict]:
    """Each blend's accuracy on MNIST's validation split and on the held-out font digits (α = 0: the
    starting weights), the splits the run itself validated on."""
    config = TrainConfig(**torch.load(run_dir / "best.pt", map_location="cpu", weights_only=True)["train_config"])
    config = replace(config, device="cpu", data_dir=str(data_dir) if data_dir else config.data_dir)
    tune = json.loads((run_dir / SETTINGS).read_text())
    val = load_splits(config)["val"]
    font_val = font_split(tune["font_val_images"], config.seed + 1, "cpu")
    rows = []
    for alpha in [0.0, *alphas]:
        model = model_from_graphs(Path(tune["model_dir"])) if alpha == 0 else load_checkpoint(blend(run_dir, alpha))[0]
        rows.append(
            {
                "alpha": alpha,
                "val_acc": evaluate(model, val)["accuracy"],
                "val_fonts_acc": evaluate(model, font_val)["accuracy"],
            }
        )
        log(
            f"α = {alpha:g}: MNIST val {100 * rows[-1]['val_acc']:.2f}%, "
            f"fonts val {100 * rows[-1]['val_fonts_acc']:.1f}%"
        )
    return rows


BASE_FACTS = (
    "version",
    "test_accuracy",
    "epochs",
    "run_epochs",
    "hardware",
    "precision",
    "train_seconds",
    "augmentations",
)  # what a fine-tuned card keeps of the card it started from


def recipe(t: dict, f: dict) -> str:
    """The fine-tune's augmentations in words, from its train_config and fine_tune sections (the card's)."""
    return (
        f"fine-tuned from {f['base']['version']} ({f['base'].get('augmentations', 'its own recipe')}): "
        f"{f['epoch_images'] * t['epochs']:,} draws, {f['font_share']:.0%} of each batch digits of "
        f"{len(f['fonts'])} training-only fonts (training/fonts.py); the font digits and "
        f"{f['augment_mnist']:.0%} of the MNIST ones with training.data.Augment (rotation ±{t['rotate']:g}°, "
        f"scale ±{t['scale']:g}, shear ±{t['shear']:g}°, stroke jitter p={t['stroke_jitter']:g}, elastic "
        f"alpha {t['elastic_alpha']:g} px sigma {t['elastic_sigma']:g} px{low_res(t)}); "
        f"every image ±{t['max_shift']} px shifts; Adam lr {t['lr']:g} x{t['lr_decay']:g} per epoch; "
        f"weight blend α = {f['blend_alpha']:g}"
    )


def low_res(t: dict) -> str:
    """The recipe's words for TrainConfig.low_res, when the run used it."""
    share = t.get("low_res", 0.0)
    return f", coarse scans p={share:g} (training.data.low_resolution)" if share else ""


def export_candidate(run_dir: Path, out_dir: Path, data_dir: Path | None = None, alpha: float = 1.0) -> dict:
    """The run's kept epoch (blended, α < 1) in fp16, as every shipped model's weights are (training.compact:
    the graphs store them as fp16, half the size), as a model folder: graphs, parity and card (export_checkpoint),
    the card's `fine_tune` section (OUT/finetune.json, α and the facts of the card it started from) and
    `augmentations` (recipe), and its int8 graph (quantize_model, which updates the card)."""
    weights = compact(blend(run_dir, alpha), run_dir / f"export-{alpha:g}.pt")
    settings = json.loads((run_dir / SETTINGS).read_text())
    base = json.loads((Path(settings["model_dir"]) / contract.MODEL_CARD).read_text())
    tune = {**settings, "blend_alpha": alpha, "base": {k: base[k] for k in BASE_FACTS if k in base}}
    _, ckpt = load_checkpoint(weights)
    export_checkpoint(weights, out_dir, data_dir, fine_tune=tune, augmentations=recipe(ckpt["train_config"], tune))
    quantize_model(out_dir, data_dir)
    return json.loads((out_dir / contract.MODEL_CARD).read_text())


TRAIN_OPTIONS = (
    "data_dir",
    "train_limit",
    "val_size",
    "max_shift",
    "rotate",
    "scale",
    "shear",
    "stroke_jitter",
    "elastic_alpha",
    "elastic_sigma",
    "low_res",
    "epochs",
    "batch_size",
    "lr",
    "lr_decay",
    "seed",
    "device",
    "precision",
    "time_limit",
    "eval_batch_size",
    "log_every",
    "out",
    "resume",
)
TRAIN_DEFAULTS = {  # the fine-tune's own, where TrainConfig's are for training from scratch
    "rotate": 10.0,
    "scale": 0.1,
    "shear": 10.0,
    "stroke_jitter": 0.2,
    "elastic_alpha": 16.0,  # px; Simard et al.'s 34 at sigma 4 bends digits more than people do
    "epochs": 6,
    "lr": 2e-4,  # a fifth of training's: the weights are already good
    "lr_decay": 0.6,
    "log_every": 10,
    "out": "runs/finetune",
}


def parse_args(argv=None) -> argparse.Namespace:
    """FineTuneConfig's fields and TRAIN_OPTIONS of TrainConfig as options (training/cli.py), and the
    commands that train nothing (--export, --mixes)."""
    p = argparse.ArgumentParser(prog="python -m training.finetune", description=__doc__.splitlines()[0])
    cli.add_options(p, FineTuneConfig)
    cli.add_options(p, TrainConfig, only=TRAIN_OPTIONS, defaults=TRAIN_DEFAULTS, choices={"precision": PRECISIONS})
    p.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="DIR",
        help="train nothing: write OUT's kept epoch as a model folder in DIR (graphs, card, int8)",
    )
    p.add_argument(
        "--mix",
        type=float,
        default=1.0,
        help="with --export: blend α of the kept epoch with the starting weights (1: the kept epoch alone)",
    )
    p.add_argument(
        "--mixes", default=None, metavar="A,B,...", help="train nothing: measure these blends on the validation splits"
    )
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    data_dir = Path(args.data_dir) if args.data_dir else None
    if args.mixes:
        return {"mixes": compare_mixes(Path(args.out), [float(a) for a in args.mixes.split(",")], data_dir)}
    if args.export:
        return export_candidate(Path(args.out), args.export, data_dir, args.mix)
    run = finetune(cli.build(TrainConfig, args), cli.build(FineTuneConfig, args), partial(print, flush=True))
    return {"run": run}


if __name__ == "__main__":
    main()
    sys.exit(0)
