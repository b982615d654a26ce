"""Training throughput of our CapsNet and the cost of one routing call, on CPU and (if present) GPU.

$ python -m benchmarks.train_throughput                 # writes benchmarks/results/train_throughput.json
$ python -m benchmarks.train_throughput --steps 20 --devices cpu

Training images/s: full steps (forward with the true-label mask, margin + reconstruction loss,
backward, Adam) at batch 128 on random-shifted synthetic digits, after warm-up steps. Routing: one
`dynamic_routing` call on u_hat of shape (B, 1152, 10, 16) with r = 3, forward only and forward +
backward. A benchmark, not a test: it prints and saves numbers.
"""
import argparse
import json
import time
from pathlib import Path

import torch

from model.capsnet import CapsNet, CapsNetConfig
from model.routing import dynamic_routing
from training.train import hardware

BATCH = 128
WARMUP = 3
OUT = Path(__file__).parent / "results" / "train_throughput.json"


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str, steps: int) -> float:
    """Median seconds of fn() over steps calls, after WARMUP calls."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(steps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def bench_device(device: str, steps: int, amp: bool) -> dict:
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig()).to(device)
    opt = torch.optim.Adam(model.parameters())
    x = torch.rand(BATCH, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (BATCH,), device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp and device.startswith("cuda"))

    def train_step():
        with autocast:
            loss = model.loss(model(x, y), x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    u_hat = torch.randn(BATCH, 1152, 10, 16, device=device, requires_grad=True)

    def routing_fwd():
        with torch.no_grad():
            dynamic_routing(u_hat, 3)

    def routing_fwd_bwd():
        v, _ = dynamic_routing(u_hat, 3)
        v.sum().backward()

    step = timed(train_step, device, steps)
    return {
        "device": device, "hardware": hardware(device), "batch": BATCH, "amp_bf16": amp and device.startswith("cuda"),
        "train_step_ms": 1000 * step, "train_images_per_s": BATCH / step,
        "routing_forward_ms": 1000 * timed(routing_fwd, device, steps),
        "routing_forward_backward_ms": 1000 * timed(routing_fwd_bwd, device, steps),
    }


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--devices", nargs="+", default=["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
    p.add_argument("--no-amp", dest="amp", action="store_false")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    results = [bench_device(d, args.steps, args.amp) for d in args.devices]
    for r in results:
        print(f"{r['hardware']}: {r['train_images_per_s']:.0f} train images/s at batch {BATCH} "
              f"({r['train_step_ms']:.0f} ms/step); routing r=3 on ({BATCH}, 1152, 10, 16): "
              f"{r['routing_forward_ms']:.1f} ms forward, {r['routing_forward_backward_ms']:.1f} ms fwd+bwd")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"torch": torch.__version__, "results": results}, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
