"""training/triton.py: the Triton model repository of every shipped model (NAME and NAME_decoder).

Each generated config.pbtxt is parsed with Triton's own ModelConfig protobuf (shipped in the
tritonclient dev dependency), so a field Triton does not know fails the parse, and checked against
what ONNX Runtime reports for the same model (names, element types, shapes).
"""

import importlib.util

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format

from model import contract
from training import triton

ORT_TO_TRITON = {"tensor(float)": "TYPE_FP32", "tensor(int64)": "TYPE_INT64", "tensor(float16)": "TYPE_FP16"}


def model_config_pb2():
    """Triton's model_config_pb2, loaded from tritonclient's files without importing grpc."""
    spec = importlib.util.find_spec("tritonclient")
    path = next(iter(spec.submodule_search_locations)) + "/grpc/model_config_pb2.py"
    module_spec = importlib.util.spec_from_file_location("_triton_model_config_pb2", path)
    pb2 = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(pb2)
    return pb2


PB2 = model_config_pb2()


def read_config(repo, name):
    return text_format.Parse((repo / name / "config.pbtxt").read_text(), PB2.ModelConfig())


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton")
    triton.main([str(root)])
    return root


ENTRIES = [
    (name + suffix, folder, suffix) for name, folder in contract.SHIPPED.items() for suffix in ("", triton.DECODER)
]


def test_every_shipped_model_is_written(repo):
    assert sorted(p.name for p in repo.iterdir()) == sorted(name for name, _, _ in ENTRIES)


@pytest.mark.parametrize("name, folder, suffix", ENTRIES, ids=[e[0] for e in ENTRIES])
def test_config_matches_onnx_runtime_view_of_the_model(repo, name, folder, suffix):
    filename, want_inputs, want_outputs, _ = triton.graphs(folder)[suffix]
    config = read_config(repo, name)
    session = ort.InferenceSession(str(folder / filename), providers=["CPUExecutionProvider"])

    assert config.name == name and config.backend == "onnxruntime"
    assert config.max_batch_size == triton.MAX_BATCH
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert config.dynamic_batching.max_queue_delay_microseconds == triton.MAX_QUEUE_DELAY_US
    for section, tensors in ((config.input, session.get_inputs()), (config.output, session.get_outputs())):
        got = {t.name: t for t in section}
        assert list(got) == [t.name for t in tensors]  # every tensor of the graph, in graph order
        for t in tensors:
            assert isinstance(t.shape[0], str), f"{t.name}: batch axis must be dynamic"
            assert list(got[t.name].dims) == list(t.shape[1:])  # Triton's dims leave the batch axis out
            assert PB2.DataType.Name(got[t.name].data_type) == ORT_TO_TRITON[t.type]
    assert [t.name for t in session.get_inputs()] == list(want_inputs)
    assert set(want_outputs) <= {t.name for t in session.get_outputs()}
    assert (repo / name / "1" / "model.onnx").read_bytes() == (folder / filename).read_bytes()


@pytest.mark.parametrize("name, size", [("mnist", 28), ("fashion-mnist", 28), ("multimnist", 36), ("affine", 40)])
def test_capsnet_config_spells_the_contract_at_the_models_size(repo, name, size):
    config = read_config(repo, name)
    dims = {t.name: list(t.dims) for t in (*config.input, *config.output)}
    shapes = contract.capsnet_shapes(size, 3)  # every shipped model routes dynamically, 3 iterations
    for tensor in (*contract.CAPSNET_INPUTS, *contract.CAPSNET_OUTPUTS, *contract.CAPSNET_ITERATION_OUTPUTS):
        assert dims[tensor] == list(shapes[tensor][1:])
    assert dims[contract.IMAGE] == [1, size, size]
    assert [list(t.dims) for t in read_config(repo, name + triton.DECODER).output] == [[size, size]]


def test_repository_models_run_batched(repo, mnist_fixture):
    images, _ = mnist_fixture
    session = ort.InferenceSession(str(repo / "mnist" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = images[:3, None].astype(np.float32) / 255.0
    outputs = session.run(None, {contract.IMAGE: x})
    for out, spec in zip(outputs, read_config(repo, "mnist").output, strict=True):
        assert list(out.shape) == [3, *spec.dims]


def test_one_folder_under_its_own_name(tmp_path):
    written = triton.main([str(tmp_path), "--model", f"mine={contract.SHIPPED['multimnist']}"])
    assert sorted(c.parent.name for c in written) == ["mine", "mine_decoder"]
    assert read_config(tmp_path, "mine").name == "mine"
    with pytest.raises(SystemExit):  # argparse says contract.model_folder's sentence and exits
        triton.main([str(tmp_path), "--model", "nope"])


def test_a_field_triton_does_not_know_fails_the_parse():
    with pytest.raises(text_format.ParseError, match="max_batch"):
        text_format.Parse('name: "m" max_batch: 8', PB2.ModelConfig())


def _tiny_model(path, batch_dim, output="lengths"):
    x = onnx.helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT, [batch_dim, 1, 28, 28])
    y = onnx.helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, [batch_dim, 1, 28, 28])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["image"], [output])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph), str(path))


def test_contract_check_reads_the_iterations_at_the_cards_count():
    """The optional iteration outputs are checked where a graph has them: at R = 2 the shipped graph's
    3 iterations are refused."""
    path = contract.SHIPPED["mnist"] / contract.CAPSNET_ONNX
    inputs, outputs = triton.graph_io(path)
    triton.check_contract(path, inputs, outputs, ("image",), contract.CAPSNET_OUTPUTS, contract.capsnet_shapes(28, 3))
    with pytest.raises(ValueError, match=r"routing_iterations has shape \['N', 3, 1152, 10\]"):
        triton.check_contract(
            path, inputs, outputs, ("image",), contract.CAPSNET_OUTPUTS, contract.capsnet_shapes(28, 2)
        )


def test_contract_check_rejects_a_wrong_graph(tmp_path):
    path = tmp_path / "m.onnx"
    _tiny_model(path, "N", output="logits")
    with pytest.raises(ValueError, match="not in the graph"):
        triton.check_contract(path, *triton.graph_io(path), ("image",), ("lengths",), contract.CAPSNET_SHAPES)
    _tiny_model(path, "N")
    with pytest.raises(ValueError, match="lengths has shape"):
        triton.check_contract(path, *triton.graph_io(path), ("image",), ("lengths",), contract.CAPSNET_SHAPES)
    _tiny_model(path, 1)
    shapes = {"image": (1, 1, 28, 28), "lengths": (1, 1, 28, 28)}
    with pytest.raises(ValueError, match="no dynamic batch axis"):
        triton.check_contract(path, *triton.graph_io(path), ("image",), ("lengths",), shapes)
