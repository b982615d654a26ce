"""benchmarks.provider_parity runs on the CPU against itself and writes its result (a smoke test: on a GPU
machine it compares CUDA with the CPU)."""

import json

from benchmarks import provider_parity
from model import contract


def test_provider_parity_writes_its_result(tmp_path):
    provider_parity.main(["--provider", "CPUExecutionProvider", "--out", str(tmp_path / "parity.json")])
    result = json.loads((tmp_path / "parity.json").read_text())
    assert result["images"] == 1000 and set(result["max_abs_diff"]) == set(contract.CAPSNET_OUTPUTS)
    assert result["max_abs_diff_all"] == 0.0 and result["same_predictions"]  # the same session settings, twice
