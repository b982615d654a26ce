"""TrainConfig: every setting of a training run, typed, saved in its checkpoints beside CapsNetConfig.

The model's own settings (routing, iterations, reconstruction and its weight) live in
model.capsnet.CapsNetConfig; this one holds the data, the optimisation, the hardware and the outputs.
A checkpoint stores both as plain dicts (`asdict`), so `TrainConfig(**ckpt["train_config"])` rebuilds
the run exactly and a model card shows typed values, not command-line strings.
"""

from dataclasses import dataclass

import torch

from training import data

PRECISIONS = ("auto", "bf16", "fp32")


@dataclass
class TrainConfig:
    # --- data
    dataset: str = "mnist"  # one of data.DATASETS; MultiMNIST and the affine set are made of MNIST
    data_dir: str | None = None  # IDX files; None: data/<dataset>, fetched if empty
    max_shift: int = 2  # random shift in pixels, each direction (section 5: 2)
    pair_shift: int = 4  # MultiMNIST: each digit's shift in px, each direction (section 6: 4; the authors'
    #                      released test split: 6, training.pairs)
    # optional augmentations for real-world inputs (data.Augment; not in the paper, all off by default)
    rotate: float = 0.0  # degrees, each direction
    scale: float = 0.0  # fraction, each direction
    shear: float = 0.0  # degrees, each direction
    stroke_jitter: float = 0.0  # probability of a 1 px dilation or erosion
    elastic_alpha: float = 0.0  # px of elastic displacement (0: off)
    elastic_sigma: float = 4.0  # px, smoothing of the elastic field
    hflip: float = 0.0  # probability of a horizontal flip (garments; never digits)
    low_res: float = 0.0  # probability that a digit is seen as a coarse scan (data.low_resolution)
    train_limit: int = 0  # use only the first N training images (0: all)
    val_size: int = data.VAL_SIZE  # training images held out for selection; 0: train on all 60,000
    # --- optimisation (section 4: Adam, exponential decay; the official code: batch 128)
    epochs: int = 10
    batch_size: int = 128  # per rank; the last partial batch of an epoch is dropped (static shapes)
    lr: float = 1e-3  # Adam's TensorFlow default, the official code's
    lr_decay: float = 0.99  # LR factor per epoch, applied smoothly per step; the official 0.96 every
    #                         2,000 steps at batch 128 is ~0.99 per epoch of 60k; short runs want ~0.9
    n_w: int = 1  # weight steps per batch (Algorithm 1's n_w of QP routing; 1 for every other routing)
    n_r: int = 1  # qp: routing ascent steps per batch (Algorithm 1's n_r)
    qp_lr: float = 1e-5  # qp: gamma, the step of the routing ascent (Eqs. 13, 15 sum over the batch)
    seed: int = 0  # initialisation, data order and augmentation
    # --- hardware
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    precision: str = "auto"  # bf16 autocast for the convs and the decoder (routing stays fp32), or fp32;
    #                          auto: bf16 on CUDA and on CPUs with native bf16 (AVX512-BF16 / AMX)
    compile: bool = False  # torch.compile the loss; CUDA graphs (mode="reduce-overhead") on CUDA
    channels_last: bool = True  # NHWC for the two 9x9 convs (cuDNN's and oneDNN's fast layout)
    # --- evaluation and outputs
    eval_every: int = 1  # epochs between validations and checkpoints; the last epoch always has one
    eval_batch_size: int = 500
    time_limit: float = 0.0  # seconds of fit() (training and validation); the epoch that passes it is the
    #                          last, validated and checkpointed as the planned last would be (0: no limit)
    log_every: int = 50  # steps between progress lines (the only host syncs of an epoch)
    out: str = "runs/mnist"  # OUT/last.pt (resumable), OUT/best.pt, OUT/metrics.json, OUT/curves.png
    resume: bool = False  # continue from OUT/last.pt: weights, optimiser, schedule and data stream
    init: str = ""  # a checkpoint whose weights start the run (optimiser and schedule fresh, at lr)
    deadline: float = 0.0  # Unix time by which the run has ended, checkpoint written: no epoch is begun
    #                        that the last one's duration says would pass it (0: none)
    stop_at: float = 0.0  # end after the first validated epoch with at least this validation accuracy (0: never)

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        for name in ("epochs", "batch_size", "eval_every", "eval_batch_size", "log_every", "n_w"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if min(self.rotate, self.scale, self.shear, self.stroke_jitter, self.elastic_alpha) < 0 or self.scale >= 1:
            raise ValueError("augmentation bounds cannot be negative, and scale must stay below 1")
        if not (0 <= self.hflip <= 1 and 0 <= self.low_res <= 1):
            raise ValueError("hflip and low_res are probabilities, in [0, 1]")
        if self.val_size < 0 or self.train_limit < 0 or self.time_limit < 0 or self.deadline < 0:
            raise ValueError("val_size, train_limit, time_limit and deadline cannot be negative")
        if not 0 <= self.stop_at <= 1:
            raise ValueError(f"stop_at is a validation accuracy in [0, 1], got {self.stop_at}")
        if self.stop_at and not self.val_size:
            raise ValueError("stop_at needs a validation split (val_size > 0)")


def augment(config: TrainConfig) -> data.Augment:
    """The run's augmentations beyond the paper's shift (data.Augment)."""
    return data.Augment(
        config.rotate,
        config.scale,
        config.shear,
        config.stroke_jitter,
        config.elastic_alpha,
        config.elastic_sigma,
        config.hflip,
        config.low_res,
    )


def native_bf16(device: str) -> bool:
    """Whether bf16 matrix work is native here: any CUDA device with bf16 support, or a CPU with
    AVX512-BF16 or AMX (detected, never assumed; elsewhere bf16 is emulated and slower than fp32)."""
    if device.startswith("cuda"):
        return torch.cuda.is_bf16_supported()
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve_precision(config: TrainConfig) -> str:
    """'bf16' or 'fp32': what config.precision means on config.device."""
    if config.precision == "auto":
        return "bf16" if native_bf16(config.device) else "fp32"
    return config.precision


def autocast(device: str, precision: str) -> torch.autocast:
    """The autocast region of a training or evaluation step (a no-op for fp32)."""
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bf16")


def selection(config: TrainConfig, epochs_run: int | None = None) -> str:
    """How a run's kept weights were chosen, in words (fit's rule, the model card's text); epochs_run
    names a run that its time limit, deadline or stop_at ended before config.epochs."""
    ran = f"{config.epochs} epochs"
    if epochs_run is not None and epochs_run < config.epochs:
        stops = [f"its {config.time_limit:g} s time limit"] if config.time_limit else []
        stops += ["its GPU window's deadline"] if config.deadline else []
        stops += [f"reaching {config.stop_at:.1%} validation accuracy"] if config.stop_at else []
        ran = f"{epochs_run} of the {config.epochs} planned epochs" + (
            f" (stopped by {' or '.join(stops)})" if stops else ""
        )
    if config.val_size:
        return f"the epoch with the best validation accuracy ({config.val_size:,} held-out training images) of {ran}"
    return f"the last of {ran} (no validation split: every training image trained on)"
