"""Training throughput: our CapsNet's training step beside a public-style one, and the routing's cost.

$ python -m benchmarks.train_throughput                       # CPU, and CUDA when present
$ python -m benchmarks.train_throughput --devices cuda --compile --steps 50

Both models train on the same batch of 128 real MNIST digits (the committed tests/fixtures slice),
shifted afresh by up to 2 px each step as in training, on the same device in the same process:
- ours: training/fit.py's step (ShiftedDigits' draw and loss, channels_last convs, Adam, fused on
  CUDA), at fp32 and, where bf16 is native, at bf16 autocast (routing in fp32 either way); with
  --compile, torch.compile'd as fit does (CUDA graphs on CUDA);
- the baseline: benchmarks/public_capsnet.py (fp32, Adam), the way most public reimplementations
  are written.
Timing: WARMUP steps, then `steps` steps timed as one span with one sync at its end: a launch-bound
model on a GPU overlaps the host's kernel launches with the device's work, and a sync per step
would hide that. The ratio is ours at the precision fit() picks here (`auto`) over the baseline.
Routing: the digit-capsule layer, votes u_hat_j|i = W_ij u_i (Eq. 2) and Procedure 1 (r = 3), on a
batch of random primary capsules (128, 1152, 8), fp32, forward and forward + backward (gradients
zeroed between calls): ours (fused_digit_routing, what training runs) and the baseline's. A benchmark, not a test: it
prints and saves numbers (benchmarks/results/train_throughput.json).
"""

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from benchmarks import public_capsnet
from model.capsnet import CapsNet, CapsNetConfig
from model.routing import fused_digit_routing
from training import data
from training.config import TrainConfig, autocast, native_bf16, resolve_precision
from training.fit import channels_last, hardware, setup_backends
from training.train import ShiftedDigits

BATCH = 128
WARMUP = 3
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mnist_test_1000.npz"
OUT = Path(__file__).parent / "results" / "train_throughput.json"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def per_step(fn, device: str, steps: int) -> float:
    """Seconds per call of fn over `steps` calls timed as one span, after WARMUP untimed calls."""
    for _ in range(WARMUP):
        fn()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / steps


def digits(device: str) -> ShiftedDigits:
    """The training task on the fixture's 1,000 real digits (no validation)."""
    with np.load(FIXTURE) as f:
        images, labels = torch.from_numpy(f["images"].copy()), torch.from_numpy(f["labels"].astype(np.int64))
    split = data.Split(images, labels).to(device)
    return ShiftedDigits({"train": split, "val": split}, max_shift=2)


