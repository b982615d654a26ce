"""Export writes the contract's graphs, checks itself against PyTorch, and writes a model card."""

import hashlib
import json
from dataclasses import asdict

import numpy as np
import onnxruntime as ort
import pytest
import torch

from model import contract
from model.capsnet import CapsNet, CapsNetConfig
from model.card import Dimensions
from tests.conftest import without_iteration_outputs
from training import cards, data, export, graphs
from training.config import TrainConfig


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig()).eval()
    out = tmp_path_factory.mktemp("onnx")
    return model, *graphs.export(model, out)


@pytest.mark.slow
def test_graphs_follow_the_contract(exported):
    """Dynamic routing's CapsNet graph has the contract's outputs, then every routing iteration's."""
    _, capsnet_path, decoder_path = exported
    capsnet_outputs = contract.CAPSNET_OUTPUTS + contract.CAPSNET_ITERATION_OUTPUTS
    capsnet_shapes = contract.capsnet_shapes(contract.IMAGE_SIZE, CapsNetConfig().routing_iters)
    for path, inputs, outputs, shapes in [
        (capsnet_path, contract.CAPSNET_INPUTS, capsnet_outputs, capsnet_shapes),
        (decoder_path, contract.DECODER_INPUTS, contract.DECODER_OUTPUTS, contract.DECODER_SHAPES),
    ]:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert tuple(i.name for i in sess.get_inputs()) == inputs
        assert tuple(o.name for o in sess.get_outputs()) == outputs
        for node in sess.get_inputs() + sess.get_outputs():
            assert tuple(node.shape) == shapes[node.name], node.name
            assert node.type == "tensor(float)"


@pytest.mark.slow
def test_parity_at_batch_1_7_64(exported, mnist_fixture):
    model, capsnet_path, decoder_path = exported
    images, _ = mnist_fixture
    assert graphs.check_parity(model, capsnet_path, decoder_path, images) <= graphs.PARITY_TOL


@pytest.mark.slow
def test_iteration_outputs_are_the_models_own_routing(exported, mnist_fixture):
    """The graph's routing_iterations and logit_changes are what the PyTorch model's one forward routed
    with (model/routing.py: RoutingIterations), within the export's parity; batch 5 leaves the example's 2."""
    model, capsnet_path, _ = exported
    x = mnist_fixture[0][:5, None].astype(np.float32) / 255
    sess = ort.InferenceSession(str(capsnet_path), providers=["CPUExecutionProvider"])
    couplings, changes = sess.run(list(contract.CAPSNET_ITERATION_OUTPUTS), {contract.IMAGE: x})
    with torch.no_grad():
        iterations = model(torch.from_numpy(x)).iterations
    np.testing.assert_allclose(couplings, iterations.couplings.numpy(), rtol=0, atol=graphs.PARITY_TOL)
    np.testing.assert_allclose(changes, iterations.logit_changes.numpy(), rtol=0, atol=graphs.PARITY_TOL)
    assert changes.shape == (5, 3) and len(np.unique(changes[:, 0])) == 5  # one mean per image


@pytest.mark.slow
def test_routings_without_iterations_export_only_the_contracts_outputs(tmp_path, mnist_fixture):
    """QP routing has no iterations (one weighted sum): its graph has exactly CAPSNET_OUTPUTS, and its card
    says so; parity holds over them."""
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(routing="qp-l2")).eval()
    capsnet_path, decoder_path = graphs.export(model, tmp_path)
    sess = ort.InferenceSession(str(capsnet_path), providers=["CPUExecutionProvider"])
    assert tuple(o.name for o in sess.get_outputs()) == contract.CAPSNET_OUTPUTS
    assert list(cards.card_outputs(asdict(model.config))) == list(contract.CAPSNET_OUTPUTS)
    assert graphs.check_parity(model, capsnet_path, decoder_path, mnist_fixture[0], batches=(3,)) <= graphs.PARITY_TOL


@pytest.mark.slow
def test_parity_check_fails_on_a_different_model(exported, mnist_fixture):
    _, capsnet_path, decoder_path = exported
    torch.manual_seed(1)
    with pytest.raises(AssertionError, match="differ"):
        graphs.check_parity(CapsNet(CapsNetConfig()), capsnet_path, decoder_path, mnist_fixture[0], batches=(2,))


