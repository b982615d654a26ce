"""The window on the GPU machine: the plan's runs, a few at a time, each ended before the lease is.

`campaign launch` starts the supervisor detached (its own session, as setsid does), so it and its runs
outlive the call that started them; it returns at once. The supervisor begins the plan's runs in order,
`slots` at a time, each as its own process (python -m training.campaign.runs) with its own deadline:
its minutes from its start, never past the window's. A run whose data or starting weights are in a load
not carried yet waits for it and keeps its place: runs after it in the plan take only the slots that the
waiting runs before them leave, so the plan's order holds whatever order the loads arrive in. A run whose
items are in no load of the pack is skipped; a run is not begun with less than plan.MIN_MINUTES left.
WORK/state.json says where each run is; `status` reads it with each run's last log record.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from training.campaign import plan
from training.campaign.pack import MANIFEST
from training.campaign.runs import items, locate

STATE = "state.json"
PID = "supervisor.pid"
FINAL = ("done", "failed", "skipped")
REPO = Path(__file__).resolve().parents[2]


def coming(pack: Path) -> dict[str, str]:
    """The items of the loads not carried yet, each with its load's name, from load-1's manifest."""
    manifest = pack / "load-1" / MANIFEST
    if not manifest.exists():
        return {}
    loads = json.loads(manifest.read_text())["loads"]
    return {item: load for load, entry in loads.items() if not (pack / load).exists() for item in entry["items"]}


def schedule(
    specs: list[plan.Spec], state: dict, running: int, slots: int, pack: Path, left: float, min_left: float
) -> list[plan.Spec]:
    """The runs to begin now, in the plan's order; state gets why each other unfinished run does not begin.
    A run waiting for a load holds a slot, so that no run after it in the plan takes it meanwhile."""
    expected, held = coming(pack), 0
    begin: list[plan.Spec] = []
    for spec in specs:
        if state.get(spec.name, {}).get("state") in (*FINAL, "running"):
            continue
        missing = [item for item in items(spec) if locate(pack, item) is None]
        if left < min_left:
            state[spec.name] = {"state": "skipped", "why": "not begun: too little of the window left"}
        elif absent := [item for item in missing if item not in expected]:
            state[spec.name] = {"state": "skipped", "why": f"{', '.join(absent)}: in no load of the pack"}
        elif missing:
            held += 1
            loads = sorted({expected[item] for item in missing})
            state[spec.name] = {"state": "waiting", "why": f"for {', '.join(missing)} ({', '.join(loads)})"}
        elif running + len(begin) + held >= slots:
            state[spec.name] = {"state": "waiting", "why": "for a slot"}
        else:
            begin.append(spec)
    return begin


def read_state(work: Path) -> dict:
    path = work / STATE
    return json.loads(path.read_text()) if path.exists() else {}


def write_state(work: Path, state: dict) -> None:
    tmp = work / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(work / STATE)  # a reader never sees half a file


def supervise(
    pack: Path,
    work: Path,
    deadline: float,
    slots: int,
    device: str,
    smoke: bool = False,
    names: list[str] | None = None,
    poll: float = 2.0,
) -> dict:
    """Run the plan (or the runs named) until every run has ended or the window has; returns the state."""
    specs = plan.by_name(names)
    state = read_state(work)
    running: dict[str, subprocess.Popen] = {}
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "TORCHINDUCTOR_COMPILE_THREADS": str(max(1, (os.cpu_count() or 1) // slots)),
    }
    min_left = 0.0 if smoke else plan.MIN_MINUTES * 60
    while True:
        now = time.time()
        for name, proc in list(running.items()):
            if (rc := proc.poll()) is not None:
                state[name].update(state="done" if rc == 0 else "failed", rc=rc, ended=now)
                del running[name]
        for spec in schedule(specs, state, len(running), slots, pack, deadline - now, min_left):
            run_deadline = min(deadline, now + spec.minutes * 60)
            (work / spec.name).mkdir(parents=True, exist_ok=True)
            command = [
                sys.executable,
                "-m",
                "training.campaign.runs",
                spec.name,
                *("--pack", str(pack), "--work", str(work), "--deadline", str(run_deadline)),
                *("--device", device),
                *(["--smoke"] if smoke else []),
            ]
            with open(work / spec.name / "log.txt", "ab") as log:
                running[spec.name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
            state[spec.name] = {
                "state": "running",
                "pid": running[spec.name].pid,
                "started": now,
                "deadline": run_deadline,
            }
        write_state(work, state)
        if not running and (all(state.get(s.name, {}).get("state") in FINAL for s in specs) or now >= deadline):
            for spec in specs:
                if state.get(spec.name, {}).get("state") not in FINAL:
                    state[spec.name] = {"state": "skipped", "why": "the window ended before it could begin"}
            write_state(work, state)
            return state
        time.sleep(poll)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def launch(
    pack: Path,
    work: Path,
    minutes: float,
    slots: int,
    device: str,
    smoke: bool = False,
    names: list[str] | None = None,
) -> int:
    """Start the supervisor detached and return its pid; if one is already running, return its pid (the
    runs that were waiting for data begin once a later call has carried it)."""
    work.mkdir(parents=True, exist_ok=True)
    pid_file = work / PID
    if pid_file.exists() and alive(pid := int(pid_file.read_text())):
        return pid
    command = [
        sys.executable,
        "-m",
        "training.campaign.supervisor",
        *("--pack", str(pack.resolve()), "--work", str(work.resolve())),
        *("--deadline", str(time.time() + minutes * 60), "--slots", str(slots), "--device", device),
        *(["--smoke"] if smoke else []),
        *(["--runs", ",".join(names)] if names else []),
    ]
    with open(work / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True
        )
    pid_file.write_text(str(proc.pid))
    return proc.pid


def last_record(log: Path) -> dict:
    """The last epoch record (fit's JSON line) of a run's log, or {}."""
    if not log.exists():
        return {}
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if line.startswith('{"epoch"'):
            return json.loads(line)
    return {}


def status(work: Path) -> list[str]:
    """One line per run: its state, its last validated epoch, images/s, minutes used, its test figures."""
    state, lines, now = read_state(work), [], time.time()
    for name, entry in state.items():
        record = last_record(work / name / "log.txt")
        result_path = work / name / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
        parts = [f"{name:24s} {entry['state']:8s}"]
        if "started" in entry:
            parts.append(f"{(entry.get('ended', now) - entry['started']) / 60:5.1f} min")
        if record:
            parts.append(f"epoch {record['epoch']}")
            if "val_acc" in record:
                parts.append(f"val {100 * record['val_acc']:.2f}%")
            parts.append(f"{record['train_images_per_s']:,.0f} images/s")
        if result:
            parts.append("test " + ", ".join(f"{k} {v:g}" for k, v in result["test"].items()))
        if "why" in entry:
            parts.append(entry["why"])
        if entry["state"] == "failed":
            tail = (work / name / "log.txt").read_text(errors="replace").strip().splitlines()[-1:]
            parts.append(f"exit {entry['rc']}: {tail[0][:160] if tail else ''}")
        lines.append("  ".join(parts))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.campaign.supervisor", description=__doc__.splitlines()[0])
    p.add_argument("--pack", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--deadline", type=float, required=True)
    p.add_argument("--slots", type=int, default=plan.SLOTS)
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--runs", default=None, help="comma list of the plan's runs (default: all)")
    args = p.parse_args(argv)
    names = args.runs.split(",") if args.runs else None
    supervise(args.pack, args.work, args.deadline, args.slots, args.device, args.smoke, names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
