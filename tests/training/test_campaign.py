"""The GPU campaign, proven on the CPU: the whole cycle (pack -> launch -> status -> collect -> ship) on the
fixtures with tiny budgets, one run of each kind and model of the plan; and the parts it relies on."""

import json
import math
import time

import pytest
import torch
import torch.nn as nn

from model.capsnet import CapsNet, CapsNetConfig
from training import data, pairs
from training.baselines import PairCNN, PaperCNN, num_params
from training.campaign import collect, ledger, pack, plan, supervisor
from training.campaign.__main__ import preflight
from training.config import TrainConfig
from training.fit import fit
from training.train import ShiftedDigits, load_splits

# one run per code path of runs.py: each kind, each affine model, a started and a fresh run, a started run with a
# loss setting of its own, EM routing
PREFLIGHT = [
    "multimnist",
    "multimnist-recon",
    "multimnist-cnn",
    "mnist-flagship",
    "affine-capsnet-s0",
    "affine-paper-cnn-s0",
    "affine-pooled-cnn-s0",
    "mnist-paper-s0",
    "fashion",
    "em",
]


def test_preflight_runs_the_whole_cycle_on_the_cpu(data_dirs, tmp_path):
    """Every kind of run trains, tests and writes its result as its own detached process; collect brings the
    weights of the runs that can ship in parts under the call's limits; ship exports them, measures them
    beside the shipped graphs and records every run in the ledger."""
    lines = []
    decisions = preflight(data_dirs, tmp_path, names=PREFLIGHT, log=lines.append)
    assert set(decisions) == {s.name for s in plan.by_name(PREFLIGHT) if s.ships}
    for decision in decisions.values():
        assert 0 <= decision["candidate"] <= 100 and 0 <= decision["shipped"] <= 100
        assert decision["replaced"] == (
            decision["candidate"] > decision["shipped"] and not decision.get("robustness_fell")
        )
    for name in PREFLIGHT:
        result = json.loads((tmp_path / "work" / name / "result.json").read_text())
        assert result["epochs_run"] == 2 and result["images_seen"] > 0 and result["test"]
    pairs = json.loads((tmp_path / "work" / "multimnist" / "result.json").read_text())
    started = pairs["started_from"]
    assert started["model"] == "multimnist" and len(started["version"]) == 12
    assert {"test_error", "train_error"} <= set(pairs["test"]) and 0 <= pairs["test"]["train_error"] <= 100
    out = tmp_path / "out-1"
    files = list(out.iterdir())
    assert len(files) <= collect.MAX_FILES and sum(f.stat().st_size for f in files) <= 64 * 2**20
    assert all(f.stat().st_size <= 16 * 2**20 for f in files)
    book = json.loads((tmp_path / "ledger.json").read_text())
    assert set(book["runs"]) == set(PREFLIGHT)
    assert book["runs"]["fashion"]["windows"] == 1 and book["runs"]["fashion"]["log"][0]["shipped"] is not None
    assert "| not run |" not in ledger.table(book).split("| fashion |")[1].splitlines()[0]


@pytest.mark.parametrize(("first", "second", "kept"), [(91.0, 92.0, "multimnist-recon"), (92.0, 91.0, "multimnist")])
def test_of_two_runs_that_ship_one_model_the_best_of_the_three_stays(tmp_path, monkeypatch, first, second, kept):
    """ship goes in the plan's order: each run is exported to a folder of its own, and the second run that ships
    MultiMNIST is measured against what the first left in models/ (the shipped graph reads 90%)."""
    from training.campaign import ship

    shipped = tmp_path / "models" / "multimnist"
    shipped.mkdir(parents=True)
    (shipped / "capsnet.onnx").write_text("shipped 90.0")
    scores = {"multimnist": first, "multimnist-recon": second}
    monkeypatch.setattr(ship, "gather", lambda dirs, scratch: ({}, {n: tmp_path / f"{n}.pt" for n in scores}))

    def compare(spec, checkpoint, shipped, candidate, *rest):  # an export that writes its score, and its measure
        candidate.mkdir(parents=True)  # a folder another run exported to would already be there
        (candidate / "capsnet.onnx").write_text(f"{spec.name} {scores[spec.name]}")
        theirs = float((shipped / "capsnet.onnx").read_text().split()[-1])
        return {
            "metric": "both right",
            "candidate": scores[spec.name],
            "shipped": theirs,
            "replaced": scores[spec.name] > theirs,
        }

    monkeypatch.setattr(ship, "compare", compare)
    decisions = ship.ship([], tmp_path / "models", {}, tmp_path / "ledger.json", render=False, log=lambda _: None)
    assert decisions["multimnist"]["shipped"] == 90.0
    assert decisions["multimnist-recon"]["shipped"] == max(90.0, first)
    assert (shipped / "capsnet.onnx").read_text() == f"{kept} {max(first, second)}"