@pytest.mark.slow
def test_onnx_keeps_the_epsilons(exported):
    """A zero image gives dead capsules; without eps in the roots ONNX would produce NaN or 0 lengths."""
    model, capsnet_path, _ = exported
    sess = ort.InferenceSession(str(capsnet_path), providers=["CPUExecutionProvider"])
    outs = sess.run(None, {contract.IMAGE: np.zeros((2, 1, 28, 28), np.float32)})
    assert all(np.isfinite(o).all() for o in outs)
    with torch.no_grad():
        ref = model(torch.zeros(2, 1, 28, 28)).lengths.numpy()
    np.testing.assert_allclose(outs[0], ref, atol=1e-6)


@pytest.mark.slow
def test_cli_writes_the_card(tmp_path, idx_dir, mnist_fixture):
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig())
    ckpt = {
        "model": model.state_dict(),
        "config": asdict(model.config),
        "epoch": 1,
        "history": [{"epoch": 1, "val_acc": 0.5}],
        "train_seconds": 12.0,
        "hardware": "test",
        "precision": "fp32",
        "train_config": asdict(TrainConfig(epochs=3)),
    }
    torch.save(ckpt, tmp_path / "best.pt")
    export.main(
        ["--checkpoint", str(tmp_path / "best.pt"), "--out-dir", str(tmp_path / "m"), "--data-dir", str(idx_dir)]
    )
    card = json.loads((tmp_path / "m" / contract.MODEL_CARD).read_text())
    graph = tmp_path / "m" / contract.CAPSNET_ONNX
    assert card["version"] == hashlib.sha256(graph.read_bytes()).hexdigest()[:12]
    images, labels = (a[800:1000] for a in mnist_fixture)  # idx_dir's test split
    (lengths,) = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"]).run(
        [contract.LENGTHS], {contract.IMAGE: images[:, None].astype(np.float32) / 255}
    )
    wrong = np.flatnonzero(lengths.argmax(1) != labels).tolist()  # the graph's own errors, on this CPU
    assert card["misclassified"] == wrong and card["test_errors"] == len(wrong) and card["test_count"] == 200
    assert card["test_accuracy"] == pytest.approx(1 - len(wrong) / 200)
    assert card["parameters"] == 8_215_568 and card["parity_max_abs_diff"] <= graphs.PARITY_TOL
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    assert card["outputs"] == {o.name: o.shape for o in session.get_outputs()}  # the iterations' [N, 3, ...] too
    assert card["run_epochs"] == 3 and card["epochs"] == 1 and card["val_accuracy"] == 0.5
    assert card["train_config"]["epochs"] == 3 and "5,000 held-out" in card["selection"]
    serving = card[contract.SERVING]  # what the API reads (model/card.py), checked there against the graph
    assert serving["input"]["size"] == 28 and serving["preprocessing"] == {"kind": "digit", "ink_box": 20}
    assert serving["classes"] == [str(d) for d in range(10)] and serving["objects"] == 1
    assert serving["primary_capsules"] == {"types": 32, "dim": 8, "grid": 6, "count": 1152}
    dims = Dimensions.model_validate(card[contract.DIMENSIONS])  # measured on the examples the graph reads right
    right = {str(label) for label in np.delete(labels, wrong)}
    assert list(dims.classes) == serving["classes"] and {c for c, n in dims.examples_per_class.items() if n} == right


