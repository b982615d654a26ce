"""model.contract is the one place the ONNX names live, and it costs no torch."""
import subprocess
import sys

from model import contract
from tests.conftest import REPO


def test_contract_imports_without_torch():
    code = "import sys, model.contract; assert 'torch' not in sys.modules, 'torch was imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_names_and_shapes_are_consistent():
    assert set(contract.CAPSNET_SHAPES) == set(contract.CAPSNET_INPUTS + contract.CAPSNET_OUTPUTS)
    assert set(contract.DECODER_SHAPES) == set(contract.DECODER_INPUTS + contract.DECODER_OUTPUTS)
    assert contract.NUM_PRIMARY == 1152
    assert contract.CAPSNET_SHAPES[contract.ROUTING] == (contract.BATCH, 1152, 10)