def ours(task: ShiftedDigits, device: str, precision: str, compile: bool, steps: int) -> float:
    """Seconds per training step of fit()'s step for our CapsNet."""
    torch.manual_seed(0)
    model = channels_last(CapsNet(CapsNetConfig()).to(device))
    opt = torch.optim.Adam(model.parameters(), fused=device.startswith("cuda"))
    loss_fn = (
        torch.compile(task.loss, mode="reduce-overhead" if device.startswith("cuda") else "default")
        if compile
        else task.loss
    )
    gen = torch.Generator(device=device).manual_seed(0)
    idx = torch.arange(BATCH, device=device)
    amp = autocast(device, precision)

    def step():
        batch = task.draw(idx, gen)
        batch = batch._replace(x=batch.x.contiguous(memory_format=torch.channels_last))
        with amp:
            loss = loss_fn(model, batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return per_step(step, device, steps)


def baseline(task: ShiftedDigits, device: str, steps: int) -> float:
    """Seconds per training step of the public-style CapsNet, on the same batches."""
    torch.manual_seed(0)
    model = public_capsnet.PublicCapsNet().to(device)
    opt = torch.optim.Adam(model.parameters())
    gen = torch.Generator(device=device).manual_seed(0)
    idx = torch.arange(BATCH, device=device)

    def step():
        batch = task.draw(idx, gen)
        lengths, recon = model(batch.x, batch.y)
        loss = model.loss(lengths, recon, batch.x, batch.y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return per_step(step, device, steps)


def routing_steps(u: torch.Tensor, W: torch.Tensor) -> dict[str, Callable[[], None]]:
    """The digit-capsule layer's votes (Eq. 2) and routing (r = 3) for primary capsules u (B, 1152, 8)
    and W (1152, 10, 16, 8), leaves that require grad: forward and forward + backward, ours (what
    training runs: fused_digit_routing) and the baseline's (its broadcast votes and routing, on copies
    of u and W in its layout). Gradients are zeroed before each backward."""
    u_public = u.detach().clone().requires_grad_()
    W_public = W.detach().unsqueeze(0).transpose(1, 2).contiguous().requires_grad_()  # (1, 10, 1152, 16, 8)

    def baseline():
        return public_capsnet.routing((W_public @ u_public[:, None, :, :, None]).squeeze(-1), 3)

    calls = {"ours": (lambda: fused_digit_routing(u, W, 3)[0], (u, W)), "baseline": (baseline, (u_public, W_public))}
    steps: dict[str, Callable[[], None]] = {}
    for name, (call, leaves) in calls.items():

        def forward(call=call):
            with torch.no_grad():
                call()

        def forward_backward(call=call, leaves=leaves):
            for leaf in leaves:
                leaf.grad = None
            call().sum().backward()

        steps[f"{name}_forward"], steps[f"{name}_forward_backward"] = forward, forward_backward
    return steps


def routing_times(device: str, steps: int) -> dict:
    """Milliseconds per call of routing_steps on random primary capsules of a batch."""
    torch.manual_seed(0)
    u = torch.randn(BATCH, 1152, 8, device=device, requires_grad=True)
    W = (0.05 * torch.randn(1152, 10, 16, 8, device=device)).requires_grad_()
    return {f"{name}_ms": 1000 * per_step(fn, device, steps) for name, fn in routing_steps(u, W).items()}


def bench_device(device: str, steps: int, compile: bool) -> dict:
    setup_backends(device)
    task = digits(device)
    default = resolve_precision(TrainConfig(device=device))
    precisions = ["fp32"] + (["bf16"] if native_bf16(device) else [])
    result: dict = {
        "device": device,
        "hardware": hardware(device),
        "torch": torch.__version__,
        "batch": BATCH,
        "steps": steps,
        "compile": compile,
        "default_precision": default,
    }
    for precision in precisions:
        result[f"ours_{precision}_images_per_s"] = BATCH / ours(task, device, precision, compile, steps)
    result["baseline_images_per_s"] = BATCH / baseline(task, device, steps)
    result["ratio"] = result[f"ours_{default}_images_per_s"] / result["baseline_images_per_s"]
    result.update(routing_times(device, steps))
    return result


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    p.add_argument("--devices", nargs="+", default=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    p.add_argument("--compile", action="store_true", help="torch.compile our step, as `fit --compile` does")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    results = []
    for device in args.devices:
        r = bench_device(device, args.steps, args.compile)
        results.append(r)
        ours_line = ", ".join(
            f"{p} {r[f'ours_{p}_images_per_s']:.0f}" for p in ("fp32", "bf16") if f"ours_{p}_images_per_s" in r
        )
        print(
            f"{r['hardware']}: training images/s at batch {BATCH}: ours {ours_line}; public-style baseline "
            f"{r['baseline_images_per_s']:.0f}; ratio {r['ratio']:.2f}x (ours at {r['default_precision']})"
        )
        print(
            f"  votes + routing r=3 for ({BATCH}, 1152, 8) primary capsules: "
            f"ours {r['ours_forward_ms']:.1f} ms forward, "
            f"{r['ours_forward_backward_ms']:.1f} ms fwd+bwd; baseline {r['baseline_forward_ms']:.1f} / "
            f"{r['baseline_forward_backward_ms']:.1f} ms"
        )
    # one row per (hardware, compile): a run on one machine keeps the rows measured on others
    kept = json.loads(args.out.read_text())["results"] if args.out.exists() else []
    fresh = {(r["hardware"], r["compile"]) for r in results}
    rows = [r for r in kept if (r["hardware"], r["compile"]) not in fresh] + results
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"results": rows}, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
