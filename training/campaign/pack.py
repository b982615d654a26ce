"""Everything a GPU window reads, in loads that each travel in one call beside the code.

$ python -m training.campaign pack campaign/pack

A call to the GPU machine carries the working tree and the ignored paths it names, 64 MiB in all; the
code without models/ is about 4 MiB. The pack is cut into loads of at most LOAD_MIB each,
campaign/pack/load-1, load-2, ..., its items in the order the plan first needs them: MNIST, the starting
weights (fp16, training.compact's format, rebuilt from each shipped model's graphs), Fashion-MNIST and the font
bank (training.fonts renders need Debian's fonts, which the GPU machine lacks), each where its first run comes.
The first call carries load-1 and launches; the runs that need a later load wait for it.
"""

import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from model import contract
from training import data, fonts
from training.campaign import plan, runs
from training.graphs import model_from_graphs

LOAD_MIB = 56  # per load: 64 MiB a call, less the code and a margin
SITE = "site"  # in load-1: the packages the GPU machine lacks (site.py); its calls set PYTHONPATH=$PWD/<load-1>/site
FONT_IMAGES, FONT_VAL_IMAGES = 6000, 1000  # renders in the bank, and held out (training.finetune's)
MANIFEST = "manifest.json"


def start_weights(model: str, models_root: Path, dest: Path) -> Path:
    """A shipped model's weights as a compact fp16 checkpoint with its CapsNetConfig and where it came from."""
    model_dir = models_root / model
    card = json.loads((model_dir / contract.MODEL_CARD).read_text())
    state = model_from_graphs(model_dir).state_dict()
    dest.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "model": {k: v.half() if v.is_floating_point() else v for k, v in state.items()},
            "config": card["model_config"],
            "source": {"model": model, "version": card["version"], "test_accuracy": card.get("test_accuracy")},
        },
        dest,
    )
    return dest


def font_bank(dest: Path, n: int = FONT_IMAGES, n_val: int = FONT_VAL_IMAGES, seed: int = 0) -> tuple[Path, int]:
    """The flagship's font digits (training.fonts, the fonts installed here; none: an empty bank)."""
    found = len(fonts.available())
    images, labels = fonts.render(n, seed) if found else (np.zeros((0, 28, 28), np.uint8), np.zeros(0, np.int64))
    val_images, val_labels = (
        fonts.render(n_val, seed + 1) if found else (np.zeros((0, 28, 28), np.uint8), np.zeros(0, np.int64))
    )
    np.savez_compressed(dest, images=images, labels=labels, val_images=val_images, val_labels=val_labels)
    return dest, found


def copy_dataset(src: Path, dest: Path) -> Path:
    """The four IDX files of a data folder (raw or .gz), verified by data.load as they are read."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in data.find_files(src).values():
        shutil.copyfile(path, dest / path.name)
    return dest


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def needs(specs: list[plan.Spec]) -> list[str]:
    """The pack's items (paths inside a load) in the order the plan first needs them."""
    found: list[str] = []
    for spec in specs:
        found += [item for item in runs.items(spec) if item not in found]
    return found


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def pack(
    dest: Path,
    data_dirs: dict[str, Path],
    models_root: Path = contract.SHIPPED["mnist"].parent,
    names: list[str] | None = None,
    load_mib: float = LOAD_MIB,
    font_images: int = FONT_IMAGES,
    build_site: Callable[[Path], Path] | None = None,
    log=print,
) -> list[Path]:
    """Write the pack of the plan's runs (or those named) to dest/load-1, load-2, ...; returns the loads.
    build_site (site.build): the packages the GPU machine lacks, first in load-1 (none: the CPU's preflight)."""
    specs = plan.by_name(names)
    if dest.exists():
        shutil.rmtree(dest)
    staging = dest / "staging"
    made: dict[str, Path] = {SITE: build_site(staging / SITE)} if build_site else {}
    for item in needs(specs):
        target = staging / item
        target.parent.mkdir(parents=True, exist_ok=True)
        if item.startswith("data/"):
            made[item] = copy_dataset(data_dirs[item.removeprefix("data/")], target)
        elif item.startswith("start/"):
            made[item] = start_weights(Path(item).stem, models_root, target)
        else:
            made[item], found = font_bank(target, font_images, max(1, font_images // 6))
            if not found:
                log("no training fonts installed here (training/fonts.py names the packages): no font digits")
    loads: list[list[str]] = [[]]
    budget, used = load_mib * 2**20, 0
    for item, path in made.items():
        if size(path) > budget:
            raise ValueError(f"{item} is {size(path) / 2**20:.1f} MiB, more than a load's {load_mib:g} MiB")
        if used + size(path) > budget:
            loads.append([])
            used = 0
        loads[-1].append(item)
        used += size(path)
    dirs = []
    for k, items in enumerate(loads, 1):
        load = dest / f"load-{k}"
        for item in items:
            (load / item).parent.mkdir(parents=True, exist_ok=True)
            made[item].rename(load / item)
        dirs.append(load)
    shutil.rmtree(staging)
    manifest: dict = {
        "commit": commit(),
        "runs": [s.name for s in specs],
        "loads": {
            d.name: {"items": items, "mib": round(size(d) / 2**20, 1)} for d, items in zip(dirs, loads, strict=True)
        },
        "digest": hashlib.sha256(json.dumps([s.record() for s in specs], sort_keys=True).encode()).hexdigest()[:12],
    }
    (dirs[0] / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    for d in dirs:
        log(f"{d}: {size(d) / 2**20:.1f} MiB ({', '.join(manifest['loads'][d.name]['items'])})")
    return dirs
