"""What a lent GPU machine lacks to serve /predict on CUDA and measure it, packed in loads that its calls carry.

The GPU machine has Python 3.12, PyTorch with CUDA's libraries, numpy, SciPy, OpenCV and Pillow, and
reaches no registry; it lacks onnxruntime-gpu (256 MB), FastAPI and the rest of the `serve` extra, what
the benchmarks need beside it (BENCHMARKS), and `hey`. `pack` downloads those wheels here at the versions
this venv runs (the ones the tests pass on; numpy, SciPy, OpenCV and Pillow are the machine's own), adds
`hey` and the served MNIST model, and cuts the lot (one tar) into loads of at most LOAD_MIB, each a folder
of the working tree that one call carries.

$ python -m benchmarks.gpu_kit pack                # here: gpu-kit/load-1 ... load-N, with their sizes
  each call there, carry ["gpu-kit/load-K"]:
$ python3 -m benchmarks.gpu_kit gather             # keeps the carried part in KIT (it outlives the call)
  once every part is there:
$ python3 -m benchmarks.gpu_kit install && export PYTHONPATH=KIT/site PATH=KIT/bin:$PATH
  joins and checks the parts, installs the wheels into KIT/site, puts the model back in models/mnist
  and opens it as the engine would, stopping unless CUDA runs it; then serve_bench as anywhere
  (docs/training/campaign.md).
"""

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from model import contract
from training.campaign import site

REPO = Path(__file__).resolve().parents[1]
PACKED = REPO / "gpu-kit"  # gitignored
KIT = Path("/tmp/capsnet-gpu-kit")  # on the GPU machine: where the parts gather, and the install
LOAD_MIB = 56  # a call carries 64 MiB with the working tree (the models moved aside: about 5 MiB)
# In the GPU machine's image already (as its provider lists it), and large: its own versions serve
THERE = {"numpy", "scipy", "opencv-python-headless", "pillow", "protobuf", "uvloop", "pyyaml"}
# the served MNIST model: CUDA runs its fp32 graphs, serve_bench's template the int8 one
MODEL_FILES = (contract.CAPSNET_ONNX, contract.DECODER_ONNX, contract.MODEL_CARD, contract.CAPSNET_INT8_ONNX)
MANIFEST = "manifest.json"
# what the benchmarks run there need beside the serve extra: serve_bench's template app (FastAPI's UploadFile)
# and cpu_profile's stage of Starlette's form parser read a form with python-multipart
BENCHMARKS = ("python-multipart",)


