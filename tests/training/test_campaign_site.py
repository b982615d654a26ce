"""What the GPU machine lacks, carried in the pack (training/campaign/site.py): the campaign's commands import
nothing there but the machine's own packages and what the pack carries; a wheel unpacked into the site imports
from PYTHONPATH; the pack puts the site first in load-1, within the load's budget."""

import json
import os
import subprocess
import sys
import zipfile

from training.campaign import pack, site
from training.campaign.pack import SITE

# every command a GPU call runs: python3 -m training.campaign launch/status/collect, and each run's process
GPU_SIDE = ("training.campaign.__main__", "training.campaign.runs")
THIRD_PARTY = """
import importlib, sys, sysconfig
for name in sys.argv[1:]:
    importlib.import_module(name)
roots = (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"])
print(" ".join(sorted({m.split(".")[0] for m, mod in list(sys.modules.items())
                        if str(getattr(mod, "__file__", "")).startswith(roots) and not m.startswith("_")})))
"""


def test_the_gpu_side_imports_only_the_machines_packages_and_the_carried_ones():
    found = subprocess.run(
        [sys.executable, "-c", THIRD_PARTY, *GPU_SIDE], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "torch" in found and "pydantic" in found  # the check sees what the commands import
    unknown = set(found) - site.MACHINE_MODULES - site.CARRIED_MODULES
    assert not unknown, f"the GPU machine has none of {sorted(unknown)}: carry them (site.REQUIREMENTS)"


def fake_wheel(tmp_path):
    wheel = tmp_path / "fakepkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("fakepkg/__init__.py", "VALUE = 41 + 1\n")
        archive.writestr("fakepkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fakepkg\nVersion: 1.0\n")
    return wheel


def test_an_unpacked_wheel_imports_from_pythonpath(tmp_path):
    dest = site.unpack([fake_wheel(tmp_path)], tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": str(dest)}
    out = subprocess.run([sys.executable, "-c", "import fakepkg; print(fakepkg.VALUE)"], env=env, capture_output=True)
    assert out.stdout.strip() == b"42"


def test_the_pack_puts_the_site_first_in_load_1_within_its_budget(data_dirs, tmp_path):
    def build(dest):
        return site.unpack([fake_wheel(tmp_path)], dest)

    loads = pack.pack(tmp_path / "pack", data_dirs, names=["multimnist"], load_mib=30, build_site=build, log=print)
    manifest = json.loads((loads[0] / pack.MANIFEST).read_text())
    assert manifest["loads"]["load-1"]["items"][0] == SITE
    assert (loads[0] / SITE / "fakepkg" / "__init__.py").is_file()
    assert all(pack.size(d) <= 30 * 2**20 for d in loads)
