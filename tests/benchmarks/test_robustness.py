"""benchmarks.robustness's optional modes: --optdigits needs scikit-learn, which is no dependency."""

import sys

import numpy as np

from benchmarks import robustness


def test_optdigits_is_skipped_without_scikit_learn(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)  # import fails as if not installed
    assert robustness.main(["--optdigits", "--out", str(tmp_path / "optdigits.json")]) == {}
    assert "skipped: scikit-learn is not installed" in capsys.readouterr().out
    assert not (tmp_path / "optdigits.json").exists()


def test_optdigits_counts_misread_and_refused_digits():
    images = np.zeros((3, 8, 8))
    images[:, 2:6, 3:5] = 16  # a bar, upscaled to 64x64
    answers = iter([1, 7, -1])
    result = robustness.optdigits(lambda data: next(answers), images, np.array([1, 1, 1]))
    assert (result["n"], result["errors"], result["refused"]) == (3, 2, 1)
    assert result["misread"] == [[1, 7], [2, -1]] and abs(result["accuracy"] - 1 / 3) < 1e-9
