"""The ledger: each run's training across GPU windows, committed beside the code (training/campaign/ledger.json).

Per run of the plan: the windows it trained in, its GPU-minutes (wall-clock minutes of its process,
compilation and test included), the images it has seen in all, and per window where it started (a
shipped model's version, or a seed), its learning rate, the hardware, its test figures and whether
campaign ship replaced the shipped model with it. A model's next window starts from what was shipped,
so the ledger's sums are the shipped model's training since the campaign began. docs/results.md shows
it beside each run's target (table()).
"""

import json
from pathlib import Path

from training.campaign import plan

LEDGER = Path(__file__).with_name("ledger.json")


def read(path: Path = LEDGER) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"runs": {}}


def record(ledger: dict, result: dict, window: str, shipped: dict | None) -> dict:
    """Add one run's window (its result.json) to the ledger; returns the run's entry."""
    entry = ledger["runs"].setdefault(result["name"], {"windows": 0, "gpu_minutes": 0.0, "images_seen": 0, "log": []})
    entry["windows"] += 1
    entry["gpu_minutes"] = round(entry["gpu_minutes"] + result["wall_seconds"] / 60, 1)
    entry["images_seen"] += result["images_seen"]
    entry["log"].append(
        {
            "window": window,
            "hardware": result["hardware"],
            "started_from": result["started_from"],
            "seed": result["spec"]["train"].get("seed", 0),
            "lr": result["lr"],
            "lr_decay": result["lr_decay"],
            "epochs_run": result["epochs_run"],
            "images_seen": result["images_seen"],
            "images_per_s": result["images_per_s"],
            "minutes": round(result["wall_seconds"] / 60, 1),
            "test": result["test"],
            "shipped": shipped,
        }
    )
    return entry


def write(ledger: dict, path: Path = LEDGER) -> None:
    path.write_text(json.dumps(ledger, indent=1) + "\n")


def figure(test: dict) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in test.items())


def table(ledger: dict) -> str:
    """Every run of the plan beside its target: windows, GPU-minutes, images seen, the last window's figures."""
    lines = [
        "| Run | Target | Windows | GPU-minutes | Images seen | Last window: test figures | Hardware |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for spec in plan.PLAN:
        entry = ledger["runs"].get(spec.name)
        if entry is None:
            lines.append(f"| {spec.name} | {spec.target} | 0 | — | — | not run | — |")
            continue
        last = entry["log"][-1]
        shipped = " (shipped)" if (last.get("shipped") or {}).get("replaced") else ""
        lines.append(
            f"| {spec.name} | {spec.target} | {entry['windows']} | {entry['gpu_minutes']:g} | "
            f"{entry['images_seen']:,} | {figure(last['test'])}{shipped} ({last['window']}) | {last['hardware']} |"
        )
    return "\n".join(lines)
