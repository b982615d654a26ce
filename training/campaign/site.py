"""What the GPU machine lacks to run the campaign, carried in the pack's first load as a folder for PYTHONPATH.

The GPU machine runs CPython 3.12 with PyTorch, numpy, SciPy, OpenCV, Pillow, ONNX and a CPU-only ONNX
Runtime, and reaches no registry. The campaign's commands there import training.export (the runs' experiments
export what they train), which reads model/card.py's schema, written with pydantic: the machine has no
pydantic. `build` downloads pydantic and what it needs as wheels for that Python, at the versions installed
here, and unpacks them into one folder (a wheel is a zip of what goes into site-packages), so that there

    PYTHONPATH=$PWD/campaign/pack/load-1/site python3 -m training.campaign launch

finds them, and every run the supervisor starts inherits the variable. benchmarks/gpu_kit.py downloads the
serving kit's wheels the same way.
"""

import importlib.metadata
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PYTHON = "3.12"  # the GPU machine's CPython
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
REQUIREMENTS = ("pydantic",)  # what the campaign imports that the machine lacks (with its dependencies)
# The third-party modules the campaign's commands may import there: the machine's own (PyTorch's among them)
# and what build() carries. tests/training/test_campaign_site.py holds the commands to them.
MACHINE_MODULES = frozenset(
    {"torch", "torchgen", "numpy", "scipy", "cv2", "PIL", "onnx", "onnxruntime", "ml_dtypes", "google", "tqdm"}
    | {"typing_extensions", "yaml", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock", "fsspec"}
)
CARRIED_MODULES = frozenset({"pydantic", "pydantic_core", "annotated_types", "typing_inspection"})


def normalised(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503), by the standard library alone (this module is
    imported on the GPU machine): one constraint line per distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def download_wheels(dest: Path, requirements: list[str], python: str = PYTHON) -> list[Path]:
    """requirements and what they need, as wheels for CPython `python` on x86-64 Linux in dest, each at the
    version installed here where it is installed (the versions the tests pass on)."""
    dest.mkdir(parents=True, exist_ok=True)
    constraints = dest / "constraints.txt"
    installed = {normalised(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(installed.items())))
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    wanted = ["--implementation", "cp", "--python-version", python, *platforms, "-c", str(constraints)]
    pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", *wanted, "-d", str(dest)]
    subprocess.run([*pip, *requirements], check=True)
    constraints.unlink()
    return sorted(dest.glob("*.whl"))


def unpack(wheels: list[Path], dest: Path) -> Path:
    """Each wheel's files into dest, as `pip install --target dest` lays them out for pure and binary wheels
    alike (neither has scripts or data that the campaign needs)."""
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(dest)
    return dest


def build(dest: Path, python: str = PYTHON) -> Path:
    """REQUIREMENTS for CPython `python`, unpacked into dest (the folder for PYTHONPATH)."""
    with tempfile.TemporaryDirectory() as tmp:
        return unpack(download_wheels(Path(tmp), list(REQUIREMENTS), python), dest)
