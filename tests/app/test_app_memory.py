"""What a worker holds (app/memory.py): runs in slices answer as one run would, the slices' sizes, and a
worker with every shipped model holds under 475 MB of its own once it has run full batches of each."""

import asyncio
import json
import subprocess
import sys

import numpy as np

from app import cores, memory
from model import contract

# A worker's own memory: its anonymous resident pages (RssAnon). Its resident library pages (RssFile: 60 MB
# in one venv, 79 in another of the same packages) are page cache that every worker shares.
OWN_LIMIT_MB = 475
WORKER = """
import asyncio, json, numpy as np
import app.main  # what a worker imports
from app.engine import Engines
from app.settings import get_settings
engines = Engines(get_settings())
engines.warm_up()  # as a worker does before it accepts
engines.start()
for n in (1, 5, 64, 64):
    for engine in engines:
        x = np.random.default_rng(n).random((n, 1, engine.size, engine.size), np.float32)
        asyncio.run(engine.infer(engine.capsnet, x, engine.output_names))
        if n <= 5:  # the demo's requests for every routing iteration come an image at a time
            asyncio.run(engine.infer(engine.capsnet, x, engine.every_output))
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
print(json.dumps({key: int(status[key].split()[0]) / 1024 for key in ("RssAnon", "VmRSS")}))
"""


def test_slices_answer_as_one_run(engine, mnist_fixture):
    x = mnist_fixture[0][:70, None].astype(np.float32) / 255  # 4 x 16 + 6 rows
    want = engine.capsnet.run(engine.every_output, {contract.IMAGE: x})
    got = asyncio.run(engine.infer(engine.capsnet, x, engine.every_output))  # the iterations sliced too
    assert engine.run_rows == 16
    for name, expected in zip(engine.every_output, want, strict=True):
        np.testing.assert_allclose(got[name], expected, atol=1e-6, err_msg=name)
    outputs = memory.in_slices(lambda y: [y * 2, y[:, 0]], x, 7)
    np.testing.assert_array_equal(outputs[0], x * 2)
    np.testing.assert_array_equal(outputs[1], x[:, 0])


def test_a_run_holds_the_votes_of_16_mnist_images(engines):
    rows = {engine.name: engine.run_rows for engine in engines}
    assert rows == {"mnist": 16, "fashion-mnist": 16, "multimnist": 5, "affine": 4}


def test_a_worker_with_every_model_holds_under_475_mb_of_its_own(tmp_path):
    """One of two workers, as `python -m app` starts them on two cores or more: on the board (app/cores.py),
    so it holds its default model's two sessions for lone requests too (452 MB here, 427 without the lean one)."""
    env = {
        "CAPSNET_PROVIDERS": "CPUExecutionProvider",
        "CAPSNET_LOG_LEVEL": "warning",
        "CAPSNET_WORKERS": "2",
        cores.BOARD: str(cores.make_board(tmp_path / "cores.board", 2)),
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        [sys.executable, "-c", WORKER],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=contract.MODELS_DIR.parent,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    held = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"a worker with every model: {held['RssAnon']:.0f} MB of its own, {held['VmRSS']:.0f} MB resident")
    assert held["RssAnon"] < OWN_LIMIT_MB, f"a worker with every model holds {held['RssAnon']:.0f} MB of its own"
