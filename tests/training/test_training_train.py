"""The training loop (training/fit.py through train.py): it learns, writes what it promises, keeps
the right epoch, resumes the data stream exactly, runs under DDP with gloo, never syncs with the
host inside a step, and runs the routing in fp32 under bf16 autocast."""

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from model import contract
from model.capsnet import CapsNet, CapsNetConfig, DigitCaps
from tests.harness import REPO, free_port
from training import config as tc
from training import data, fit, train
from training.cards import model_card
from training.evaluate import evaluate, load_checkpoint, summarise
from training.graphs import model_from_graphs


@pytest.mark.parametrize(
    "routing, n, steps",
    [
        ("dynamic", 256, 12),
        pytest.param("em", 128, 8, marks=pytest.mark.slow),
    ],
)
def test_a_few_steps_lower_the_loss(mnist_fixture, routing, n, steps):
    torch.manual_seed(0)
    images, labels = mnist_fixture
    x = data.to_float(torch.from_numpy(images[:n].copy()))
    y = torch.from_numpy(labels[:n])
    model = CapsNet(CapsNetConfig(routing=routing))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    with torch.no_grad():
        before = model.loss(model(x, y), x, y).item()
    for step in range(steps):
        idx = torch.arange(step * 32 % n, step * 32 % n + 32)
        loss = model.loss(model(x[idx], y[idx]), x[idx], y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    with torch.no_grad():
        after = model.loss(model(x, y), x, y).item()
    assert after < 0.8 * before


def config(idx_dir, out, **kw) -> tc.TrainConfig:
    """A tiny fp32 run on the fixture's IDX files: 192 training images, 3 batches of 64."""
    fields = dict(
        data_dir=str(idx_dir),
        val_size=100,
        train_limit=192,
        batch_size=64,
        eval_batch_size=200,
        lr_decay=0.9,
        epochs=1,
        precision="fp32",
        device="cpu",
        out=str(out),
        log_every=1,
    )
    return tc.TrainConfig(**{**fields, **kw})


@pytest.mark.slow
def test_run_writes_checkpoints_logs_and_typed_configs(idx_dir, tmp_path):
    cfg = config(idx_dir, tmp_path / "run", epochs=2)
    model, run, test = train.train(cfg, CapsNetConfig(recon_weight=train.OFFICIAL_RECON_WEIGHT))
    out = tmp_path / "run"
    assert {"best.pt", "last.pt", "metrics.json", "curves.png"} <= {p.name for p in out.iterdir()}
    assert [h["epoch"] for h in run.history] == [1, 2] and 0 <= test["accuracy"] <= 1
    best = max(run.history, key=lambda h: (h["val_acc"], h["epoch"]))
    assert run.kept_epoch == best["epoch"]
    loaded, ckpt = load_checkpoint(out / "best.pt")  # weights_only=True inside
    assert tc.TrainConfig(**ckpt["train_config"]) == cfg  # typed, no string round trip
    assert CapsNetConfig(**ckpt["config"]) == model.config and loaded.config.recon_weight == 0.01
    assert ckpt["epoch"] == run.kept_epoch and "optimizer" not in ckpt  # best.pt: weights and configs only
    last = torch.load(out / "last.pt", weights_only=True)
    assert last["optimizer"]["param_groups"][0]["lr"] == pytest.approx(1e-3 * 0.81, rel=1e-3)
    assert json.loads((out / "metrics.json").read_text()) == run.history


def test_recon_weight_option_reaches_the_model():
    _, model_config = train.parse_args(["--recon-weight", "0.01"])
    assert model_config.recon_weight == 0.01 and train.parse_args([])[1].recon_weight == 0.0005


@pytest.mark.slow
def test_val_size_zero_trains_on_everything_and_keeps_the_last_epoch(idx_dir, tmp_path):
    """Defect 2: --val-size 0 crashed in evaluate; now the last epoch is kept and the card says so."""
    cfg = config(idx_dir, tmp_path / "all", val_size=0, train_limit=0, epochs=2)
    _model, run, _test = train.train(cfg, CapsNetConfig())
    assert run.kept_epoch == 2 and all("val_acc" not in h for h in run.history)
    assert run.images_per_epoch == 768  # all 800 fixture 'train' images, cut to whole batches of 64
    ckpt = torch.load(tmp_path / "all" / "best.pt", weights_only=True)
    assert ckpt["epoch"] == 2
    card = model_card(ckpt, tmp_path / "all" / "best.pt", 0.0, None)
    assert "the last of 2 epochs" in card["selection"] and "no validation split" in card["selection"]
    assert card["val_accuracy"] is None and card["train_config"]["val_size"] == 0


@pytest.mark.slow
def test_resume_continues_the_data_stream(idx_dir, tmp_path):
    """Defect 3: a resumed run must equal an uninterrupted one (order and shifts continue, not replay)."""
    _straight, _, _ = train.train(config(idx_dir, tmp_path / "a", epochs=2), CapsNetConfig())
    train.train(config(idx_dir, tmp_path / "b", epochs=1), CapsNetConfig())
    _resumed, run, _ = train.train(config(idx_dir, tmp_path / "b", epochs=2, resume=True), CapsNetConfig())
    assert [h["epoch"] for h in run.history] == [1, 2]
    a = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["model"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


@pytest.mark.slow
def test_eval_every_validates_and_checkpoints_only_every_n_epochs(idx_dir, tmp_path):
    """Defect 6: evaluation and checkpoints every eval_every epochs and at the end, not every epoch."""
    calls = []

    class Counting(train.ShiftedDigits):
        def validate(self, model):
            calls.append(1)
            return super().validate(model)

    splits = train.load_splits(config(idx_dir, tmp_path))
    cfg = config(idx_dir, tmp_path / "e", epochs=3, eval_every=2)
    run = fit.fit(CapsNet(CapsNetConfig()), Counting(splits, 2, 200), cfg, log=lambda _: None)
    assert [h["epoch"] for h in run.history] == [2, 3] and len(calls) == 2
    assert torch.load(tmp_path / "e" / "last.pt", weights_only=True)["epoch"] == 3


def test_spread_margin_rises_over_the_planned_epochs(idx_dir, tmp_path):
    """fit tells the task how far the planned training has come before every step; the spread loss's
    margin rises linearly from 0.2 to 0.9 with it (matrix capsules, section 4.1)."""
    progress = []

    class Recording(train.ShiftedDigits):
        def schedule(self, p):
            progress.append(p)
            super().schedule(p)

    splits = train.load_splits(config(idx_dir, tmp_path))
    task = Recording(splits, 2, 200)
    assert task.spread_margin.item() == pytest.approx(0.2)
    cfg = config(idx_dir, tmp_path / "m", epochs=2)  # 192 images, 3 steps an epoch
    fit.fit(CapsNet(CapsNetConfig(routing="em", reconstruction=False)), task, cfg, log=lambda _: None)
    assert progress == pytest.approx([s / 6 for s in range(6)])
    assert task.spread_margin.item() == pytest.approx(0.2 + 0.7 * 5 / 6)
    task.schedule(1.5)  # past the plan: the margin stays at its end
    assert task.spread_margin.item() == pytest.approx(0.9)


@pytest.mark.slow
def test_time_limit_ends_the_run_at_the_epoch_that_passes_it(idx_dir, tmp_path):
    """A run stopped by its time limit validates and checkpoints that epoch as the last, and its
    checkpoint and card say how many of the planned epochs ran."""
    cfg = config(idx_dir, tmp_path / "t", epochs=5, eval_every=3, time_limit=1e-3)
    _model, run, _ = train.train(cfg, CapsNetConfig())
    assert run.epochs_run == 1 and [h["epoch"] for h in run.history] == [1] and run.kept_epoch == 1
    ckpt = torch.load(tmp_path / "t" / "best.pt", weights_only=True)
    assert ckpt["epochs_run"] == 1 and ckpt["train_config"]["epochs"] == 5
    assert torch.load(tmp_path / "t" / "last.pt", weights_only=True)["epoch"] == 1
    card = model_card(ckpt, tmp_path / "t" / "best.pt", 0.0, None)
    assert (
        card["run_epochs"] == 1 and "1 of the 5 planned epochs (stopped by its 0.001 s time limit)" in card["selection"]
    )
    assert fit.Run.of_checkpoint(ckpt).selection == run.selection


@pytest.mark.slow
def test_compact_checkpoint_keeps_the_run_in_fp16_without_optimiser_state(idx_dir, tmp_path):
    from training.compact import compact

    train.train(config(idx_dir, tmp_path / "c"), CapsNetConfig())
    last = tmp_path / "c" / "last.pt"  # weights, Adam's moments, schedule and generator states
    small = compact(last, tmp_path / "last16.pt")
    full, ckpt = load_checkpoint(last)
    half, ckpt16 = load_checkpoint(small)
    assert all(v.dtype == torch.float16 for v in ckpt16["model"].values() if v.is_floating_point())
    assert {"optimizer", "scheduler", "rng"} <= set(ckpt) and not {"optimizer", "scheduler", "rng"} & set(ckpt16)
    assert ckpt16["history"] == ckpt["history"] and ckpt16["train_config"] == ckpt["train_config"]
    assert small.stat().st_size < 0.3 * last.stat().st_size
    x = torch.rand(8, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(half(x).lengths, full(x).lengths, rtol=0, atol=2e-3)


@pytest.mark.parametrize("n, batch, world", [(1025, 64, 2), (97, 16, 2), (1000, 128, 1), (129, 32, 4)])
def test_every_rank_takes_the_same_number_of_whole_batches(n, batch, world):
    """Defect 4: a rank whose last batch was empty stopped while the others waited in all-reduce."""
    per_rank = [fit.epoch_batches(n, batch, r, world, fit.generators(0, r, "cpu")["order"]) for r in range(world)]
    assert {tuple(b.shape) for b in per_rank} == {(n // (batch * world), batch)}
    every = torch.cat([b.flatten() for b in per_rank])
    assert len(torch.unique(every)) == len(every) and every.max() < n  # disjoint, one permutation


def test_ranks_share_the_order_but_not_the_augmentation():
    """Defect 4: every rank drew the same shifts from one generator seeded alike."""
    g0, g1 = fit.generators(0, 0, "cpu"), fit.generators(0, 1, "cpu")
    assert torch.equal(torch.randperm(100, generator=g0["order"]), torch.randperm(100, generator=g1["order"]))
    x = torch.rand(64, 1, 28, 28)
    assert not torch.equal(data.random_shift(x, 2, g0["augment"]), data.random_shift(x, 2, g1["augment"]))


def test_routing_runs_in_fp32_under_bf16_autocast():
    """Defect 1: autocast put the votes' einsums in bf16; v and c must match fp32 to 1e-5."""
    torch.manual_seed(0)
    layer, u = DigitCaps(), torch.randn(8, 1152, 8) * 0.5
    for training in (True, False):  # the fused training path and the plain one of inference
        layer.train(training)
        v, lengths, c, *_ = layer(u)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            v_amp, lengths_amp, c_amp, votes, _ = layer(u)
        assert v_amp.dtype == c_amp.dtype == torch.float32 and (votes is None) == training
        torch.testing.assert_close(v_amp, v, rtol=0, atol=1e-5)
        torch.testing.assert_close(c_amp, c, rtol=0, atol=1e-5)
        torch.testing.assert_close(lengths_amp, lengths, rtol=0, atol=1e-5)


def test_convolutions_take_bf16_under_autocast():
    model = CapsNet(CapsNetConfig())
    dtypes = {}

    def record(name):
        def hook(module, inputs, output):
            dtypes[name] = output.dtype

        return hook

    for name in ("conv1", "primary", "primary.conv"):
        model.get_submodule(name).register_forward_hook(record(name))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.rand(2, 1, 28, 28))
    assert dtypes["conv1"] == dtypes["primary.conv"] == torch.bfloat16
    assert dtypes["primary"] == out.lengths.dtype == torch.float32  # squash onwards in fp32


def test_precision_auto_follows_the_cpu():
    """auto is bf16 exactly where the kernel says the CPU has AVX512-BF16 or AMX (read here from
    /proc/cpuinfo, not from torch): the 2-core machines here are one of each."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        pytest.skip("no /proc/cpuinfo to read the CPU's flags from")
    flags = set(re.search(r"^flags\s*:(.*)$", cpuinfo.read_text(), re.MULTILINE).group(1).split())
    cfg = tc.TrainConfig(device="cpu")
    assert tc.resolve_precision(cfg) == ("bf16" if flags & {"avx512_bf16", "amx_tile"} else "fp32")
    assert tc.resolve_precision(replace(cfg, precision="fp32")) == "fp32"
    with pytest.raises(ValueError, match="precision"):
        tc.TrainConfig(precision="fp16")


class HostSyncs(TorchDispatchMode):
    """Records what makes the host wait for the device: reading a value (.item(), bool(), int(), .tolist())
    or an output whose shape depends on the data (boolean masks, nonzero). On the CPU a boolean mask is
    indexed without nonzero, so an index by a bool tensor is recorded as such; .tolist() reads memory without
    dispatching an op, so it is recorded where it is called."""

    SYNCING: ClassVar[set[str]] = {
        "aten::_local_scalar_dense",
        "aten::nonzero",
        "aten::masked_select",
        "aten::unique_consecutive",
        "aten::_unique2",
    }
    INDEXING: ClassVar[set[str]] = {"aten::index", "aten::index_put", "aten::_index_put_impl_"}

    def __init__(self):
        super().__init__()
        self.seen = []

    def __enter__(self):
        tolist = self._tolist = torch.Tensor.tolist

        def recorded(tensor, *args, **kwargs):
            self.seen.append("Tensor.tolist")
            return tolist(tensor, *args, **kwargs)

        torch.Tensor.tolist = recorded
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        indices = args[1] if name in self.INDEXING and len(args) > 1 else ()
        if name in self.SYNCING or any(i is not None and i.dtype == torch.bool for i in indices):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_host_syncs_sees_what_makes_the_host_wait():
    """The recorder itself: each way a step could read the device's data is seen, a step without them is not."""
    x, tolist = torch.rand(8, 4), torch.Tensor.tolist
    for read in (
        lambda: x.sum().item(),
        lambda: x[x > 0.5],
        lambda: x.tolist(),
        lambda: x.nonzero(),
        lambda: x.masked_fill(x > 0.5, 0.0).sum().item(),
    ):
        with HostSyncs() as mode:
            read()
        assert mode.seen, read
    with HostSyncs() as mode:
        (x.masked_fill(x > 0.5, 0.0) * x[torch.tensor([0, 2])].sum()).softmax(-1)
    assert mode.seen == []
    assert torch.Tensor.tolist is tolist  # put back on exit


@pytest.mark.parametrize("routing", ["dynamic", "em"])
def test_a_training_step_never_syncs_with_the_host(mnist_fixture, routing):
    images, labels = mnist_fixture
    split = data.Split(torch.from_numpy(images[:300].copy()), torch.from_numpy(labels[:300]))
    task = train.ShiftedDigits({"train": split, "val": split}, max_shift=2)
    model = CapsNet(CapsNetConfig(routing=routing))
    task.schedule(0.5)  # the spread loss's margin moves on the device
    gen = fit.generators(0, 0, "cpu")
    with HostSyncs() as mode:
        idx = fit.epoch_batches(task.train_size, 16, 0, 1, gen["order"])[0]
        res = task.loss(model, task.draw(idx, gen["augment"]))
        res.loss.backward()
    assert mode.seen == []


def test_evaluate_summary_counts_errors_and_confusion():
    import numpy as np

    result = summarise(np.array([0, 1, 2, 2]), np.array([0, 1, 1, 2]), num_classes=3)
    assert result["errors"] == 1 and result["misclassified"] == [2]
    assert result["confusion"] == [[1, 0, 0], [0, 1, 1], [0, 0, 1]]
    assert result["accuracy"] == 0.75


def test_evaluate_runs_the_model_on_a_split(mnist_fixture):
    """The shipped weights on 50 fixture digits (not a batch multiple): its answers are the model's own."""
    images, labels = mnist_fixture
    split = data.Split(torch.from_numpy(images[:50].copy()), torch.from_numpy(labels[:50]))
    model = model_from_graphs(contract.SHIPPED["mnist"])
    result = evaluate(model, split, batch_size=20)
    assert result["count"] == 50 and len(result["confusion"]) == 10 and result["loss"] > 0
    with torch.no_grad():
        own = model.eval()(data.to_float(split.images)).lengths.argmax(1).numpy()  # unmasked: lengths alone
    assert result["misclassified"] == np.flatnonzero(own != labels[:50]).tolist()
    assert result["accuracy"] >= 0.96 and sum(map(sum, result["confusion"])) == 50


@pytest.mark.slow
def test_torchrun_with_gloo_on_cpu_and_uneven_ranks(idx_dir, tmp_path):
    """97 images on 2 ranks at batch 16: before, rank 1's 4th batch was empty and it hung the other."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),  # a fixed one is taken by any other run of the suite on the machine
        "-m",
        "training.train",
        "--data-dir",
        str(idx_dir),
        "--val-size",
        "100",
        "--train-limit",
        "97",
        "--batch-size",
        "16",
        "--epochs",
        "2",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "ddp"),
        "--eval-batch-size",
        "200",
        "--precision",
        "fp32",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "x2" in proc.stdout
    history = json.loads((tmp_path / "ddp" / "metrics.json").read_text())
    assert [h["epoch"] for h in history] == [1, 2] and history[0]["train_images"] == 96  # 3 steps x 16 x 2
    last = torch.load(tmp_path / "ddp" / "last.pt", weights_only=True)
    augment = last["rng"]["augment"]
    assert len(augment) == 2 and not torch.equal(augment[0], augment[1])  # each rank's stream, saved


@pytest.mark.slow
def test_compiled_step_trains_like_the_eager_one(idx_dir, tmp_path):
    """--compile (torch.compile of the task's loss; CUDA graphs on CUDA) runs the same loop on a CPU."""
    eager, run_e, _ = train.train(config(idx_dir, tmp_path / "eager"), CapsNetConfig())
    compiled, run_c, _ = train.train(config(idx_dir, tmp_path / "compiled", compile=True), CapsNetConfig())
    assert run_c.history[0]["train_loss"] == pytest.approx(run_e.history[0]["train_loss"], rel=1e-3)
    for (k, a), b in zip(eager.state_dict().items(), compiled.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=k)