def test_pack_cuts_loads_in_the_order_the_plan_needs_them(data_dirs, tmp_path):
    loads = pack.pack(tmp_path / "pack", data_dirs, names=["multimnist", "fashion"], load_mib=30, log=lambda _: None)
    manifest = json.loads((loads[0] / pack.MANIFEST).read_text())
    items = [i for d in loads for i in manifest["loads"][d.name]["items"]]
    assert items == ["data/mnist", "start/multimnist.pt", "data/fashion-mnist", "start/fashion-mnist.pt"]
    assert len(loads) == 2 and all(pack.size(d) <= 30 * 2**20 for d in loads)
    start = torch.load(loads[0] / "start" / "multimnist.pt", weights_only=True)
    assert all(v.dtype == torch.float16 for v in start["model"].values() if v.is_floating_point())
    CapsNet(CapsNetConfig(**start["config"])).load_state_dict(start["model"])  # strict: every weight is there


def carried(root, loads: dict[str, list[str]], here: list[str]):
    """A pack whose manifest names loads, of which only those in here have been carried (their items empty)."""
    for load in here:
        for item in loads[load]:
            (root / load / item).mkdir(parents=True)
    (root / "load-1").mkdir(parents=True, exist_ok=True)
    (root / "load-1" / pack.MANIFEST).write_text(json.dumps({"loads": {k: {"items": v} for k, v in loads.items()}}))
    return root


def test_a_run_waiting_for_a_load_keeps_its_place_in_the_plan(tmp_path):
    """The loads arrive a call at a time: runs later in the plan take only the slots that the runs waiting
    for a load before them leave, so MultiMNIST, first in the plan, begins as soon as its weights arrive."""
    loads = {
        "load-1": ["site"],
        "load-2": ["data/mnist"],
        "load-3": ["start/multimnist.pt", "data/fashion-mnist"],
        "load-4": ["start/fashion-mnist.pt"],
    }
    names = ["multimnist", "em", "mnist-paper-s0", "fashion", "affine-capsnet-s2", "affine-paper-cnn-s2"]
    specs, state = [next(s for s in plan.PLAN if s.name == name) for name in names], {}  # in this order
    root = carried(tmp_path / "pack", loads, ["load-1", "load-2"])

    def begin(running):
        return [s.name for s in supervisor.schedule(specs, state, running, 5, root, left=600, min_left=180)]

    assert begin(0) == ["em", "mnist-paper-s0", "affine-capsnet-s2"]  # two slots held, for multimnist and fashion
    assert state["multimnist"] == {"state": "waiting", "why": "for start/multimnist.pt (load-3)"}
    assert state["fashion"]["why"] == "for data/fashion-mnist, start/fashion-mnist.pt (load-3, load-4)"
    assert state["affine-paper-cnn-s2"] == {"state": "waiting", "why": "for a slot"}
    for name in ("em", "mnist-paper-s0", "affine-capsnet-s2"):
        state[name] = {"state": "running"}
    carried(root, loads, ["load-3"])
    assert begin(3) == ["multimnist"]  # fashion still holds the fifth slot for load-4
    assert state["fashion"]["why"] == "for start/fashion-mnist.pt (load-4)"
    assert state["affine-paper-cnn-s2"]["why"] == "for a slot"
    state["multimnist"], state["em"] = {"state": "running"}, {"state": "done"}
    carried(root, loads, ["load-4"])
    assert begin(3) == ["fashion", "affine-paper-cnn-s2"]


def test_a_run_whose_items_no_load_holds_or_that_the_window_cannot_fit_is_skipped(tmp_path):
    root = carried(tmp_path / "pack", {"load-1": ["site", "data/mnist"]}, ["load-1"])
    state = {}
    specs = [next(s for s in plan.PLAN if s.name == name) for name in ("multimnist", "em")]
    assert [s.name for s in supervisor.schedule(specs, state, 0, 5, root, left=600, min_left=180)] == ["em"]
    assert state["multimnist"] == {"state": "skipped", "why": "start/multimnist.pt: in no load of the pack"}
    state = {}
    assert supervisor.schedule(specs, state, 0, 5, root, left=120, min_left=180) == []
    assert {entry["why"] for entry in state.values()} == {"not begun: too little of the window left"}