@pytest.mark.parametrize(
    "name, kind, size, objects",
    [
        ("mnist", "digit", 28, 1),
        ("fashion-mnist", "garment", 28, 1),
        ("multimnist", "digit-pair", 36, 2),
        ("affine", "digit", 40, 1),
    ],
)
def test_describe_writes_what_each_shipped_card_carries(tmp_path, few_of_each_class, name, kind, size, objects):
    """--describe rebuilds the serving section from a card's own fields (the shipped cards' is that) and
    measures the dimensions section on --data-dir's test set (here 6 images of each class); nothing else
    in the card changes."""
    shipped = json.loads((contract.SHIPPED[name] / contract.MODEL_CARD).read_text())
    for graph in (contract.CAPSNET_ONNX, contract.DECODER_ONNX):
        (tmp_path / graph).symlink_to(contract.SHIPPED[name] / graph)
    written = {k: v for k, v in shipped.items() if k not in (contract.SERVING, contract.DIMENSIONS)}
    (tmp_path / contract.MODEL_CARD).write_text(json.dumps(written))
    data_dir = few_of_each_class["fashion-mnist" if name == "fashion-mnist" else "mnist"]
    card = export.main(["--describe", str(tmp_path), "--data-dir", str(data_dir)])[str(tmp_path)]
    assert card == json.loads((tmp_path / contract.MODEL_CARD).read_text())
    dims = Dimensions.model_validate(card.pop(contract.DIMENSIONS))
    assert card == {k: v for k, v in shipped.items() if k != contract.DIMENSIONS}
    serving = card[contract.SERVING]
    assert (serving["preprocessing"]["kind"], serving["input"]["size"], serving["objects"]) == (kind, size, objects)
    assert serving["primary_capsules"]["grid"] == contract.primary_grid(size)
    assert list(dims.classes) == serving["classes"] and min(dims.examples_per_class.values()) >= 3
    assert all([e.dim for e in entries] == list(range(contract.CAPSULE_DIM)) for entries in dims.classes.values())


def test_a_card_names_files_by_their_place_in_the_repository_or_their_name(tmp_path):
    """portable: a path inside the repository is written relative to its root, any other absolute path by its
    name, at any depth; what is not an absolute path stays as it was; write_card writes the card so."""
    card = {
        "train_config": {"data_dir": str(cards.REPO / "data" / "mnist"), "out": "/tmp/gpu/run", "seed": 0},
        "fine_tune": {"fonts": ["/usr/share/fonts/dejavu/DejaVuSans.ttf"], "model_dir": "models/mnist"},
        "selection": "kept the epoch of best accuracy on the 5,000 held-out images / of 60,000",
    }
    want = {
        "train_config": {"data_dir": "data/mnist", "out": "run", "seed": 0},
        "fine_tune": {"fonts": ["DejaVuSans.ttf"], "model_dir": "models/mnist"},
        "selection": card["selection"],
    }
    assert cards.portable(card) == want
    cards.write_card(tmp_path, card)
    assert json.loads((tmp_path / contract.MODEL_CARD).read_text()) == want


def test_dimensions_are_measured_on_the_data_here_when_the_trainers_folder_is_not(
    tmp_path, idx_dir, few_of_each_class, monkeypatch
):
    """A card trained on another machine (a GPU window's) names that machine's data folder: the dimensions are
    measured on it where it is here too (a folder of the repository: by its place there), else on data/<dataset>."""
    monkeypatch.setitem(data.DEFAULT_DIRS, "mnist", few_of_each_class["mnist"])  # 60 test images
    card = {
        "dataset": "mnist",
        "train_config": {"dataset": "mnist", "data_dir": str(tmp_path / "a-gpu-machines-folder")},
        "model_config": {"image_size": 28},
    }
    images, labels, _ = cards.dimension_examples(card)
    assert images.shape == (60, 28, 28) and labels.shape == (60, 1)
    card["train_config"]["data_dir"] = str(idx_dir)  # 200 test images
    assert cards.dimension_examples(card)[0].shape == (200, 28, 28)
    monkeypatch.setattr(cards, "REPO", idx_dir.parent)  # a card names a folder of the repository by its place there
    card["train_config"]["data_dir"] = idx_dir.name
    assert cards.dimension_examples(card)[0].shape == (200, 28, 28)


@pytest.mark.slow
def test_weights_are_stored_as_fp16_only_when_that_is_lossless(exported, tmp_path, mnist_fixture):
    """A model whose weights are fp16 values (an fp16 checkpoint's) ships at about half the size and
    still matches PyTorch; a model with weights fp16 would round keeps its fp32 file."""
    import onnx

    model, capsnet_path, _ = exported
    assert not graphs.store_fp16_if_lossless(capsnet_path)  # random fp32 weights: left as they are
    rounded = CapsNet(CapsNetConfig()).eval()
    rounded.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})
    half_path, _ = graphs.export(rounded, tmp_path)  # export() stores them as fp16 itself
    stored = {t.data_type for t in onnx.load(str(half_path)).graph.initializer if np.prod(t.dims) >= 1024}
    assert stored == {onnx.TensorProto.FLOAT16}
    assert half_path.stat().st_size < 0.55 * capsnet_path.stat().st_size
    parity = graphs.check_parity(rounded, half_path, tmp_path / contract.DECODER_ONNX, mnist_fixture[0], batches=(4,))
    assert parity < 1e-5  # the graph computes with exactly the PyTorch model's weights


