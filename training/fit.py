"""The one training loop: train.py, MultiMNIST, the affine pair, Fashion and the ablation all use it.

An experiment brings a Task (how a batch is drawn from the training split, its loss, how a model is
validated) and a TrainConfig; fit() does the rest the same way for all of them:
- Adam (fused on CUDA) with exponential decay stepped per step (lr_decay per epoch);
- every tensor on the device, batches drawn there by index; one permutation per epoch shared by
  every rank, cut to whole global batches so each rank takes the same number of steps (a rank that
  ran out first would otherwise leave the others waiting in all-reduce);
- two generators: `order` (the permutation, seeded alike on every rank) and `augment` (shifts,
  pairs, placements; seeded per rank, so ranks see different augmentations); both are saved in
  last.pt, so a resumed run continues the data stream instead of replaying epoch 1;
- bf16 autocast for the convs and the decoder where it is native (routing stays fp32, model/capsnet.py),
  TF32 and cudnn.benchmark on CUDA, channels_last, optional torch.compile (CUDA graphs on CUDA);
- no host sync inside a step: losses and hits accumulate on the device, read every log_every steps;
- validation and checkpoints every eval_every epochs and after the last: last.pt holds everything a
  resume needs, best.pt only the weights and the configs. Without a validation split (val_size 0)
  the last epoch is the one kept;
- an optional time limit (config.time_limit): the epoch that passes it becomes the last one, and
  best.pt records how many epochs ran (`epochs_run`) beside the planned count; an optional deadline
  (config.deadline, a wall-clock time, a GPU lease's end): no epoch is begun that the last epoch's
  duration, validation included, says would end past it;
- optional starting weights (config.init: a checkpoint's, optimiser fresh) and an optional target
  (config.stop_at: the run ends at the first validated epoch that reaches it, as section 5.2 compares
  an early-stopped CapsNet and a CNN at about the same accuracy, 99.23% and 99.22% on expanded MNIST).
"""

import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn

from model.routing import QPRouting
from training.config import TrainConfig, autocast, resolve_precision, selection


class Batch(NamedTuple):
    x: torch.Tensor  # model input (B, 1, H, W) in [0, 1]
    y: torch.Tensor  # labels (B,), or (B, 2) for a pair of digits
    target: torch.Tensor | None = None  # what the decoder draws when it is not x (MultiMNIST: each digit)


class StepOut(NamedTuple):
    loss: torch.Tensor  # scalar, differentiable
    correct: torch.Tensor  # (B,) bool: the task's own notion of right
    votes: torch.Tensor | None = None  # u_hat, for QP routing's ascent (Algorithm 1, lines 7-9)


class Task:
    """What an experiment adds to the loop. Subclasses set train_size and implement draw and loss;
    validate returns {"acc": ...} (and "loss" where the task has one) on the held-out set, or None
    when there is none."""

    train_size: int

    def draw(self, idx: torch.Tensor, generator: torch.Generator) -> Batch:
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch) -> StepOut:
        raise NotImplementedError

    def schedule(self, progress: float) -> None:
        """Called before every step with the fraction of the planned epochs done, for a loss whose
        terms move over training (the spread loss's margin)."""

    def validate(self, model: nn.Module) -> dict | None:
        return None


@dataclass
class Run:
    """What fit() returns; the model it trained holds the kept epoch's weights."""

    history: list[dict] = field(default_factory=list)  # one record per validated epoch
    kept_epoch: int = 0  # the epoch whose weights are in the model and in best.pt
    epochs_run: int = 0  # epochs trained (config.epochs unless the time limit stopped the run)
    selection: str = ""  # how it was chosen, in words (the model card's)
    train_seconds: float = 0.0
    images_per_epoch: int = 0  # training examples drawn per epoch, all ranks (partial batches dropped)
    precision: str = "fp32"
    hardware: str = ""

    @property
    def kept_images(self) -> int:
        """Training examples drawn up to the kept epoch."""
        return self.kept_epoch * self.images_per_epoch

    def summary(self) -> dict:
        """The run as an experiment's results record it: the kept and trained epochs, the images up to the
        kept one, the training time, hardware and precision."""
        return {
            "kept_epoch": self.kept_epoch,
            "epochs_run": self.epochs_run,
            "train_images": self.kept_images,
            "train_seconds": self.train_seconds,
            "hardware": self.hardware,
            "precision": self.precision,
        }

    @classmethod
    def of_checkpoint(cls, ckpt: dict) -> "Run":
        """The Run that wrote a best.pt (or its compact copy): for experiments that skip training and
        report a run made elsewhere, e.g. on a GPU machine (their --checkpoint option)."""
        history = ckpt.get("history", [])
        epochs_run = ckpt.get("epochs_run", ckpt["epoch"])
        return cls(
            history=history,
            kept_epoch=ckpt["epoch"],
            epochs_run=epochs_run,
            selection=selection(TrainConfig(**ckpt["train_config"]), epochs_run),
            train_seconds=ckpt["train_seconds"],
            images_per_epoch=history[-1]["train_images"] if history else 0,
            precision=ckpt["precision"],
            hardware=ckpt["hardware"],
        )