def test_the_plan_names_its_runs_once_and_each_kind_is_known():
    from training.campaign.runs import KINDS

    names = [s.name for s in plan.PLAN]
    assert len(names) == len(set(names))
    assert {s.kind for s in plan.PLAN} <= set(KINDS)
    assert all(s.ships in (None, *plan.STARTS) and s.start in (None, *plan.STARTS) for s in plan.PLAN)
    with pytest.raises(ValueError, match="no run named"):
        plan.by_name(["mnist-typo"])


def test_the_baselines_have_the_papers_parameter_counts():
    """Section 5's CNN: 35.4M at 28x28; section 6's: 24.56M at 36x36."""
    assert round(num_params(PaperCNN(28)) / 1e6, 1) == 35.4
    assert round(num_params(PairCNN(36)) / 1e6, 2) == 24.56
    logits = torch.tensor([[5.0, 4.0, -3.0] + [-9.0] * 7])
    assert PairCNN.pair_loss(logits, torch.tensor([[0, 1]])) < PairCNN.pair_loss(logits, torch.tensor([[2, 3]]))


def test_the_section_5_cnn_starts_as_tensorflow_would():
    """Glorot-uniform weights, zero biases: with PyTorch's defaults it stays at chance on 40x40 digits."""
    model = PaperCNN(40)
    for layer in model.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            fan_in, fan_out = nn.init._calculate_fan_in_and_fan_out(layer.weight)
            bound = math.sqrt(6 / (fan_in + fan_out))
            assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.9 * bound
            assert not layer.bias.any()


def _config(idx_dir, tmp_path, **kw) -> TrainConfig:
    return TrainConfig(
        data_dir=str(idx_dir),
        train_limit=64,
        val_size=32,
        batch_size=16,
        eval_batch_size=32,
        device="cpu",
        precision="fp32",
        out=str(tmp_path),
        log_every=100,
        **kw,
    )


def _fit(config: TrainConfig):
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig())
    splits = load_splits(config)
    return model, fit(model, ShiftedDigits(splits, 2, 32), config, log=lambda _: None)


def test_a_deadline_ends_the_run_before_it_passes(idx_dir, tmp_path):
    """An epoch is not begun that the last one's duration says would end past the deadline: the run ends
    validated and checkpointed, with time to spare, long before its 50 planned epochs."""
    deadline = time.time() + 20
    _, run = _fit(_config(idx_dir, tmp_path, epochs=50, deadline=deadline))
    assert (
        1 <= run.epochs_run < 50 and "of the 50 planned epochs (stopped by its GPU window's deadline)" in run.selection
    )
    assert time.time() < deadline + 5  # the last epoch's duration is the estimate: at most one epoch over
    assert (tmp_path / "best.pt").exists() and (tmp_path / "last.pt").exists()


def test_stop_at_ends_the_run_at_the_first_epoch_that_reaches_it(idx_dir, tmp_path):
    _, run = _fit(_config(idx_dir, tmp_path, epochs=5, stop_at=0.01))  # any epoch reaches 1%
    assert run.epochs_run == 1 and run.kept_epoch == 1
    with pytest.raises(ValueError, match="validation split"):
        TrainConfig(stop_at=0.5, val_size=0)


def test_init_starts_from_a_checkpoints_weights(idx_dir, tmp_path):
    torch.manual_seed(1)
    start = CapsNet(CapsNetConfig())
    weights = {k: v.half() for k, v in start.state_dict().items()}  # a compact checkpoint's fp16
    torch.save({"model": weights}, tmp_path / "start.pt")
    config = _config(idx_dir, tmp_path / "run", epochs=1, lr=0.0, lr_decay=1.0, init=str(tmp_path / "start.pt"))
    model, _ = _fit(config)  # lr 0: the weights stay where they started
    assert torch.equal(model.state_dict()["conv1.weight"], weights["conv1.weight"].float())


