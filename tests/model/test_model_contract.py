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


def test_shapes_follow_the_input_size_as_the_network_does():
    import torch

    from model.capsnet import CapsNet, CapsNetConfig
    for size in (28, 36, 40):
        shapes = contract.capsnet_shapes(size)
        with torch.no_grad():  # the convolutions themselves, not the formula, give the grid
            primary = CapsNet(CapsNetConfig(image_size=size)).primary(torch.zeros(1, 256, size - 8, size - 8))
        assert shapes[contract.ROUTING][1] == primary.shape[1]
        assert shapes[contract.IMAGE] == (contract.BATCH, 1, size, size)
        assert shapes[contract.RECONSTRUCTION] == (contract.BATCH, size, size)
    assert contract.capsnet_shapes(36)[contract.VOTE_LENGTHS] == (contract.BATCH, 3200, 10)  # 32 x 10 x 10


def test_each_shipped_model_has_its_own_directory_and_the_served_one_is_mnist():
    dirs = [m.directory for m in contract.SHIPPED.values()]
    assert len(set(dirs)) == len(dirs)
    assert contract.SHIPPED["mnist"].directory == contract.MODEL_DIR
    assert contract.SHIPPED["mnist"].shapes == contract.CAPSNET_SHAPES
    assert contract.SHIPPED["multimnist"].image_size == contract.MULTIMNIST_SIZE == 36
    assert contract.SHIPPED["multimnist"].shapes[contract.RECONSTRUCTION] == (contract.BATCH, 36, 36)