def hardware(device: str, world: int = 1) -> str:
    """The machine a run or a benchmark ran on, in words."""
    if str(device).startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
    else:
        name = f"CPU ({cpu_model()}, {torch.get_num_threads()} threads)"
    return name + (f" x{world}" if world > 1 else "")


def cpu_model() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what the platform module knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


INT8_FEATURES = ("avx512_vnni", "avx_vnni", "amx_int8", "avx512f", "avx2")  # what picks ONNX Runtime's int8 kernels


def cpu_features() -> str:
    """The processor and the instruction sets that decide its int8 kernels (int8 results differ between
    CPUs with and without VNNI), e.g. "Intel(R) Xeon(R) Processor @ 2.00GHz (avx512f, avx2; no VNNI)"."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next(line.split(":", 1)[1].split() for line in f if line.startswith("flags"))
    except (OSError, StopIteration):
        return cpu_model()
    have = [name for name in INT8_FEATURES if name in flags]
    vnni = "" if any("vnni" in name for name in have) else "; no VNNI"
    return f"{cpu_model()} ({', '.join(have) or 'none of ' + ', '.join(INT8_FEATURES)}{vnni})"


def setup_backends(device: str) -> None:
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True


def channels_last(model: nn.Module) -> nn.Module:
    """NHWC for the model's convolutions only (Module.to would also permute every other 4-D tensor,
    such as DigitCaps' W)."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # stub omits memory_format
    return model


def epoch_batches(n: int, batch_size: int, rank: int, world: int, generator: torch.Generator) -> torch.Tensor:
    """This rank's batches of one epoch, (steps, batch_size) indices into the training split.

    One permutation for every rank (their `order` generators are in the same state), cut to
    steps = n // (batch_size * world) whole global batches; rank r takes every world-th index of
    each. Every rank has the same number of full batches: equal step counts (DDP's all-reduce needs
    them) and static shapes (torch.compile and CUDA graphs need them). The cut images differ every epoch.
    """
    steps = n // (batch_size * world)
    if steps == 0:
        raise ValueError(f"{n} training examples make no whole batch of {batch_size} x {world} rank(s)")
    perm = torch.randperm(n, device=generator.device, generator=generator)[: steps * batch_size * world]
    return perm.view(steps, batch_size, world)[:, :, rank]


def generators(seed: int, rank: int, device: str) -> dict[str, torch.Generator]:
    """`order`, alike on every rank, and `augment`, different per rank (seed offset by a prime per rank)."""
    return {
        "order": torch.Generator(device=device).manual_seed(seed),
        "augment": torch.Generator(device=device).manual_seed(seed + 7919 * (rank + 1)),
    }


def _rng_states(gens: dict[str, torch.Generator], world: int) -> dict:
    """Generator states to checkpoint; `augment` from every rank (a collective under DDP)."""
    state = gens["augment"].get_state()
    augment: list[torch.Tensor | None] = [state]
    if world > 1:
        augment = [None] * world
        dist.all_gather_object(augment, state)
    return {"order": gens["order"].get_state(), "augment": augment, "torch": torch.get_rng_state()}


def _restore_rng(gens: dict[str, torch.Generator], states: dict, rank: int) -> None:
    gens["order"].set_state(states["order"])
    gens["augment"].set_state(states["augment"][rank])
    torch.set_rng_state(states["torch"])


