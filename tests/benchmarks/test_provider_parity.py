"""benchmarks.provider_parity runs on the CPU against itself and writes its result (a smoke test: on a GPU
machine it compares CUDA with the CPU)."""

import json

import numpy as np

from benchmarks import provider_parity
from model import contract


def test_provider_parity_writes_its_result(tmp_path):
    provider_parity.main(["--provider", "CPUExecutionProvider", "--out", str(tmp_path / "parity.json")])
    result = json.loads((tmp_path / "parity.json").read_text())
    assert result["images"] == 1000 and set(result["max_abs_diff"]) == set(contract.CAPSNET_OUTPUTS)
    assert result["max_abs_diff_all"] == 0.0 and result["same_predictions"]  # the same session settings, twice


def test_a_difference_between_the_sessions_is_reported(monkeypatch):
    """The second session's routing off by 1e-3 and one image's lengths swapped: both are measured."""
    real, calls = provider_parity.outputs, []

    def outputs(session, images):
        out = real(session, images)
        calls.append(session)
        if len(calls) == 2:  # the provider's session, after the CPU's reference
            out[list(contract.CAPSNET_OUTPUTS).index(contract.ROUTING)] += 1e-3
            out[0][0] = out[0][0][::-1]
        return out

    monkeypatch.setattr(provider_parity, "outputs", outputs)
    result = provider_parity.parity(contract.SHIPPED["mnist"], "CPUExecutionProvider")
    assert np.isclose(result["max_abs_diff"][contract.ROUTING], 1e-3, rtol=1e-2)
    assert result["max_abs_diff_all"] >= 1e-3 and not result["same_predictions"]
    assert result["providers_in_use"] == ["CPUExecutionProvider"]
