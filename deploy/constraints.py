"""The images' pins: deploy/constraints.txt holds the `serve` and `demo` extras of pyproject.toml and all they
require at the versions this venv holds, a venv of the images' Python (the Dockerfile's BASE_IMAGE), since
which packages a requirement brings can depend on the Python version.

$ python -m deploy.constraints            # write it from the venv (make constraints)
$ python -m deploy.constraints --check    # exit 1 if the venv's versions differ from it (what the tests check)

The Dockerfile installs each image's extra with `-c constraints.txt`, and `make install` builds the venv with
the same file, so the tests run the versions the images ship. onnxruntime, which the CPU image installs in
place of onnxruntime-gpu (the Dockerfile's ORT_PACKAGE), is pinned to onnxruntime-gpu's version. The CUDA
and cuDNN packages that the GPU image's `cuda,cudnn` extras bring are not in the venv and are left to pip.
To move a package, or a floor in pyproject.toml: upgrade it in the venv without the pins (`pip install -U
<package>`), then `make constraints`, `make test` and `make docker-smoke`.
"""

import argparse
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "deploy" / "constraints.txt"
EXTRAS = ("serve", "demo")  # the serving image's and the demo image's
CPU_TWINS = {"onnxruntime-gpu": "onnxruntime"}  # a package -> the one the CPU image installs in its place
HEADER = (
    "# The serve and demo extras of pyproject.toml and all they require, at the versions the tests run, for the\n"
    "# images' Python {python}. Written by deploy/constraints.py from the venv (make constraints); do not edit.\n"
)


def image_python() -> tuple[int, int]:
    """(major, minor) of the images' Python: the Dockerfile's BASE_IMAGE, python:3.11-slim-bookworm."""
    found = re.search(r"^ARG BASE_IMAGE=python:(\d+)\.(\d+)", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    if found is None:
        sys.exit("the Dockerfile's BASE_IMAGE names no python:X.Y image")
    return int(found[1]), int(found[2])


def requirements(extras: tuple[str, ...] = EXTRAS) -> list[str]:
    """The requirement lines of pyproject.toml's extras."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [line for extra in extras for line in project["optional-dependencies"][extra]]


def closure(lines: list[str]) -> dict[str, str]:
    """Canonical name -> installed version of every distribution the requirement lines need, with the
    extras they name, and of everything those require in turn (markers evaluated here: Linux, this Python)."""
    pinned: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [r for r in map(Requirement, lines) if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        requirement = todo.pop()
        name, extras = canonicalize_name(requirement.name), frozenset(requirement.extras)
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            sys.exit(f"{requirement.name} is not installed: `make install` builds the venv these pins are read from")
        pinned[name] = dist.version
        for line in dist.requires or []:
            needed = Requirement(line)
            if needed.marker is None or any(needed.marker.evaluate({"extra": e}) for e in ("", *extras)):
                todo.append(needed)
    return pinned


def pins() -> dict[str, str]:
    """deploy/constraints.txt as canonical name -> pinned version."""
    lines = OUT.read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def constraints() -> str:
    """deploy/constraints.txt's text, from this venv (of the images' Python)."""
    python = image_python()
    if sys.version_info[:2] != python:
        sys.exit(
            f"the images run Python {python[0]}.{python[1]}: read their pins from a venv of it, not of "
            f"{sys.version_info[0]}.{sys.version_info[1]}"
        )
    pinned = closure(requirements())
    for package, twin in CPU_TWINS.items():
        if package in pinned:
            pinned[twin] = pinned[package]
    header = HEADER.format(python=f"{python[0]}.{python[1]}")
    return header + "".join(f"{name}=={version}\n" for name, version in sorted(pinned.items()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the venv's versions differ from the file")
    check = p.parse_args(argv).check
    text = constraints()
    if check:
        stale = not OUT.exists() or OUT.read_text() != text
        print(f"stale: {OUT} differs from this venv; run make constraints" if stale else "up to date")
        return int(stale)
    OUT.write_text(text)
    print(f"wrote {OUT} ({text.count('==')} packages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