def _model_config(model: nn.Module) -> dict | None:
    config = getattr(model, "config", None)
    return asdict(config) if config is not None else None


def save_curves(history: list[dict], path: Path) -> None:
    """Loss and error per validated epoch (train, and val when there is a validation split)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for part in ("train", "val"):
        if history and f"{part}_loss" in history[0]:
            ax1.plot(epochs, [h[f"{part}_loss"] for h in history], "o-", label=part)
        if history and f"{part}_acc" in history[0]:
            ax2.plot(epochs, [100 * (1 - h[f"{part}_acc"]) for h in history], "o-", label=part)
    ax1.set(xlabel="epoch", ylabel="loss", title="training objective")
    ax2.set(xlabel="epoch", ylabel="error (%)", yscale="log", title="error")
    for ax in (ax1, ax2):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _out_of_time(config: TrainConfig, seconds: float, epoch_cost: float, device: str, world: int) -> bool:
    """Whether the time limit has passed, or what is left to do before another epoch is over (epoch_cost
    seconds) would end past the deadline; under DDP rank 0's clock decides for every rank."""
    over = config.time_limit > 0 and seconds >= config.time_limit
    over = over or (config.deadline > 0 and time.time() + epoch_cost >= config.deadline)
    if world == 1 or not (config.time_limit or config.deadline):
        return over
    flag = torch.tensor(float(over), device=device)
    dist.broadcast(flag, 0)
    return bool(flag.item())


