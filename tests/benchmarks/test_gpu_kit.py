"""benchmarks.gpu_kit: a kit packed here, carried one load a call, gathered and installed as on the GPU
machine (offline: a wheel made here stands in for the downloaded ones)."""

import importlib.metadata
import json
import shutil
import zipfile
from pathlib import Path

import pytest

from benchmarks import gpu_kit
from model import contract


def tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel of one module, `kitdemo`, that pip installs without an index."""
    files = {
        "kitdemo/__init__.py": "ANSWER = 42\n",
        "kitdemo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: kitdemo\nVersion: 1.0\n",
        "kitdemo-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "kitdemo-1.0.dist-info/RECORD,,\n"
    wheel = folder / "kitdemo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in {**files, "kitdemo-1.0.dist-info/RECORD": record}.items():
            z.writestr(name, text)
    return wheel


@pytest.fixture
def packed(tmp_path, monkeypatch) -> list[Path]:
    """A kit in loads of 8 MiB (the model's 30 MB make several), its wheel made here, hey a script."""
    made = tmp_path / "made"
    made.mkdir()
    hey = made / "hey"
    hey.write_text("#!/bin/sh\necho hey\n")
    monkeypatch.setattr(gpu_kit, "download_wheels", lambda dest, python: [tiny_wheel(made)])
    monkeypatch.setattr(gpu_kit.shutil, "which", lambda name: str(hey))
    return gpu_kit.pack(tmp_path / "gpu-kit", load_mib=8)


def carry(load: Path, call: Path) -> Path:
    """A call's working tree holding this load alone, as the device tool copies it."""
    shutil.rmtree(call, ignore_errors=True)
    shutil.copytree(load, call / "gpu-kit" / load.name)
    return call / "gpu-kit"


def test_loads_carried_one_a_call_install_the_kit(packed, tmp_path):
    parts = [(load / f"part-{k}").stat().st_size for k, load in enumerate(packed, start=1)]
    model = sum((contract.SHIPPED["mnist"] / name).stat().st_size for name in gpu_kit.MODEL_FILES)
    assert sum(parts) > model and set(parts[:-1]) == {8 * 2**20} and 0 < parts[-1] <= 8 * 2**20
    kit = tmp_path / "kit"
    for k, load in enumerate(packed, start=1):
        assert gpu_kit.gather(carry(load, tmp_path / "call"), kit) == list(range(1, k + 1))
    repo = tmp_path / "repo"
    assert gpu_kit.install(kit, repo) == "CPUExecutionProvider"  # no CUDA device here: as the engine falls back
    assert (kit / "site" / "kitdemo" / "__init__.py").read_text() == "ANSWER = 42\n"
    assert (kit / "bin" / "hey").stat().st_mode & 0o111
    for name in gpu_kit.MODEL_FILES:
        assert (repo / "models" / "mnist" / name).read_bytes() == (contract.SHIPPED["mnist"] / name).read_bytes()


def test_a_missing_or_damaged_part_is_named_before_anything_installs(packed, tmp_path):
    kit = tmp_path / "kit"
    with pytest.raises(SystemExit, match="no load is in"):
        gpu_kit.gather(tmp_path / "empty", kit)
    with pytest.raises(SystemExit, match="nothing is gathered in"):
        gpu_kit.install(kit, tmp_path / "repo")
    for load in packed[:-1]:
        gpu_kit.gather(carry(load, tmp_path / "call"), kit)
    last = len(packed)
    with pytest.raises(SystemExit, match=rf"parts \[{last}\] of {last} are not in"):
        gpu_kit.install(kit, tmp_path / "repo")
    gpu_kit.gather(carry(packed[-1], tmp_path / "call"), kit)
    part = kit / "part-1"
    part.write_bytes(part.read_bytes()[:-1] + b"\0")
    with pytest.raises(SystemExit, match="sha256 differs"):
        gpu_kit.install(kit, tmp_path / "repo")
    assert not (kit / "site").exists() and not (tmp_path / "repo").exists()


def test_the_kit_wants_the_serve_extra_at_the_versions_tested_here(packed):
    pinned = gpu_kit.serve_requirements()
    assert "onnxruntime-gpu==" + importlib.metadata.version("onnxruntime-gpu") in pinned
    assert any(r.startswith("uvicorn[standard]==") for r in pinned)
    assert "python-multipart==" + importlib.metadata.version("python-multipart") in pinned  # the template's forms
    assert all("==" in r for r in pinned)
    manifest = json.loads((packed[0] / gpu_kit.MANIFEST).read_text())
    assert manifest["parts"] == len(packed) and manifest["wheels"] == ["kitdemo-1.0-py3-none-any.whl"]


def test_the_machines_cuda_libraries_are_linked_beside_the_kits_onnxruntime(tmp_path, monkeypatch):
    """onnxruntime.preload_dlls looks for CUDA and cuDNN in the `nvidia` packages beside onnxruntime: the
    machine's (PyTorch's) are linked into the kit's site, once."""
    machine = tmp_path / "machine-site"
    (machine / "nvidia" / "cudnn" / "lib").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(machine))
    site = tmp_path / "kit" / "site"
    site.mkdir(parents=True)
    gpu_kit.link_cuda_libraries(site)
    gpu_kit.link_cuda_libraries(site)  # a second install keeps the link
    assert (site / "nvidia").resolve() == (machine / "nvidia").resolve() and (
        site / "nvidia" / "cudnn" / "lib"
    ).is_dir()
