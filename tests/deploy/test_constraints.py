"""The images install the versions the tests run: deploy/constraints.txt pins every package of the serve and
demo extras (and all they require) at this venv's version, and both images' pip installs use it."""

import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from deploy import constraints

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    sys.version_info[:2] != constraints.image_python(), reason="the pins are read from a venv of the images' Python"
)
def test_the_pins_are_this_venvs_versions():
    assert constraints.main(["--check"]) == 0, "deploy/constraints.txt is stale: make constraints"


def test_the_pins_are_for_the_images_python():
    assert constraints.image_python() == (3, 11)  # the Dockerfile's python:3.11-slim-bookworm
    assert "for the\n# images' Python 3.11." in constraints.OUT.read_text()


def test_every_requirement_of_the_images_is_pinned_within_pyproject():
    pinned = constraints.pins()
    for line in constraints.requirements():
        requirement = Requirement(line)
        version = pinned.get(canonicalize_name(requirement.name))
        assert version is not None and requirement.specifier.contains(version), (line, version)
    assert pinned["onnxruntime"] == pinned["onnxruntime-gpu"]  # the CPU image's in place of the GPU image's


def test_a_package_the_venv_lacks_is_named():
    with pytest.raises(SystemExit, match="no-such-package-capsnet is not installed"):
        constraints.closure(["no-such-package-capsnet>=1"])


def test_both_images_and_the_venv_install_with_the_pins():
    dockerfile = (REPO / "Dockerfile").read_text()
    installs = re.findall(r"pip install -r (\S+)(.*)", dockerfile)
    assert sorted(file for file, _ in installs) == ["requirements-demo.txt", "requirements.txt"]
    assert all("-c constraints.txt" in rest for _, rest in installs), installs
    assert re.search(r"^COPY pyproject.toml deploy/constraints.txt \./$", dockerfile, re.MULTILINE)
    assert "!deploy/constraints.txt" in (REPO / ".dockerignore").read_text()
    makefile = (REPO / "Makefile").read_text()
    venv = re.findall(r"pip install -q (?!--upgrade pip)(.*)", makefile)  # all but pip itself
    assert len(venv) >= 4 and all("-c deploy/constraints.txt" in line for line in venv), venv