def fit(model: nn.Module, task: Task, config: TrainConfig, log=print) -> Run:
    """Train model on task as config says; returns the Run and leaves the kept epoch's weights in model.

    Under torchrun (an initialised process group) the model is wrapped in DistributedDataParallel and
    rank 0 validates, checkpoints and logs. Writes config.out/{last.pt, best.pt, metrics.json, curves.png}.
    """
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if config.stop_at and world > 1:
        raise ValueError("stop_at is decided on rank 0's validation: train in one process")
    master, device, out = rank == 0, config.device, Path(config.out)
    setup_backends(device)
    is_cuda = device.startswith("cuda")
    precision = resolve_precision(config)
    amp = autocast(device, precision)
    torch.manual_seed(config.seed)
    model.to(device)
    if config.channels_last:
        channels_last(model)

    steps = task.train_size // (config.batch_size * world)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, fused=is_cuda)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=config.lr_decay ** (1 / max(1, steps)))
    gens = generators(config.seed, rank, device)
    run = Run(precision=precision, hardware=hardware(device, world), images_per_epoch=steps * config.batch_size * world)
    start = 1
    best_state, best_acc = None, -math.inf
    if config.init and not config.resume:
        start_weights = torch.load(config.init, map_location=device, weights_only=True)
        model.load_state_dict(start_weights["model"])  # fp16 weights (training.compact) load into fp32 parameters
        if master:
            log(f"starting from the weights of {config.init} (optimiser fresh, lr {config.lr:g})")
    if config.resume:
        ckpt = torch.load(out / "last.pt", map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        _restore_rng(gens, ckpt["rng"], rank)
        run.history, run.train_seconds, start = ckpt["history"], ckpt["train_seconds"], ckpt["epoch"] + 1
        if (out / "best.pt").exists():
            best = torch.load(out / "best.pt", map_location=device, weights_only=True)
            best_state, run.kept_epoch = best["model"], best["epoch"]
            best_acc = max((h["val_acc"] for h in run.history if "val_acc" in h), default=-math.inf)
    out.mkdir(parents=True, exist_ok=True)
    net = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    step_loss = task.loss
    if config.compile:
        step_loss = torch.compile(task.loss, mode="reduce-overhead" if is_cuda else "default")
    routing = getattr(getattr(model, "digits", None), "routing", None)
    qp = routing if isinstance(routing, QPRouting) else None
    reduce = dist.all_reduce if world > 1 else None  # qp: every rank ascends on the global batch

    def train_step(batch: Batch) -> StepOut:
        for _ in range(config.n_w):  # Algorithm 1, lines 3-6: weights, routing coefficients fixed
            with amp:
                res = step_loss(net, batch)
            optimizer.zero_grad(set_to_none=True)
            res.loss.backward()
            optimizer.step()
        scheduler.step()
        if qp is not None:  # Algorithm 1, lines 7-9: ascend on b, the weights fixed
            assert res.votes is not None, "QP routing ascends on the votes: the task's loss must return them"
            # NOTE the votes are those of the last weight step's forward, before its update:
            # one forward fewer per batch than recomputing them, one optimiser step stale.
            for _ in range(config.n_r):
                qp.ascend(res.votes.detach(), batch.y, config.qp_lr, reduce)
        return res

    def record_of(epoch: int) -> dict:
        """What every checkpoint carries beside the weights: configs, history and provenance."""
        return {
            "config": _model_config(model),
            "train_config": asdict(config),
            "epoch": epoch,
            "history": run.history,
            "train_seconds": run.train_seconds,
            "hardware": run.hardware,
            "precision": precision,
            "dataset": config.dataset,
        }

    began = time.perf_counter()
    epoch, val_seconds = start - 1, 0.0
    for epoch in range(start, config.epochs + 1):
        net.train()
        t0 = time.perf_counter()
        loss_sum = torch.zeros((), device=device)
        hits = torch.zeros((), device=device)
        batches = epoch_batches(task.train_size, config.batch_size, rank, world, gens["order"])
        for step in range(steps):
            task.schedule((epoch - 1 + step / steps) / config.epochs)
            batch = task.draw(batches[step], gens["augment"])
            if config.channels_last:
                batch = batch._replace(x=batch.x.contiguous(memory_format=torch.channels_last))
            res = train_step(batch)
            loss_sum += res.loss.detach()
            hits += res.correct.sum()
            if master and (step + 1) % config.log_every == 0:
                seen = (step + 1) * config.batch_size
                log(
                    f"epoch {epoch}/{config.epochs} step {step + 1}/{steps} loss {loss_sum.item() / (step + 1):.4f} "
                    f"acc {hits.item() / seen:.4f} lr {scheduler.get_last_lr()[0]:.2e} "
                    f"({seen / (time.perf_counter() - t0):.0f} images/s per rank)"
                )
        if is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        run.train_seconds += seconds
        cost = seconds + 2 * val_seconds  # this epoch's validation, then one more epoch with its own
        last = epoch == config.epochs or _out_of_time(config, time.perf_counter() - began, cost, device, world)
        if not (last or epoch % config.eval_every == 0):
            continue
        rng = _rng_states(gens, world)  # a collective: every rank takes part
        if not master:
            if last:
                break
            continue

        # --- validate and checkpoint (rank 0)
        record = {
            "epoch": epoch,
            "step": epoch * steps,
            "lr": scheduler.get_last_lr()[0],
            "train_loss": loss_sum.item() / steps,
            "train_acc": hits.item() / (steps * config.batch_size),
            "epoch_seconds": seconds,
            "train_images": run.images_per_epoch,
            "train_images_per_s": run.images_per_epoch / seconds,
        }
        t_val = time.perf_counter()
        with amp:
            val = task.validate(model)
        val_seconds = time.perf_counter() - t_val
        if val is not None:
            record.update({f"val_{k}": v for k, v in val.items()})
        run.history.append(record)
        log(json.dumps(record))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        keep = (val is None and last) or (val is not None and val["acc"] >= best_acc)
        if keep:
            best_state, run.kept_epoch = state, epoch
            best_acc = val["acc"] if val is not None else best_acc
        common = record_of(epoch)
        torch.save(
            {
                **common,
                "model": state,
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": rng,
            },
            out / "last.pt",
        )
        if keep:  # now, so that a run cut off later (and its --resume) still has it
            torch.save({**common, "model": state}, out / "best.pt")
        (out / "metrics.json").write_text(json.dumps(run.history, indent=2))
        if last or (config.stop_at and val is not None and val["acc"] >= config.stop_at):
            break

    run.epochs_run = epoch
    if master and best_state is not None:  # the kept weights again, now with the whole run's record
        torch.save(
            {**record_of(epoch), "model": best_state, "epoch": run.kept_epoch, "epochs_run": epoch}, out / "best.pt"
        )
    if master and run.history:
        save_curves(run.history, out / "curves.png")
    run.selection = selection(config, run.epochs_run)
    if best_state is not None:
        model.load_state_dict(best_state)
    return run