@pytest.mark.slow
def test_the_graphs_load_without_a_warning(exported, capfd):
    """The exporter's CastLikes are written as Casts, which ONNX Runtime folds; of a CastLike it warns
    twice at every session ("Could not find a CPU kernel and hence can't constant fold CastLike node")."""
    import onnx

    for path in exported[1:]:
        assert "CastLike" not in {node.op_type for node in onnx.load(str(path)).graph.node}
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # ONNX Runtime's default: warnings
    assert "CastLike" not in capfd.readouterr().err


@pytest.mark.slow
def test_dynamic_routing_exports_as_matmuls(exported):
    """Procedure 1 reaches ONNX as MatMul nodes: ONNX Runtime's CPU Einsum took most of the routing's time."""
    import onnx

    ops = {node.op_type for node in onnx.load(str(exported[1])).graph.node}
    assert "MatMul" in ops and "Einsum" not in ops


@pytest.mark.slow
def test_reexport_rebuilds_the_same_function_from_the_graphs(exported, tmp_path, idx_dir):
    """model_from_graphs recovers every weight; reexport replaces the graphs and keeps the card's figures.
    From a graph exported before the iteration outputs, it compares the outputs both have and gives the
    new graph and its card the iteration outputs."""
    model, capsnet_path, decoder_path = exported
    card = {
        "version": "old",
        "test_accuracy": 0.5,
        "model_config": asdict(CapsNetConfig()),
        "train_config": asdict(TrainConfig(dataset="mnist")),
        "outputs": {},
    }
    exported_dir = tmp_path / "exported"
    exported_dir.mkdir()
    for path in (capsnet_path, decoder_path):
        (exported_dir / path.name).write_bytes(path.read_bytes())
    (exported_dir / contract.MODEL_CARD).write_text(json.dumps(card))
    folder = without_iteration_outputs(exported_dir, tmp_path / "model")
    rebuilt = graphs.model_from_graphs(folder).state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(rebuilt[name], value), name
    new = export.reexport(folder, idx_dir)
    assert new["test_accuracy"] == 0.5 and new["version"] == graphs.sha256(folder / contract.CAPSNET_ONNX)[:12]
    assert new["reexport"]["previous_version"] == "old" and new["reexport"]["changed_predictions"] == 0
    assert new["reexport"]["max_abs_diff_vs_previous"] <= graphs.PARITY_TOL
    sess = ort.InferenceSession(str(folder / contract.CAPSNET_ONNX), providers=["CPUExecutionProvider"])
    shapes = contract.capsnet_shapes(contract.IMAGE_SIZE, CapsNetConfig().routing_iters)
    assert list(new["outputs"]) == [*contract.CAPSNET_OUTPUTS, *contract.CAPSNET_ITERATION_OUTPUTS]
    assert new["outputs"] == {o.name: list(shapes[o.name]) for o in sess.get_outputs()}


@pytest.mark.slow
def test_reexport_refuses_a_graph_that_is_not_the_cards_model(exported, tmp_path, idx_dir):
    """A card whose model_config does not describe the graph (other sizes) fails the strict load."""
    _, capsnet_path, decoder_path = exported
    for path in (capsnet_path, decoder_path):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    card = {
        "version": "old",
        "model_config": asdict(CapsNetConfig(caps_dim=8)),
        "train_config": asdict(TrainConfig(dataset="mnist")),
    }
    (tmp_path / contract.MODEL_CARD).write_text(json.dumps(card))
    with pytest.raises(RuntimeError, match="size mismatch"):
        export.reexport(tmp_path, idx_dir)
    assert json.loads((tmp_path / contract.MODEL_CARD).read_text())["version"] == "old"