def serve_requirements() -> list[str]:
    """The `serve` extra of pyproject.toml and BENCHMARKS, each pinned to the version installed here."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = []
    for requirement in map(Requirement, [*extras["serve"], *BENCHMARKS]):
        extra = f"[{','.join(sorted(requirement.extras))}]" if requirement.extras else ""
        pinned.append(f"{requirement.name}{extra}=={importlib.metadata.version(requirement.name)}")
    return pinned


def download_wheels(dest: Path, python: str) -> list[Path]:
    """The `serve` extra and what it needs, as wheels for CPython `python` on x86-64 Linux, at the versions
    installed here (their dependencies too, where installed), less THERE."""
    for wheel in site.download_wheels(dest, serve_requirements(), python):
        if site.normalised(wheel.name.split("-")[0]) in THERE:
            wheel.unlink()
    return sorted(dest.glob("*.whl"))


def pack(out: Path = PACKED, python: str = site.PYTHON, load_mib: float = LOAD_MIB) -> list[Path]:
    """Wheels, hey and the model in one tar, cut into loads out/load-K/part-K of at most load_mib MiB, each
    with the manifest (the tar's sha256 and its number of parts). Returns the loads."""
    hey = shutil.which("hey")
    if hey is None:
        sys.exit("the kit carries the load generator hey: apt-get install hey")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        wheels = download_wheels(Path(tmp), python)
        tar_path = Path(tmp) / "kit.tar"
        with tarfile.open(tar_path, "w") as tar:
            for wheel in wheels:
                tar.add(wheel, f"wheels/{wheel.name}")
            tar.add(hey, "bin/hey")
            for name in MODEL_FILES:
                tar.add(contract.SHIPPED["mnist"] / name, f"models/mnist/{name}")
        data = tar_path.read_bytes()
    size = int(load_mib * 2**20)
    parts = [data[i : i + size] for i in range(0, len(data), size)]
    manifest = {"sha256": hashlib.sha256(data).hexdigest(), "parts": len(parts), "wheels": [w.name for w in wheels]}
    loads = []
    for k, part in enumerate(parts, start=1):
        load = out / f"load-{k}"
        load.mkdir()
        (load / f"part-{k}").write_bytes(part)
        (load / MANIFEST).write_text(json.dumps(manifest, indent=1))
        loads.append(load)
    return loads


def gather(packed: Path = PACKED, kit: Path = KIT) -> list[int]:
    """Copy the parts carried in this call (packed/load-K) into kit; returns the parts kit holds."""
    loads = sorted(packed.glob("load-*"))
    if not loads:
        raise SystemExit(f"no load is in {packed}: name one (gpu-kit/load-K) in the call's carry")
    kit.mkdir(parents=True, exist_ok=True)
    for load in loads:
        for item in load.iterdir():
            shutil.copyfile(item, kit / item.name)
    return sorted(int(p.name.split("-")[1]) for p in kit.glob("part-*"))


def link_cuda_libraries(target: Path) -> None:
    """onnxruntime-gpu loads CUDA's and cuDNN's libraries from the `nvidia` packages beside it
    (onnxruntime.preload_dlls): the machine's, PyTorch's, are linked into target (the kit's site)."""
    spec = importlib.util.find_spec("nvidia")
    found = [Path(p) for p in (spec.submodule_search_locations or []) if target not in Path(p).parents] if spec else []
    if found and not (target / "nvidia").exists():
        (target / "nvidia").symlink_to(found[0], target_is_directory=True)


def install(kit: Path = KIT, repo: Path = REPO) -> str:
    """Join kit's parts (every one must be there, their sha256 the manifest's), install the wheels into
    kit/site and hey into kit/bin, and copy the model into repo's models/mnist. Returns the provider that
    runs the model when the engine's provider choice (CUDA where a device is) opens it with kit/site's
    onnxruntime."""
    if not (kit / MANIFEST).is_file():
        raise SystemExit(f"nothing is gathered in {kit}: gather the loads first, a call each")
    manifest = json.loads((kit / MANIFEST).read_text())
    missing = [k for k in range(1, manifest["parts"] + 1) if not (kit / f"part-{k}").is_file()]
    if missing:
        raise SystemExit(f"parts {missing} of {manifest['parts']} are not in {kit}: gather the loads that carry them")
    data = b"".join((kit / f"part-{k}").read_bytes() for k in range(1, manifest["parts"] + 1))
    if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        raise SystemExit(f"the parts in {kit} do not join into the packed kit (sha256 differs): pack and carry again")
    tar_path = kit / "kit.tar"
    tar_path.write_bytes(data)
    with tarfile.open(tar_path) as tar:
        tar.extractall(kit, filter="data")
    tar_path.unlink()
    wheels = sorted(str(p) for p in (kit / "wheels").glob("*.whl"))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--upgrade"]
    subprocess.run([*pip, "--target", str(kit / "site"), *wheels], check=True)
    (kit / "bin" / "hey").chmod(0o755)
    model = repo / "models" / "mnist"
    model.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        shutil.copyfile(kit / "models" / "mnist" / name, model / name)
    link_cuda_libraries(kit / "site")
    probe = (
        "import sys, onnxruntime as ort, uvicorn, python_multipart, app.main; from app.engine import select_providers; "
        "providers = select_providers(['CUDAExecutionProvider', 'CPUExecutionProvider']); "
        "print(ort.InferenceSession(sys.argv[1], providers=providers).get_providers()[0])"
    )
    env = {**os.environ, "PYTHONPATH": str(kit / "site")}
    command = [sys.executable, "-c", probe, str(model / contract.CAPSNET_ONNX)]
    out = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO, check=True)
    return out.stdout.strip().splitlines()[-1]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_kit", description=__doc__.splitlines()[0])
    step = p.add_subparsers(dest="step", required=True)
    packing = step.add_parser("pack", help="here: download, pack and cut the kit into gpu-kit/load-K")
    packing.add_argument("--python", default=site.PYTHON, help="the GPU machine's Python (its wheels' tag)")
    packing.add_argument("--load-mib", type=float, default=LOAD_MIB)
    step.add_parser("gather", help="there: keep the parts this call carried in " + str(KIT))
    step.add_parser("install", help="there, once every part is gathered: install into " + str(KIT / "site"))
    args = p.parse_args(argv)
    if args.step == "pack":
        for load in pack(python=args.python, load_mib=args.load_mib):
            print(f"{load.relative_to(REPO)}: {sum(f.stat().st_size for f in load.iterdir()) / 2**20:.1f} MiB")
    elif args.step == "gather":
        parts = gather()
        total = json.loads((KIT / MANIFEST).read_text())["parts"]
        print(f"{KIT} holds parts {parts} of {total}")
    else:
        provider = install()
        if provider != "CUDAExecutionProvider":
            sys.exit(f"installed in {KIT / 'site'}, but the model runs on {provider}, not CUDA: see the lines above")
        print(f"installed in {KIT / 'site'}; the model runs on {provider}")
        print(f"export PYTHONPATH={KIT / 'site'} PATH={KIT / 'bin'}:$PATH")


if __name__ == "__main__":
    main()
