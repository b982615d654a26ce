"""Start-up: settings fail loudly, /ready is 503 until warm-up, app/ never loads torch."""

import gc
import logging
import subprocess
import sys
import warnings

import cv2
import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app import engine as engine_module
from app import settings as settings_module
from app.engine import Engine, Engines
from app.main import create_app
from app.settings import Settings
from model import contract
from tests.harness import digit_png


def mnist_engine(settings: Settings) -> Engine:
    return Engine("mnist", contract.SHIPPED["mnist"], settings)


def test_ready_is_503_until_every_model_is_warm_and_says_which(settings, mnist_fixture):
    """/ready waits for every configured model; /models and ?model= say each one's readiness."""
    engines = Engines(settings.model_copy(update={"models": ["mnist", "multimnist"]}))  # loaded, not warmed up
    app = create_app(settings)
    app.state.engines = engines
    client = TestClient(app)  # no lifespan: these engines are the app's
    r = client.get("/ready")
    assert r.status_code == 503 and "mnist: loaded, not warmed up" in r.json()["detail"]
    assert r.headers["Retry-After"] == "1"  # a client or a balancer may ask again soon
    assert client.get("/health").status_code == 200
    assert client.head("/ready").status_code == 503 and client.head("/health").status_code == 200  # a probe's HEAD
    engines["mnist"].warm_up()
    r = client.get("/ready")
    assert r.status_code == 503 and r.json()["detail"] == "not ready: multimnist: loaded, not warmed up"
    assert {m["name"]: m["ready"] for m in client.get("/models").json()["models"]} == {
        "mnist": True,
        "multimnist": False,
    }
    r = client.get("/model", params={"model": "multimnist"})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    r = client.post("/predict", params={"model": "multimnist"}, files={"file": ("d.png", digit_png())})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1" and "multimnist is not ready" in r.json()["detail"]
    r = client.get("/v2/models/multimnist/ready")
    assert r.status_code == 503 and r.headers["Retry-After"] == "1" and "not ready" in r.json()["error"]
    engines["multimnist"].warm_up()
    assert client.get("/ready").json() == {
        "status": "ready",
        "providers": ["CPUExecutionProvider"],
        "precision": engines["mnist"].precision,
        "models": ["mnist", "multimnist"],
    }
    head = client.head("/ready")
    assert head.status_code == 200 and not head.content


def test_the_lifespan_keeps_opencv_on_one_thread(settings):
    """The preprocessing's pictures are prepared on the thread that holds them: a second OpenCV thread
    waits for a core that another worker, ONNX Runtime or the event loop holds."""
    cv2.setNumThreads(2)
    with TestClient(create_app(settings.model_copy(update={"models": ["mnist"]}))):
        assert cv2.getNumThreads() == 1


def test_the_lifespan_turns_pillows_warnings_off(settings):
    """Pillow's warnings about a client's file stay out of the server's log (app/main.py's quiet_pillow)."""

    def pillow_ignored() -> bool:
        return any(
            action == "ignore" and module is not None and module.match("PIL.TiffImagePlugin")
            for action, _, _, module, _ in warnings.filters
        )

    with warnings.catch_warnings():
        warnings.resetwarnings()
        assert not pillow_ignored()
        with TestClient(create_app(settings.model_copy(update={"models": ["mnist"]}))):
            assert pillow_ignored()


