"""benchmarks.equivariance runs end to end on a few fixture digits and writes its report, and its measures
read sweeps built by hand as they were built (a smoke test: the figures themselves come from the full run)."""

import json

import numpy as np

from benchmarks import equivariance
from benchmarks.equivariance import Sweep
from model import contract


def test_equivariance_writes_its_report(mnist_fixture, tmp_path, monkeypatch):
    images, labels = mnist_fixture
    monkeypatch.setattr(equivariance, "test_digits", lambda model_dir, data_dir: (images / np.float32(255), labels))
    out, figure = tmp_path / "equivariance", tmp_path / "equivariance.png"
    equivariance.main(["--n", "10", "--steps", "5", "--out", str(out), "--figure", str(figure)])
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["digits"] == 10 and result["per_class"] == [1] * 10 and result["provider"] == "CPUExecutionProvider"
    assert labels[result["test_indices"]].tolist() == list(range(10))
    assert list(result["transforms"]) == list(equivariance.SWEEPS)
    for name, t in result["transforms"].items():
        identity = t["values"].index(equivariance.TRANSFORMS[name].identity)
        assert t["hold_by_step"][identity] == 1  # every chosen digit is read right untransformed
        assert t["identity_gap"] < 1e-5  # and its identity step is that digit: the steps line up with the values
        assert len(t["hold_by_step"]) == len(t["length_min_by_step"]) == 5 and 0 <= t["hold_rate"] <= 1
        assert len(t["mean_r"]) == len(t["mean_abs_r"]) == len(t["mean_share"]) == contract.CAPSULE_DIM
        assert 0 < t["length_min"] <= t["length_mean"] < 1 and len(t["top"]) == equivariance.TOP
    assert len(result["example"]["capsule"]) == 5 and result["example"]["label"] == 0
    assert "| rotate | -30 to 30 degrees |" in out.with_suffix(".md").read_text()
    assert figure.stat().st_size > 10_000


def test_pearson_and_shares_read_a_sweep_as_constructed():
    values = np.linspace(-30, 30, 7)
    x = np.stack([2 * values + 1, -values, values**2, np.full_like(values, 0.3)], axis=1)
    assert np.allclose(equivariance.pearson(x, values), [1, -1, 0, 0])
    assert np.allclose(equivariance.shares(x, values), [0.8, 0.2, 0, 0])  # slopes 2 and -1: 4/5 and 1/5


def swept(values: np.ndarray, label: int, dim: int, sign: float, breaks: bool = False) -> Sweep:
    """A digit of class label whose capsule moves only in dim, with sign; its answer changes at the last
    step if breaks. The other dimensions bend symmetrically (r = 0), so only dim correlates."""
    capsule = np.tile(0.01 * (values - values.mean())[:, None] ** 2, (1, contract.CAPSULE_DIM))
    capsule[:, dim] += sign * values
    lengths = np.full((len(values), contract.NUM_CLASSES), 0.1)
    lengths[:, label] = 0.9
    if breaks:
        lengths[-1, label] = 0.05
    return Sweep(lengths, capsule)


def test_summarise_finds_each_class_capsules_dimension_and_skips_broken_answers():
    values = np.linspace(0.8, 1.2, 5)
    sweeps = [swept(values, 0, 3, +1) for _ in range(4)] + [swept(values, 1, 5, -1) for _ in range(3)]
    sweeps.append(swept(values, 1, 9, +1, breaks=True))
    summary = equivariance.summarise(sweeps, np.array([0] * 4 + [1] * 4), values)
    assert (summary["held"], summary["hold_rate"], summary["hold_by_step"]) == (7, 0.875, [1, 1, 1, 1, 0.875])
    assert summary["length_min"] == 0.05 and summary["length_min_by_step"][:4] == [0.9] * 4
    classes = [(c["class"], c["digits"], c["top_dim"], c["top_mean_r"], c["top_share"]) for c in summary["classes"]]
    assert classes == [(0, 4, 3, 1.0, 1.0), (1, 3, 5, -1.0, 1.0)]  # the broken digit's dimension 9 is not counted
    top = [(d["dim"], d["mean_r"], d["top_in_classes"]) for d in summary["top"][:2]]
    assert top == [(3, 0.5714, 1), (5, -0.4286, 1)]  # over all 7 held digits: 4/7 and -3/7
    assert summary["mean_r"][9] == 0 and summary["mean_abs_r"][3] == 0.5714
