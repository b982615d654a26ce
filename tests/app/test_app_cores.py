"""The workers' board (app/cores.py): a request alone on the server runs on every core, and only then: not
while another worker holds a request or held one within QUIET_S, not while its own worker holds another;
a dead worker's slot is taken over and its requests forgotten; the engine and the app use it."""

import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app import __main__ as serving
from app import cores
from app import engine as engine_module
from app import settings as settings_module
from app.engine import Engine
from app.main import create_app
from app.settings import Settings
from model import contract
from tests.harness import MULTIPART, digit_png, multipart


@pytest.fixture
def board_path(tmp_path, monkeypatch):
    """An empty board, named to this process as its parent would name it; this_worker() forgets any other."""
    path = cores.make_board(tmp_path / "cores.board", 2)
    monkeypatch.setenv(cores.BOARD, str(path))
    cores.this_worker.cache_clear()
    yield path
    cores.this_worker.cache_clear()


class Spy:
    """A session that notes its name in `runs` each time it runs."""

    def __init__(self, session, name: str, runs: list[str]):
        self.session, self.name, self.runs = session, name, runs

    def run(self, *args):
        self.runs.append(self.name)
        return self.session.run(*args)


def lone_runs(client) -> float:
    """capsnet_lone_runs_total of mnist, from the app's GET /metrics."""
    found = re.search(r'^capsnet_lone_runs_total\{model="mnist"\} (\S+)$', client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0  # none yet: no sample


def batches(client, batcher: str) -> float:
    """capsnet_batch_size_count of one batcher (its `model` label), from the app's GET /metrics."""
    found = re.search(rf'^capsnet_batch_size_count\{{model="{batcher}"\}} (\S+)$', client.get("/metrics").text, re.M)
    return float(found.group(1)) if found else 0.0


def wait_until_ready(client, seconds: float = 120) -> None:
    """Until the app's GET /ready answers 200 (its models warmed up in the background), at most `seconds`."""
    deadline = time.monotonic() + seconds
    while client.get("/ready").status_code != 200:
        assert time.monotonic() < deadline, client.get("/ready").json()
        time.sleep(0.1)


@pytest.fixture
def two_cores(monkeypatch):
    """Settings see two available cores, whatever this machine has."""
    monkeypatch.setattr(settings_module, "available_cores", lambda: 2)


def test_alone_only_with_one_request_here_and_every_other_worker_quiet(board_path, monkeypatch):
    here, there = cores.Board(board_path), cores.Board(board_path)
    assert here.slot != there.slot
    assert not here.alone()  # no request: nothing to run alone
    with here.request():
        assert here.alone()
        with here.request():  # a second request on the same worker
            assert not here.alone()
        with there.request():  # another worker's request
            assert not here.alone()
        monkeypatch.setattr(cores, "QUIET_S", 60.0)
        assert not here.alone()  # that one ended within QUIET_S: not quiet yet
        monkeypatch.setattr(cores, "QUIET_S", 0.0)
        assert here.alone()
    with there.request():  # the same from the later slot, the other worker's below it
        monkeypatch.setattr(cores, "QUIET_S", 60.0)
        assert not there.alone()
        monkeypatch.setattr(cores, "QUIET_S", 0.0)
        assert there.alone()
        with here.request():
            assert not there.alone()


def test_a_dead_workers_slot_is_taken_and_its_requests_forgotten(board_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    slots = np.memmap(board_path, cores._SLOT, mode="r+")
    slots[0] = (int(dead.stdout), 3, time.monotonic())  # died holding 3 requests
    slots.flush()
    here = cores.Board(board_path)
    assert here.slot == 0
    assert (slots["requests"] == 0).all()
    slots["pid"] = 1  # pid 1 lives: every slot taken
    slots.flush()
    with pytest.raises(RuntimeError, match="no free slot"):
        cores.Board(board_path)
    assert cores.this_worker() is None  # a worker that cannot use the board serves on its share


def test_the_board_has_two_slots_a_worker_and_refuses_a_file_of_another_size(tmp_path, monkeypatch):
    """A slot for each worker and one for its replacement; a file that is not whole slots is no board (the worker
    serves on its share)."""
    path = cores.make_board(tmp_path / "three", 3)
    boards = [cores.Board(path) for _ in range(6)]
    assert [board.slot for board in boards] == list(range(6))
    with pytest.raises(RuntimeError, match="no free slot of 6"):
        cores.Board(path)
    for size in (0, 25):
        (tmp_path / "odd").write_bytes(bytes(size))
        with pytest.raises(RuntimeError, match=f"is {size} bytes, not a whole number of slots"):
            cores.Board(tmp_path / "odd")
    monkeypatch.setenv(cores.BOARD, str(tmp_path / "odd"))
    cores.this_worker.cache_clear()
    try:
        assert cores.this_worker() is None
    finally:
        cores.this_worker.cache_clear()


def test_lone_request_threads(two_cores, monkeypatch):
    assert Settings(workers=2).lone_request_threads == 2  # each session has 1 of the 2 cores
    assert Settings(workers=1).lone_request_threads == 2  # one process: every core, spinning within the run
    assert Settings(workers=2, intra_op_threads=1).lone_request_threads == 0  # threads set: as set
    assert Settings(workers=1, intra_op_spinning=True).lone_request_threads == 0  # its sessions spin already
    assert Settings(workers=3).lone_request_threads == 2
    monkeypatch.setattr(settings_module, "available_cores", lambda: 1)
    assert Settings(workers=2).lone_request_threads == 0  # one core: nothing to take


def test_the_engine_runs_a_lone_image_on_every_core_and_nothing_else(board_path, two_cores, mnist_fixture):
    board = cores.Board(board_path)
    settings = Settings(models=["mnist"], workers=2, providers=["CPUExecutionProvider"])
    engine = Engine("mnist", contract.SHIPPED["mnist"], settings, board=board)
    assert engine.capsnet_wide is not None
    narrow, wide = engine.capsnet.get_session_options(), engine.capsnet_wide.get_session_options()
    assert (narrow.intra_op_num_threads, wide.intra_op_num_threads) == (1, 2)
    assert wide.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert wide.get_session_config_entry("session.force_spinning_stop") == "1"  # not past the run
    # a single image is the wide session's one shape: its memory planned once (the batches' sessions plan none),
    # and its graph folded for it (app/cuda_graph.py's fold: no shape arithmetic left to run)
    assert (narrow.enable_mem_pattern, wide.enable_mem_pattern) == (False, True)
    assert engine.capsnet.get_inputs()[0].shape[0] == contract.BATCH
    assert engine.capsnet_wide.get_inputs()[0].shape == [1, 1, engine.size, engine.size]
    # the lone request's session for the class capsules alone: the same threads, its graph pruned to them
    assert engine.capsnet_lean is not None
    lean = engine.capsnet_lean.get_session_options()
    assert lean.intra_op_num_threads == 2 and lean.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert [o.name for o in engine.capsnet_lean.get_outputs()] == list(contract.CAPSULE_OUTPUTS)
    runs: list[str] = []
    for name in ("capsnet", "capsnet_wide", "capsnet_lean"):
        setattr(engine, name, Spy(getattr(engine, name), name, runs))
    with board.request():  # alone, but warming up: its single images on its own session, the lone ones warmed once
        engine.warm_up()
    assert runs.count("capsnet_wide") == runs.count("capsnet_lean") == 1 and runs[0] == "capsnet"
    runs.clear()
    x = mnist_fixture[0][:2, None].astype(np.float32) / 255
    names = engine.output_names
    with board.request():
        alone = engine._run_capsnet(x[:1], names)
        assert runs == ["capsnet_wide"]
        pair = engine._run_capsnet(x, names)  # two images: a batch, never alone
        assert runs == ["capsnet_wide", "capsnet"]
        capsules = engine._run_capsnet(x[:1], engine.lean_names)
        assert runs[-1] == "capsnet_lean"
        with board.request():
            engine._run_capsnet(x[:1], names)  # a second request here
            assert runs[-1] == "capsnet"
            engine._run_capsnet(x[:1], engine.lean_names)
            assert runs[-1] == "capsnet"
    for one, both in zip(alone, pair, strict=True):  # the same graph, folded: the same outputs, to float error
        np.testing.assert_allclose(one[0], both[0], atol=1e-5)
    for name, lean_output in zip(engine.lean_names, capsules, strict=True):  # the same nodes, pruned of the others
        np.testing.assert_allclose(lean_output, alone[names.index(name)], atol=1e-5)
    assert Engine("mnist", contract.SHIPPED["mnist"], settings).capsnet_wide is None  # no board: no lone runs


def test_a_graph_that_cannot_be_folded_serves_lone_requests_as_it_is(board_path, two_cores, monkeypatch, caplog):
    def refuse(graph, batch):
        raise RuntimeError("no room for the optimised graph")

    monkeypatch.setattr(engine_module, "fold", refuse)
    settings = Settings(models=["mnist"], workers=2, providers=["CPUExecutionProvider"])
    with caplog.at_level("WARNING", logger="app.engine"):
        engine = Engine("mnist", contract.SHIPPED["mnist"], settings, board=cores.Board(board_path))
    assert engine.capsnet_wide is not None and engine.capsnet_wide.get_inputs()[0].shape[0] == contract.BATCH
    assert "runs the graph unfolded: no room for the optimised graph" in caplog.text


def unknown_operator(graph, outputs):
    raise ValueError("an operator onnx does not know")


@pytest.mark.parametrize(
    "pruned, why",
    [(unknown_operator, "an operator onnx does not know"), (lambda graph, outputs: b"not a graph", "INVALID_PROTOBUF")],
    ids=["onnx refuses", "onnx runtime refuses"],
)
def test_a_graph_that_cannot_be_pruned_serves_the_class_capsules_whole(
    pruned, why, board_path, two_cores, monkeypatch, caplog
):
    monkeypatch.setattr(engine_module, "prune", pruned)
    settings = Settings(models=["mnist"], workers=2, providers=["CPUExecutionProvider"])
    board = cores.Board(board_path)
    with caplog.at_level("WARNING", logger="app.engine"):
        engine = Engine("mnist", contract.SHIPPED["mnist"], settings, board=board)
    assert engine.capsnet_wide is not None and engine.capsnet_lean is None
    assert "a lone request for the class capsules runs the whole graph" in caplog.text and why in caplog.text
    engine.warm_up()
    with board.request():
        assert engine._capsnet_runner(False, lean=True)[0] is engine._capsnet_batcher  # no lean batcher
        runs: list[str] = []
        engine.capsnet_wide = Spy(engine.capsnet_wide, "capsnet_wide", runs)
        engine._run_capsnet(np.zeros((1, 1, engine.size, engine.size), np.float32), engine.lean_names)
    assert runs == ["capsnet_wide"]


def test_a_request_for_the_class_capsules_alone_takes_the_lean_batcher_only_while_alone(board_path, two_cores):
    board = cores.Board(board_path)
    settings = Settings(models=["mnist"], workers=2, providers=["CPUExecutionProvider"])
    engine = Engine("mnist", contract.SHIPPED["mnist"], settings, board=board)
    plain, lean = engine._capsnet_batcher, engine._lean_batcher
    assert lean is not None and lean is not plain
    with board.request():
        assert engine._capsnet_runner(False, lean=True) == (lean, engine.lean_names)
        assert engine._capsnet_runner(False) == (plain, engine.output_names)  # the whole answer
        with board.request():  # under load: one batcher, whose batches hold every request
            assert engine._capsnet_runner(False, lean=True) == (plain, engine.output_names)


def test_a_lone_predict_runs_on_every_core(board_path, two_cores):
    """The app counts its request on the board (BoardMiddleware), so its engine runs it alone; only the default
    model has the lone requests' sessions (another model's would cost a worker 50 MB for an fp32 graph)."""
    settings = Settings(models=["mnist", "fashion-mnist"], workers=2, providers=["CPUExecutionProvider"])
    app = create_app(settings)
    with TestClient(app) as client:
        wait_until_ready(client)
        engines = app.state.engines
        assert engines["mnist"].capsnet_wide is not None and engines["fashion-mnist"].capsnet_wide is None
        before = lone_runs(client)
        runs: list[str] = []
        for name in ("capsnet", "capsnet_wide", "capsnet_lean"):
            setattr(engines["mnist"], name, Spy(getattr(engines["mnist"], name), name, runs))
        for include in ("", "capsules", "input,capsules", "capsules,routing"):
            answer = client.post(
                f"/predict?include={include}", content=multipart(digit_png()), headers={"Content-Type": MULTIPART}
            )
            assert answer.status_code == 200
        assert lone_runs(client) - before == 4
        # the class capsules alone, or with the input (the prepared image): the lean one
        assert runs == ["capsnet_lean", "capsnet_lean", "capsnet_lean", "capsnet_wide"]
        runs.clear()
        lean_batches = batches(client, "mnist_lean")
        answer = client.post(
            "/explain?transform=shear&steps=5&include=", files={"file": ("digit.png", digit_png(), "image/png")}
        )
        assert answer.status_code == 200
        assert runs == ["capsnet_lean", "capsnet"]  # its image alone, then its sweep: a batch, on the worker's own
        # the sweep through the model's batcher: a batch of several on the lean one would keep its next lone
        # request waiting max_wait for company (app/batcher.py's wait under load)
        assert batches(client, "mnist_lean") - lean_batches == 1
        board = cores.this_worker()
        assert board is not None and board._requests[board.slot] == 0  # every request counted out


def affinity(tid: int) -> set[int]:
    return set(os.sched_getaffinity(tid))


@pytest.fixture
def two_or_more_cores():
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: a worker's threads have no other core to leave")
    if not cores.Home(0).pins:
        pytest.skip("a CPU quota below the affinity: Home pins nothing here")


def test_homes_differ_between_slots(two_or_more_cores):
    here, there = cores.Home(0), cores.Home(1)
    assert len(here.home) == len(there.home) == 1 and here.home != there.home
    assert here.home <= here.cores and cores.Home(len(here.cores)).home == here.home  # more workers than cores


def test_home_pins_the_kept_threads_when_alone_and_lets_every_thread_go_under_load(two_or_more_cores):
    every = affinity(0)
    home = cores.Home(1)
    stop, started, born = threading.Event(), threading.Event(), []

    def serve():  # a batching thread: waits, and starts a thread of its own while pinned
        started.wait()
        child = threading.Thread(target=stop.wait)
        child.start()
        born.append(child)
        stop.wait()

    server = threading.Thread(target=serve)
    server.start()
    try:
        home.settle(True)  # nothing kept yet: nothing to pin
        assert not home.pinned and affinity(server.native_id) == every
        home.keep([server.native_id])
        home.settle(True)
        assert home.pinned and affinity(server.native_id) == set(home.home)
        assert affinity(0) == every  # a thread not kept stays free
        started.set()
        while not born or born[0].native_id is None:
            time.sleep(0.01)
        assert affinity(born[0].native_id) == set(home.home)  # started while pinned: inherits the home
        home.settle(True)  # no change
        home.settle(False)
        assert not home.pinned
        assert affinity(server.native_id) == affinity(born[0].native_id) == every
    finally:
        stop.set()
        server.join()
        born[0].join()


def test_a_lone_request_keeps_the_serving_threads_home_and_load_lets_them_go(board_path, two_cores, two_or_more_cores):
    """BoardMiddleware settles the worker's threads as each request begins: the event loop's and the batchers'
    on the home core while the request is alone on the server, on every core once another worker holds one."""
    settings = Settings(models=["mnist"], workers=2, providers=["CPUExecutionProvider"])
    app = create_app(settings)
    every = affinity(0)
    with TestClient(app) as client:
        wait_until_ready(client)
        home = app.state.home
        assert len(home.threads) == 1 + 4  # the event loop's, and mnist's batchers: capsnet, iterations, lean, decoder
        assert home.threads[0] != threading.get_native_id()  # the test client's event loop runs on a thread of its own

        def predict():
            answer = client.post(
                "/predict?include=", content=multipart(digit_png()), headers={"Content-Type": MULTIPART}
            )
            assert answer.status_code == 200

        predict()
        assert home.pinned and all(affinity(tid) == set(home.home) for tid in home.threads)
        with cores.Board(board_path).request():  # another worker holds a request
            predict()
        assert not home.pinned and all(affinity(tid) == every for tid in home.threads)


def test_home_pins_nothing_under_a_cpu_quota_below_the_affinity(two_or_more_cores, monkeypatch):
    monkeypatch.setattr(cores, "available_cores", lambda: 1)  # `docker run --cpus 1` on this machine's cores
    home = cores.Home(0)
    home.keep([threading.get_native_id()])
    home.settle(True)
    assert not home.pinned and affinity(0) == set(home.cores)


def test_home_stops_pinning_when_the_kernel_refuses(two_or_more_cores, monkeypatch, caplog):
    def refuse(tid, cores):
        raise OSError(22, "Invalid argument")

    home = cores.Home(0)
    home.keep([threading.get_native_id()])
    monkeypatch.setattr(cores.os, "sched_setaffinity", refuse)
    home.settle(True)  # a request is answered all the same
    assert not home.pins and not home.pinned and "stops pinning" in caplog.text


@pytest.mark.parametrize("temporary", ["writable", "none"])
def test_one_worker_serves_with_a_board_of_its_own_or_without_one(monkeypatch, caplog, tmp_path, temporary):
    """`python -m app` with one worker maps a board for its requests and removes its file before it serves (so
    that a signal that ends it leaves nothing behind); with no writable temporary folder it serves without one,
    and says so."""
    served = []

    def run(app, **_):  # uvicorn.run: what the worker would serve with
        served.append((app.state.home is not None, cores.this_worker(), os.environ.get(cores.BOARD)))

    def unwritable(**_):
        raise PermissionError(13, "Permission denied", "/tmp")

    temporary_directory = serving.tempfile.TemporaryDirectory

    def folder(**options):
        return temporary_directory(**options, dir=tmp_path)

    monkeypatch.setattr(serving.tempfile, "TemporaryDirectory", unwritable if temporary == "none" else folder)
    monkeypatch.setattr(serving.uvicorn, "run", run)
    monkeypatch.delenv(cores.BOARD, raising=False)
    cores.this_worker.cache_clear()
    try:
        serving.serve_one(Settings(models=["mnist"], workers=1, providers=["CPUExecutionProvider"]))
    finally:
        cores.this_worker.cache_clear()
    [(home, board, named)] = served
    assert named is None and cores.BOARD not in os.environ and not list(tmp_path.iterdir())  # no file left
    if temporary == "none":
        assert not home and board is None and "no board for this worker's requests" in caplog.text
    else:
        assert home and board is not None
        with board.request():  # its map outlives its file
            assert board.alone()