def test_the_lifespan_takes_what_a_worker_holds_out_of_the_garbage_collector(settings):
    """A started worker's objects (app, sessions, libraries) are frozen, so the collections that requests set
    off walk only their own objects; at its end they are unfrozen, for an app started again in the process."""
    gc.unfreeze()
    with TestClient(create_app(settings.model_copy(update={"models": ["mnist"]}))) as client:
        young = gc.get_objects()  # the frozen are left out
        assert not any(o is client.app.state.engines or o is client.app for o in young)
        assert len(young) < gc.get_freeze_count() / 10
        assert client.get("/health").status_code == 200
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("explicit", [True, False])
def test_cuda_without_a_usable_device_is_left_out_with_one_line(settings, monkeypatch, caplog, explicit):
    """No CUDA device: CUDA is not handed to onnxruntime at all; one WARNING when the settings asked
    for it, one INFO line when it came from the defaults, never an ERROR."""
    monkeypatch.setattr(engine_module, "cuda_devices", lambda: 0)
    asked = settings.model_copy(update={"providers": ["CUDAExecutionProvider", "CPUExecutionProvider"]})
    if not explicit:
        asked = Settings(models=["mnist"], intra_op_threads=1)  # the default providers
    with caplog.at_level("INFO", logger="app.engine"):
        engine = mnist_engine(asked)
    assert engine.providers == ["CPUExecutionProvider"]
    about_cuda = [r for r in caplog.records if "CUDA" in r.getMessage()]
    assert len(about_cuda) == 1 and "no usable CUDA device" in about_cuda[0].getMessage()
    assert about_cuda[0].levelname == ("WARNING" if explicit else "INFO")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def start_up_output(settings: str) -> str:
    """What loading every model on `settings` (a Settings(...) call) prints, in a fresh process."""
    code = (
        "import logging; logging.basicConfig(level='INFO'); from app.engine import Engines; "
        f"from app.settings import Settings; Engines({settings})"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=contract.SHIPPED["mnist"].parent
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def test_start_up_without_a_gpu_prints_no_error_or_warning_line():
    """Without a GPU, onnxruntime's CUDA loader has nothing to say (CUDA is not asked for), and on the CPU
    its graph optimiser's warnings (e.g. of a CastLike node it cannot fold) show only with
    CAPSNET_LOG_LEVEL=debug."""
    if engine_module.cuda_devices():
        pytest.skip("this host has a CUDA device")
    output = start_up_output("Settings(intra_op_threads=1)")
    assert "ERROR" not in output and "[E:" not in output and "Failed to load" not in output, output
    assert "[W:onnxruntime" not in output, output
    assert "execution providers in use: ['CPUExecutionProvider']" in output
    for level, severity in (("info", 3), ("debug", 2)):  # ONNX Runtime's errors only, or its warnings too
        engine = mnist_engine(Settings(models=["mnist"], intra_op_threads=1, log_level=level))
        assert engine.capsnet.get_session_options().log_severity_level == severity, level


def test_no_runnable_provider_is_refused_with_a_reason(monkeypatch):
    monkeypatch.setattr(engine_module, "cuda_devices", lambda: 0)
    with pytest.raises(RuntimeError, match="can run here"):
        engine_module.select_providers(["CUDAExecutionProvider"])


def test_env_settings(monkeypatch):
    monkeypatch.setenv("CAPSNET_PROVIDERS", "CPUExecutionProvider")
    monkeypatch.setenv("CAPSNET_CORS_ORIGINS", '["http://localhost:7860"]')
    monkeypatch.setenv("CAPSNET_MAX_BATCH", "8")
    s = Settings()
    assert s.providers == ["CPUExecutionProvider"] and s.cors_origins == ["http://localhost:7860"]
    assert s.max_batch == 8 and s.default_model == "mnist"
    assert s.model_dirs == dict(contract.SHIPPED)  # all, by default
    monkeypatch.setenv("CAPSNET_MODELS", f"multimnist, mine={contract.SHIPPED['mnist']}")
    s = Settings()
    assert s.model_dirs == {"multimnist": contract.SHIPPED["multimnist"], "mine": contract.SHIPPED["mnist"]}
    assert s.default_model == "multimnist"  # mnist is not served: the first one


def test_workers_default_to_the_cores_and_divide_the_threads(monkeypatch, tmp_path):
    """CAPSNET_WORKERS defaults to one worker per available core (a cgroup quota caps them, and so does
    MAX_WORKERS); without CAPSNET_INTRA_OP_THREADS each worker's sessions get the cores divided between the
    workers, and one worker keeps ONNX Runtime's own default."""
    monkeypatch.delenv("CAPSNET_WORKERS", raising=False)
    monkeypatch.setattr(settings_module, "cuda_devices", lambda: 0)  # the CPU's default, on any host
    monkeypatch.setattr(settings_module.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(settings_module, "CGROUP_CPU_MAX", tmp_path / "none")
    assert settings_module.available_cores() == Settings().workers == 16
    assert Settings(workers=4).session_threads == 4
    (tmp_path / "cpu.max").write_text("250000 100000\n")  # docker run --cpus 2.5
    monkeypatch.setattr(settings_module, "CGROUP_CPU_MAX", tmp_path / "cpu.max")
    assert settings_module.available_cores() == Settings().workers == 3
    assert Settings(workers=3).session_threads == 1 and Settings(workers=1).session_threads == 0
    assert Settings(workers=3, intra_op_threads=4).session_threads == 4
    monkeypatch.setattr(settings_module.os, "sched_getaffinity", lambda pid: set(range(384)))  # two 192-core CPUs
    monkeypatch.setattr(settings_module, "CGROUP_CPU_MAX", tmp_path / "none")
    assert Settings().workers == settings_module.MAX_WORKERS
    monkeypatch.setenv("CAPSNET_WORKERS", "0")
    with pytest.raises(ValidationError, match="workers"):
        Settings()


def test_workers_on_a_gpu_default_to_four_at_most(monkeypatch, tmp_path):
    """Where the workers will run on CUDA (asked for, in this onnxruntime build, a device usable) they default to
    one per core up to GPU_WORKERS, who take turns on the GPU; anything else keeps a worker per core, and
    CAPSNET_WORKERS still sets any number."""
    monkeypatch.delenv("CAPSNET_WORKERS", raising=False)
    monkeypatch.setattr(settings_module.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(settings_module, "CGROUP_CPU_MAX", tmp_path / "none")
    monkeypatch.setattr(settings_module, "cuda_devices", lambda: 1)
    cuda_build = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(settings_module.ort, "get_available_providers", lambda: cuda_build)
    assert settings_module.GPU_WORKERS == 4
    assert Settings().workers == 4
    assert Settings(providers=["CPUExecutionProvider"]).workers == 16  # CUDA not asked for
    monkeypatch.setenv("CAPSNET_WORKERS", "8")
    assert Settings().workers == 8
    monkeypatch.delenv("CAPSNET_WORKERS")
    monkeypatch.setattr(settings_module.os, "sched_getaffinity", lambda pid: {0, 1})
    assert Settings().workers == 2  # fewer cores than GPU_WORKERS: a worker per core
    monkeypatch.setattr(settings_module.os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(settings_module, "cuda_devices", lambda: 0)  # no driver or no GPU
    assert Settings().workers == 16
    monkeypatch.setattr(settings_module, "cuda_devices", lambda: 1)
    monkeypatch.setattr(settings_module.ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert Settings().workers == 16  # a CPU-only onnxruntime


@pytest.mark.parametrize(
    "bad, why",
    [
        ({"providers": ["CUDAExecutionProvidr"]}, "unknown execution provider"),
        ({"providers": []}, "at least one"),
        ({"max_batch": 0}, "greater than"),
        ({"max_wait_ms": -1}, "greater than"),
        ({"log_level": "loud"}, "log_level"),
        ({"port": 0}, "greater than"),
        ({"models": ["mnist=/nonexistent"]}, "model mnist: /nonexistent has no"),
        ({"models": ["nope"]}, "no shipped model is called 'nope'"),
        ({"models": []}, "at least one model"),
        ({"models": ["mnist", "mnist"]}, "twice"),
        ({"models": ["mnist"], "default_model": "affine"}, "not among"),
        ({"models": ["a/b=/tmp"]}, "must be letters"),
    ],
)
def test_bad_settings_fail_loudly(bad, why):
    with pytest.raises(ValidationError, match=why):
        Settings(**bad)


def test_cors_only_for_configured_origins(settings):
    allowed = "http://localhost:7860"
    client = TestClient(create_app(settings.model_copy(update={"cors_origins": [allowed]})))
    preflight = {"Access-Control-Request-Method": "POST"}
    assert (
        client.options("/predict", headers={"Origin": allowed, **preflight}).headers["access-control-allow-origin"]
        == allowed
    )
    assert (
        "access-control-allow-origin"
        not in TestClient(create_app(settings)).get("/health", headers={"Origin": allowed}).headers
    )


def test_app_never_imports_torch():
    code = "import sys, app.main, app.__main__; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=contract.SHIPPED["mnist"].parent)


@pytest.mark.parametrize(
    "break_it, why, workers",
    [
        ("garbage", "INVALID_PROTOBUF", 1),  # capsnet.onnx is not an ONNX file: loading fails
        ("graph", "capsnet's image is ['N', 1, 36, 36], the card says ['N', 1, 28, 28]", 1),  # 36x36 graph, 28x28 card
        ("card", "has no `serving` section", 1),  # a card from before cards described their model
        ("graph", "capsnet's image is ['N', 1, 36, 36], the card says ['N', 1, 28, 28]", 2),  # the parent's check
    ],
)
def test_a_model_that_cannot_serve_ends_the_process_with_one_line_naming_it(tmp_path, break_it, why, workers):
    """python -m app exits non-zero and names the broken model in one line (a process that is alive
    but never ready is what an orchestrator cannot handle); with several workers the parent checks the
    models before it starts any."""
    import json
    import shutil

    for name in (contract.CAPSNET_ONNX, contract.DECODER_ONNX, contract.MODEL_CARD):
        shutil.copy(contract.SHIPPED["mnist"] / name, tmp_path / name)
    if break_it == "garbage":
        (tmp_path / contract.CAPSNET_ONNX).write_bytes(b"not a model")
    elif break_it == "graph":
        shutil.copy(contract.SHIPPED["multimnist"] / contract.CAPSNET_ONNX, tmp_path / contract.CAPSNET_ONNX)
    else:
        card = json.loads((tmp_path / contract.MODEL_CARD).read_text())
        del card[contract.SERVING]
        (tmp_path / contract.MODEL_CARD).write_text(json.dumps(card))
    env = {
        "CAPSNET_MODELS": f"mnist,broken={tmp_path}",
        "CAPSNET_PROVIDERS": "CPUExecutionProvider",
        "CAPSNET_PORT": "1",
        "CAPSNET_WORKERS": str(workers),
        "PATH": "/usr/bin:/bin",
    }  # never reached: it must stop before serving
    proc = subprocess.run(
        [sys.executable, "-m", "app"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=contract.SHIPPED["mnist"].parent,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"cannot serve model broken ({tmp_path}): ") and why in last, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("setting, graph", [("fp32", contract.CAPSNET_ONNX), ("int8", contract.CAPSNET_INT8_ONNX)])
def test_precision_picks_the_graph_that_answers(settings, mnist_fixture, setting, graph):
    """CAPSNET_PRECISION names the graph: the engine's outputs are that graph's, its version that file's."""
    import onnxruntime as ort

    from training.graphs import sha256

    engine = mnist_engine(settings.model_copy(update={"precision": setting}))
    x = mnist_fixture[0][:8, None].astype(np.float32) / 255
    (want,) = ort.InferenceSession(str(contract.SHIPPED["mnist"] / graph), providers=["CPUExecutionProvider"]).run(
        [contract.LENGTHS], {contract.IMAGE: x}
    )
    (got,) = engine.capsnet.run([contract.LENGTHS], {contract.IMAGE: x})
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert engine.precision == setting and engine.version == sha256(contract.SHIPPED["mnist"] / graph)[:12]


@pytest.mark.parametrize(
    "on_cpu, shipped, present, want",
    [(True, True, True, "int8"), (True, False, True, "fp32"), (False, True, True, "fp32"), (True, True, False, "fp32")],
)
def test_auto_precision_is_int8_only_on_a_cpu_where_the_card_ships_it(on_cpu, shipped, present, want):
    assert engine_module.choose_precision("auto", {"int8": {"shipped": shipped}}, on_cpu, present) == want
    assert engine_module.choose_precision("auto", {}, on_cpu, present) == "fp32"  # an older card
    assert engine_module.choose_precision("fp32", {"int8": {"shipped": True}}, on_cpu, present) == "fp32"


def test_int8_without_its_graph_stops_start_up_with_a_sentence(tmp_path):
    for name in (contract.CAPSNET_ONNX, contract.DECODER_ONNX, contract.MODEL_CARD):
        (tmp_path / name).write_bytes((contract.SHIPPED["mnist"] / name).read_bytes())
    with pytest.raises(ValidationError, match=r"precision int8 needs .*python -m training\.quantize"):
        Settings(models=[f"mine={tmp_path}"], precision="int8")
