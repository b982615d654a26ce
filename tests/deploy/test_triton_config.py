"""training/triton.py: the Triton model repository of the shipped ONNX models.

The generated config.pbtxt is read back with a small protobuf-text parser written here, and checked
against what ONNX Runtime reports for the same model (names, element types, shapes), and, when the
`tritonclient` package is installed, against Triton's own ModelConfig schema.
"""
import importlib.util
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from model import contract
from training import triton

ORT_TO_TRITON = {"tensor(float)": "TYPE_FP32", "tensor(int64)": "TYPE_INT64", "tensor(float16)": "TYPE_FP16"}


# --- a protobuf text-format reader, enough for config.pbtxt --------------------------------------
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[-\w.]+')


def parse_pbtxt(text: str) -> dict:
    """'a: 1 b { c: "x" } d [ 1, 2 ] e [ { .. }, { .. } ]' -> {'a': [1], 'b': [{'c': ['x']}], ...}."""
    tokens = TOKEN.findall(re.sub(r"#[^\n]*", "", text))  # no '#' inside our strings
    pos = 0

    def value():
        nonlocal pos
        tok = tokens[pos]
        pos += 1
        if tok == "{":
            return message("}")
        if tok == "[":
            items = []
            while tokens[pos] != "]":
                items.append(value())
                if tokens[pos] == ",":
                    pos += 1
            pos += 1
            return items
        if tok.startswith('"'):
            return tok[1:-1]
        return int(tok) if re.fullmatch(r"-?\d+", tok) else tok

    def message(end):
        nonlocal pos
        fields = {}
        while pos < len(tokens) and tokens[pos] != end:
            name = tokens[pos]
            pos += 1
            if tokens[pos] == ":":
                pos += 1
            v = value()
            fields.setdefault(name, []).extend(v if isinstance(v, list) and name != "dims" else [v])
        pos += 1
        return fields

    return message(None)


# -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton")
    triton.main([str(root)])
    return root


@pytest.mark.parametrize("name", list(triton.MODELS))
def test_config_matches_onnx_runtime_view_of_the_model(repo, name):
    filename, want_inputs, want_outputs, _ = triton.MODELS[name]
    config = parse_pbtxt((repo / name / "config.pbtxt").read_text())
    session = ort.InferenceSession(str(contract.MODEL_DIR / filename), providers=["CPUExecutionProvider"])

    assert config["name"] == [name]
    assert config["backend"] == ["onnxruntime"]
    assert config["max_batch_size"] == [triton.MAX_BATCH]
    assert config["dynamic_batching"][0]["max_queue_delay_microseconds"] == [triton.MAX_QUEUE_DELAY_US]
    for section, tensors in (("input", session.get_inputs()), ("output", session.get_outputs())):
        got = {t["name"][0]: t for t in config[section]}
        assert list(got) == [t.name for t in tensors]  # every tensor of the graph, in graph order
        for t in tensors:
            assert isinstance(t.shape[0], str), f"{t.name}: batch axis must be dynamic"
            assert got[t.name]["dims"][0] == list(t.shape[1:])  # Triton's dims leave the batch axis out
            assert got[t.name]["data_type"] == [ORT_TO_TRITON[t.type]]
    assert [t.name for t in session.get_inputs()] == list(want_inputs)
    assert set(want_outputs) <= {t.name for t in session.get_outputs()}


def test_capsnet_config_spells_the_contract(repo):
    config = parse_pbtxt((repo / "capsnet" / "config.pbtxt").read_text())
    dims = {t["name"][0]: t["dims"][0] for t in config["input"] + config["output"]}
    for name in (*contract.CAPSNET_INPUTS, *contract.CAPSNET_OUTPUTS):
        assert dims[name] == list(contract.CAPSNET_SHAPES[name][1:])
    assert dims[contract.IMAGE] == [1, contract.IMAGE_SIZE, contract.IMAGE_SIZE]


def test_repository_models_are_the_exported_files_and_run_batched(repo, mnist_fixture):
    for name, (filename, *_) in triton.MODELS.items():
        assert (repo / name / "1" / "model.onnx").read_bytes() == (contract.MODEL_DIR / filename).read_bytes()
    images, _ = mnist_fixture
    session = ort.InferenceSession(str(repo / "capsnet" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    x = images[:3, None].astype(np.float32) / 255.0
    outputs = session.run(None, {contract.IMAGE: x})
    config = parse_pbtxt((repo / "capsnet" / "config.pbtxt").read_text())
    for out, spec in zip(outputs, config["output"]):
        assert list(out.shape) == [3, *spec["dims"][0]]


def test_config_is_valid_for_tritons_own_schema(repo):
    """Parse with Triton's ModelConfig protobuf (shipped in tritonclient) without importing grpc."""
    spec = importlib.util.find_spec("tritonclient")
    if spec is None:
        pytest.skip("tritonclient is not installed: Triton's ModelConfig schema check not run")
    from google.protobuf import text_format
    path = next(iter(spec.submodule_search_locations)) + "/grpc/model_config_pb2.py"
    module_spec = importlib.util.spec_from_file_location("_triton_model_config_pb2", path)
    pb2 = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(pb2)
    for name in triton.MODELS:
        config = text_format.Parse((repo / name / "config.pbtxt").read_text(), pb2.ModelConfig())
        assert config.name == name and config.max_batch_size == triton.MAX_BATCH
        assert config.WhichOneof("scheduling_choice") == "dynamic_batching"


def _tiny_model(path, batch_dim, output="lengths"):
    x = onnx.helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT, [batch_dim, 1, 28, 28])
    y = onnx.helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, [batch_dim, 1, 28, 28])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["image"], [output])], "g", [x], [y])
    onnx.save(onnx.helper.make_model(graph), str(path))


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


def test_parser_reads_lists_of_messages():
    text = 'name: "m" max_batch_size: 8 # note\ninput [ { name: "a" dims: [ 1, -1 ] }, { name: "b" dims: [ 2 ] } ]'
    assert parse_pbtxt(text) == {"name": ["m"], "max_batch_size": [8],
                                 "input": [{"name": ["a"], "dims": [[1, -1]]}, {"name": ["b"], "dims": [[2]]}]}
