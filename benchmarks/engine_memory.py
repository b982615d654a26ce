"""Memory and speed of every shipped model's ONNX Runtime sessions in one process, under session options.

$ python -m benchmarks.engine_memory                        # every variant, two rounds (about 6 min on 2 cores)
$ python -m benchmarks.engine_memory --rounds 1 --repeats 2 --variants 0,8

Each variant runs in a process of its own (CPUExecutionProvider): it loads the four shipped models' CapsNet
graphs (the one the service serves on the CPU: int8 for mnist) and decoders, warms them up as the engine
does (batches of 1 and 64 images; the decoder 1 and 256) and reads the process's resident memory (VmRSS,
"ready"); runs a mixed load, batches of 1, 3, 7, 16, 33 and 64 images through every model in turn, and
reads it again ("after load"); then times batches of 64 images per model (median of `repeats` runs, in
images/s). The last variant is the service's own `Engines` (app/memory.py's measures), timed through its
batchers. Images/s are the best of `rounds` rounds: the machine is shared with other work. Writes
benchmarks/results/engine_memory.json and .md. Not a test.
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.report import write_report
from model.contract import NUM_PRIMARY
from tests.harness import REPO, machine, rss_mb

RESULTS = REPO / "benchmarks" / "results"
BATCH, DECODER_BATCH = 64, 256
LOAD = (1, 3, 7, 16, 33, 64)  # the mixed load's batch sizes
Run = Callable[[np.ndarray], Sequence[np.ndarray]]


@dataclass(frozen=True)
class Variant:
    name: str
    arena: str = "session"  # ONNX Runtime's default, one arena per session; "shared": one per process; "off"
    mem_pattern: bool = True
    run_primary: int | None = None  # primary capsules' votes a run may hold (rows = this // P); None: whole batches
    shrink: bool = False  # the arena shrinks back after every run (run option)
    trim: bool = False  # malloc_trim after loading and warming up
    served: bool = False  # the service's Engines, whatever app/memory.py does


VARIANTS = (
    Variant("ONNX Runtime's defaults"),
    Variant("+ freed heap returned (malloc_trim)", trim=True),
    Variant("arena off", arena="off", trim=True),
    Variant("arena shrunk after every run", shrink=True, trim=True),
    Variant("one arena per process", arena="shared", trim=True),
    *(
        Variant(
            f"one arena, runs of {images} MNIST images' votes{'' if pattern else ', no memory pattern'}",
            arena="shared",
            run_primary=images * NUM_PRIMARY,
            mem_pattern=pattern,
            trim=True,
        )
        for images in (64, 32, 16)
        for pattern in (True, False)
    ),
    Variant("the service (app/memory.py)", served=True),
)


def raw_runners(variant: Variant, threads: int) -> dict[str, tuple[Run, Run, int]]:
    """Per shipped model: (run the CapsNet graph on images, run the decoder, input size), under variant's options."""
    import onnxruntime as ort

    from app import memory
    from app.engine import choose_precision
    from model import contract
    from model.card import read_serving

    if variant.arena == "shared":
        memory.share_cpu_arena()
    run_options = ort.RunOptions()
    if variant.shrink:
        run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")

    def session(path: Path):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.enable_mem_pattern = variant.mem_pattern
        options.enable_cpu_mem_arena = variant.arena != "off"
        if variant.arena == "shared":
            options.add_session_config_entry(memory.USE_SHARED_ARENA, "1")
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    runners: dict[str, tuple[Run, Run, int]] = {}
    for name, folder in contract.SHIPPED.items():
        card = json.loads((folder / contract.MODEL_CARD).read_text())
        spec = read_serving(card, str(folder))
        int8 = choose_precision("auto", card, True, (folder / contract.CAPSNET_INT8_ONNX).is_file()) == "int8"
        capsnet = session(folder / (contract.CAPSNET_INT8_ONNX if int8 else contract.CAPSNET_ONNX))
        decoder = session(folder / contract.DECODER_ONNX)
        rows = max(1, variant.run_primary // spec.primary_capsules.count) if variant.run_primary else 1 << 30

        def run(x, capsnet=capsnet, rows=rows):
            return memory.in_slices(lambda y: capsnet.run(None, {contract.IMAGE: y}, run_options), x, rows)

        def decode(c, decoder=decoder):
            return decoder.run(None, {contract.CAPSULES: c}, run_options)

        runners[name] = (run, decode, spec.size)
    return runners


def served_runners(threads: int) -> dict[str, tuple[Run, Run, int]]:
    """The service's Engines (every shipped model on the CPU), warmed up and started, each graph run through its
    batcher."""
    from app.engine import Engines
    from app.settings import Settings

    engines = Engines(Settings(providers=["CPUExecutionProvider"], intra_op_threads=threads, workers=1))
    engines.warm_up()  # one model after the other, as `python -m app` and each worker do
    engines.start()

    def runner(engine) -> tuple[Run, Run, int]:
        return (
            lambda x: list(asyncio.run(engine.infer(engine.capsnet, x, engine.output_names)).values()),
            lambda c: list(asyncio.run(engine.infer(engine.decoder, c, engine.outputs_of(engine.decoder))).values()),
            engine.size,
        )

    return {engine.name: runner(engine) for engine in engines}


def measure(variant: Variant, threads: int, repeats: int) -> dict:
    """In this process: the variant's sessions, warmed up, their memory, after a mixed load too, and speed."""
    runners = served_runners(threads) if variant.served else raw_runners(variant, threads)
    if not variant.served:  # the service has warmed up
        for run, decode, size in runners.values():
            for n in (1, BATCH):
                run(np.zeros((n, 1, size, size), np.float32))
            for n in (1, DECODER_BATCH):
                decode(np.zeros((n, 10, 16), np.float32))
    if variant.trim:
        from app.memory import release_freed_heap

        release_freed_heap()
    ready = rss_mb()
    rng = np.random.default_rng(0)
    for n in LOAD:
        for run, _, size in runners.values():
            run(rng.random((n, 1, size, size), np.float32))
    after = rss_mb()
    speed = {}
    for name, (run, _, size) in runners.items():
        x = rng.random((BATCH, 1, size, size), np.float32)
        run(x)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            run(x)
            times.append(time.perf_counter() - start)
        speed[name] = round(BATCH / float(np.median(times)), 1)
    return {"ready_mb": round(ready), "after_load_mb": round(after), "images_per_s": speed}


def in_child(index: int, threads: int, repeats: int) -> dict:
    """measure() of VARIANTS[index] in a fresh Python process."""
    command = [sys.executable, "-m", "benchmarks.engine_memory", "--child", str(index)]
    command += ["--threads", str(threads), "--repeats", str(repeats)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def markdown(report: dict) -> str:
    models = list(report["rows"][0]["images_per_s"])
    lines = [
        f"# Memory of the four models' sessions in one process ({report['device']}, CPUExecutionProvider)",
        "",
        f"{report['when']}; {report['threads']} intra-op threads a session; images/s at batch {BATCH}, the best of "
        f"{report['rounds']} round(s) of {report['repeats']} runs (median); 1-min load average "
        f"{report['load_average'][0]} before, {report['load_average'][1]} after.",
        "",
        "| variant | RSS ready MB | RSS after load MB | " + " | ".join(f"{m} img/s" for m in models) + " |",
        "|---|---:|---:|" + "---:|" * len(models),
    ]
    for row in report["rows"]:
        speeds = " | ".join(str(row["images_per_s"][m]) for m in models)
        lines.append(f"| {row['variant']['name']} | {row['ready_mb']} | {row['after_load_mb']} | {speeds} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.engine_memory", description=__doc__.splitlines()[0])
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="intra-op threads a session")
    p.add_argument("--repeats", type=int, default=5, help="timed batches per model")
    p.add_argument("--rounds", type=int, default=2, help="passes over the variants; images/s is the best")
    p.add_argument("--variants", help="comma list of indices into VARIANTS (default: all)")
    p.add_argument("--out", type=Path, default=RESULTS / "engine_memory.json")
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(measure(VARIANTS[args.child], args.threads, args.repeats)))
        return {}
    chosen = [int(i) for i in args.variants.split(",")] if args.variants else range(len(VARIANTS))
    load_before = os.getloadavg()[0]
    runs: dict[int, list[dict]] = {i: [] for i in chosen}
    for _ in range(args.rounds):
        for i in chosen:
            runs[i].append(in_child(i, args.threads, args.repeats))
            print(VARIANTS[i].name, json.dumps(runs[i][-1]), flush=True)
    rows = []
    for i, results in runs.items():
        speeds = {m: max(r["images_per_s"][m] for r in results) for m in results[0]["images_per_s"]}
        rows.append({"variant": asdict(VARIANTS[i]), **results[-1], "images_per_s": speeds})
    report = {
        "device": machine(),
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "threads": args.threads,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "rows": rows,
    }
    write_report(args.out, report, markdown(report))
    return report


if __name__ == "__main__":
    main()
