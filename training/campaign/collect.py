"""What comes back from the GPU machine: at most 8 files of 16 MiB, 64 MiB a call, under $OUT.

$ python -m training.campaign collect "$OUT"        # any time, as often as wanted

Each call writes status.txt (campaign status), results.tgz (every run's result.json, metrics.json,
log and the supervisor's state) and, in the plan's order, the best-so-far weights of the runs that can
ship a model (plan.Spec.ships) as compact fp16 checkpoints (training.compact) in parts of PART_MIB,
name.pt.00, name.pt.01, ..., as many whole checkpoints as the call's files and bytes allow. A checkpoint
already brought back is not sent again unless its run has kept a newer epoch since (WORK/delivered.json),
so repeated calls bring the rest; --again sends everything anew.
"""

import json
import tarfile
from pathlib import Path

from training.campaign import plan
from training.campaign.supervisor import STATE, status
from training.compact import compact

MAX_FILES, MAX_MIB, PART_MIB = 8, 62, 15  # a call brings back 8 files of 16 MiB, 64 MiB in all
DELIVERED = "delivered.json"
RESULTS = "results.tgz"


def results_archive(work: Path, dest: Path) -> Path:
    """Every run's small files: result.json, metrics.json, log.txt; the supervisor's state and log."""
    with tarfile.open(dest, "w:gz") as tar:
        for path in sorted(work.glob("*/*")):
            if path.name in ("result.json", "metrics.json", "log.txt"):
                tar.add(path, arcname=str(path.relative_to(work)))
        for name in (STATE, "supervisor.log"):
            if (work / name).exists():
                tar.add(work / name, arcname=name)
    return dest


def split(path: Path, out: Path, part_bytes: int) -> list[Path]:
    """path cut into out/<name>.00, .01, ... of at most part_bytes each (cat joins them)."""
    blob, parts = path.read_bytes(), []
    for k, start in enumerate(range(0, len(blob), part_bytes)):
        part = out / f"{path.name}.{k:02d}"
        part.write_bytes(blob[start : start + part_bytes])
        parts.append(part)
    return parts


def collect(work: Path, out: Path, again: bool = False, log=print) -> list[Path]:
    """Write this call's files to out; returns them."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "status.txt").write_text("\n".join(status(work)) + "\n")
    written = [out / "status.txt", results_archive(work, out / RESULTS)]
    delivered_path = work / DELIVERED
    delivered = {} if again or not delivered_path.exists() else json.loads(delivered_path.read_text())
    used = sum(p.stat().st_size for p in written)
    staging = work / "compact"
    staging.mkdir(exist_ok=True)
    for spec in plan.PLAN:
        best = work / spec.name / "best.pt"
        if spec.ships is None or not best.exists():
            continue
        stamp = best.stat().st_mtime
        if delivered.get(spec.name) == stamp:
            continue
        small = compact(best, staging / f"{spec.name}.pt")
        n_parts = -(-small.stat().st_size // (PART_MIB * 2**20))
        if len(written) + n_parts > MAX_FILES or used + small.stat().st_size > MAX_MIB * 2**20:
            log(f"{spec.name}: left for the next collect (this call's files are full)")
            continue
        written += split(small, out, PART_MIB * 2**20)
        used += small.stat().st_size
        delivered[spec.name] = stamp
    delivered_path.write_text(json.dumps(delivered) + "\n")
    for path in written:
        log(f"{path}: {path.stat().st_size / 2**20:.1f} MiB")
    return written
