"""model.contract is the one place the ONNX names live, and it costs no torch."""

import json
import subprocess
import sys
from pathlib import Path

from model import contract
from tests.harness import REPO


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


def test_every_shipped_model_has_one_folder_of_the_same_shape():
    """models/<name>/ each: the two graphs and a card, the graph's input as the card says (no other place
    says what a model reads), and nothing of a model left in the code's folder."""
    import onnx

    assert [folder.name for folder in contract.SHIPPED.values()] == list(contract.SHIPPED)
    for name, folder in contract.SHIPPED.items():
        assert folder.parent == contract.MODELS_DIR and folder.is_dir(), name
        card = json.loads((folder / contract.MODEL_CARD).read_text())
        size = card[contract.SERVING]["input"]["size"]
        graph = onnx.load(str(folder / contract.CAPSNET_ONNX), load_external_data=False).graph
        dims = [d.dim_value or d.dim_param for d in graph.input[0].type.tensor_type.shape.dim]
        assert dims == [contract.BATCH, 1, size, size], name
        assert (folder / contract.DECODER_ONNX).is_file(), name
    code = Path(contract.__file__).parent
    assert not list(code.glob("*.onnx")) and not list(code.glob("**/" + contract.MODEL_CARD))


def test_iteration_outputs_are_dynamic_routings_at_its_r():
    """The optional iteration outputs follow CAPSNET_OUTPUTS for the routing contract.DYNAMIC_ROUTING names
    (Procedure 1, the model's DynamicRouting), at R iterations; other routings' graphs have none."""
    from model.capsnet import CapsNetConfig, create_routing
    from model.routing import DynamicRouting

    assert isinstance(create_routing(CapsNetConfig(routing=contract.DYNAMIC_ROUTING)), DynamicRouting)
    dynamic = contract.capsnet_outputs(36, contract.DYNAMIC_ROUTING, 4)
    assert list(dynamic) == [*contract.CAPSNET_OUTPUTS, *contract.CAPSNET_ITERATION_OUTPUTS]
    assert dynamic[contract.ROUTING_ITERATIONS] == (contract.BATCH, 4, 3200, 10)
    assert dynamic[contract.LOGIT_CHANGES] == (contract.BATCH, 4)
    for routing in ("em", "qp-l2"):
        assert list(contract.capsnet_outputs(28, routing, 3)) == list(contract.CAPSNET_OUTPUTS)