def test_low_resolution_is_a_coarse_scan_scaled_back():
    x = torch.zeros(64, 1, 28, 28)
    x[:, :, 4:24, 10:18] = 1.0
    out = data.low_resolution(x, 1.0, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.min() >= 0 and out.max() <= 1
    assert (out != x).any(dim=(1, 2, 3)).all()  # every image changed: its edges blurred
    assert torch.allclose(out.sum((1, 2, 3)), x.sum((1, 2, 3)), rtol=0.25)  # the ink stays about the same
    assert torch.equal(data.low_resolution(x, 0.0, torch.Generator().manual_seed(0)), x)


def test_hflip_mirrors_some_images():
    x = torch.rand(200, 1, 28, 28)
    out = data.random_hflip(x, 0.5, torch.Generator().manual_seed(0))
    flipped = (out == x.flip(-1)).all(dim=(1, 2, 3))
    assert 60 < flipped.sum() < 140 and torch.equal(out[~flipped], x[~flipped])


def test_the_pairs_runs_move_their_digits_as_the_paper_says_and_as_the_authors_released():
    """The plan's MultiMNIST runs: the paper's ±4 px (section 6), and beside it the authors' released test-split
    command's shift (pairs.RELEASED_SHIFT), from the same weights with the same settings otherwise."""
    runs = {spec.name: spec for spec in plan.PLAN}
    paper, released = runs["multimnist"], runs["multimnist-shift6"]
    assert TrainConfig(**paper.train).pair_shift == pairs.MAX_SHIFT
    assert TrainConfig(**released.train).pair_shift == pairs.RELEASED_SHIFT
    assert released.kind == "pairs" and released.start == "multimnist"


def test_the_unscaled_pairs_run_differs_from_the_shipped_run_in_its_scale_alone():
    """Beside MultiMNIST's run (pairs scaled 0.8-1.2, for drawn pairs) the same run on unscaled pairs, as the
    paper's and the test's are: from the same weights, with the same settings otherwise, and never shipped
    (the served model reads drawn pairs of any size)."""
    runs = {spec.name: spec for spec in plan.PLAN}
    scaled, unscaled = runs["multimnist"], runs["multimnist-unscaled"]
    assert TrainConfig(**scaled.train).scale == 0.2 and TrainConfig(**unscaled.train).scale == 0.0
    assert {k: v for k, v in scaled.train.items() if k != "scale"} == unscaled.train
    assert (unscaled.kind, unscaled.start, unscaled.ships) == ("pairs", "multimnist", None)


def test_the_recon_run_differs_from_the_shipped_run_in_the_decoders_weight_alone(data_dirs, tmp_path):
    """Beside MultiMNIST's run, from the same weights with the same settings, the decoder weighed against Eq. 4
    as the authors' code weighs it (its margin loss averaged over the classes at half weight: 1/20 of ours);
    the two begin at once, first in a window with the unscaled pairs' run, and either ships when better. Its
    model is the starting checkpoint's, its recon_weight the plan's."""
    from training.campaign.runs import configs, locate

    runs = {spec.name: spec for spec in plan.PLAN}
    shipped, recon = runs["multimnist"], runs["multimnist-recon"]
    assert 20 * CapsNetConfig().recon_weight == plan.RECON_AS_RELEASED
    assert recon.train == shipped.train and recon.capsnet == {"recon_weight": plan.RECON_AS_RELEASED}
    assert (recon.kind, recon.start, recon.ships) == ("pairs", "multimnist", "multimnist")
    assert [spec.name for spec in plan.PLAN[:3]] == ["multimnist", "multimnist-recon", "multimnist-unscaled"]
    root = tmp_path / "pack"
    pack.pack(root, data_dirs, names=[recon.name], log=lambda _: None)
    _, config = configs(recon, root, tmp_path / "work", time.time() + 60, "cpu", smoke=True)
    start = torch.load(locate(root, "start/multimnist.pt"), weights_only=True)["config"]
    assert config == CapsNetConfig(**{**start, "recon_weight": plan.RECON_AS_RELEASED})
    assert start["recon_weight"] == CapsNetConfig().recon_weight  # the shipped run's own weight is the paper's


def test_a_run_from_shipped_weights_keeps_their_architecture():
    with pytest.raises(ValueError, match="may be loss, recon_weight, not routing"):
        plan.Spec("x", "pairs", 1.0, "a target", start="multimnist", capsnet={"routing": "em"})
    assert plan.Spec("x", "digits", 1.0, "a target", capsnet={"routing": "em"}).capsnet == {"routing": "em"}
