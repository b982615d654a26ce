"""A CapsNet's two ONNX graphs (capsnet.onnx, decoder.onnx): written, checked against PyTorch, read back.

Both graphs have a dynamic batch axis and the names of model/contract.py. Like timm's onnx_export, an
export checks itself: ONNX Runtime must match PyTorch on real test images at batch sizes PARITY_BATCHES
(max |diff| <= PARITY_TOL, same argmax) or check_parity raises. model_from_graphs reads a model folder's
weights back into PyTorch; compare_graphs measures two graphs against each other.
"""

import hashlib
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn as nn
from onnx import numpy_helper

from model import contract
from model.capsnet import CapsNet, CapsNetConfig, capsule_length, mask_capsules

OPSET = 18
PARITY_BATCHES = (1, 7, 64)
PARITY_TOL = 1e-4
# The exporter warns at each export that torchvision's detection ops (nms, roi_align, ...) are skipped
# when torchvision is not installed: a CapsNet uses none of them
logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)


class ExportedCapsNet(nn.Module):
    """image -> (lengths, capsules, routing, reconstruction, vote_lengths), contract.CAPSNET_OUTPUTS, and
    for dynamic routing (routing_iterations, logit_changes), contract.CAPSNET_ITERATION_OUTPUTS.

    vote_lengths = ||u_hat_j|i|| lets the service draw where each digit's support comes from
    (sum over the 32 primary types of c_ij ||u_hat_j|i|| on the 6x6 grid) without a second pass.
    Every routing fills the same outputs (model/routing.py): for em, lengths are the activations a_j,
    capsules the flattened 4x4 poses, routing the responsibilities R_ij and vote_lengths the
    Frobenius norms of the votes V_ij; for qp, routing is the learned b_ij (any sign, rows free).
    Dynamic routing's graphs also show Procedure 1 iteration by iteration, from the same forward
    (model/routing.py: RoutingIterations): the c_ij of every iteration (Eq. 3) and, per image, the mean
    |delta b_ij| = |u_hat_j|i . v_j| each adds to the logits (Fig. A.1).
    """

    def __init__(self, model: CapsNet):
        super().__init__()
        if model.decoder is None:
            raise ValueError(
                "the serving contract needs a reconstruction: export a model trained "
                "with its decoder (without --no-reconstruction)"
            )
        self.model = model
        c = model.config
        self.outputs = tuple(contract.capsnet_outputs(c.image_size, c.routing, c.routing_iters))

    def forward(self, image: torch.Tensor):
        out = self.model(image)
        outputs = out.lengths, out.capsules, out.routing, out.reconstruction, capsule_length(out.votes)
        return outputs if out.iterations is None else (*outputs, *out.iterations)


class ExportedDecoder(nn.Module):
    """capsules (already masked) -> reconstruction."""

    def __init__(self, model: CapsNet):
        super().__init__()
        if model.decoder is None:
            raise ValueError(
                "no decoder to export: export a model trained with its decoder (without --no-reconstruction)"
            )
        self.decoder = model.decoder

    def forward(self, capsules: torch.Tensor):
        return self.decoder(capsules)


def _export(module: nn.Module, example: torch.Tensor, path: Path, inputs, outputs) -> None:
    batch = torch.export.Dim("N", min=1, max=4096)
    # NOTE optimize=False: onnxscript's optimizer folds `x + 1e-8` away, dropping the epsilon inside
    # the square roots of squash and of the length (lengths then differ from PyTorch by up to
    # sqrt(eps) = 1e-4 and a zero capsule gives NaN). ONNX Runtime optimises the graph at load anyway.
    with warnings.catch_warnings():  # torch.export's own use of an API it deprecates, not ours
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning)
        program = torch.onnx.export(
            module,
            (example,),
            dynamo=True,
            opset_version=OPSET,
            input_names=list(inputs),
            output_names=list(outputs),
            dynamic_shapes=({0: batch},),
            optimize=False,
            verbose=False,
        )
    assert program is not None  # dynamo=True returns the ONNXProgram (only the TorchScript exporter returns None)
    program.save(str(path))


def casts_for_castlikes(path: Path) -> None:
    """Rewrite each CastLike(x, like) of the graph whose `like` has a type shape inference knows as Cast(x,
    to=that type), the same operation: the exporter writes a few, which ONNX Runtime can neither run on
    its CPU provider at load nor fold (a warning each, at every session); Casts it folds."""
    graph = onnx.load(str(path))
    inferred = onnx.shape_inference.infer_shapes(graph).graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.value_info, *inferred.input, *inferred.output]}
    types.update({t.name: t.data_type for t in graph.graph.initializer})
    rewritten = False
    for k, node in enumerate(graph.graph.node):
        if node.op_type == "CastLike" and types.get(node.input[1]):
            cast = onnx.helper.make_node(
                "Cast", [node.input[0]], list(node.output), name=node.name, to=types[node.input[1]]
            )
            graph.graph.node[k].CopyFrom(cast)
            rewritten = True
    if rewritten:
        onnx.save(graph, str(path))


def store_fp16_if_lossless(path: Path, min_size: int = 1024) -> bool:
    """Store the graph's large fp32 weights as fp16, each followed by a Cast back to fp32, when every
    one of them is exactly an fp16 value (weights from a compact fp16 checkpoint, training/compact.py):
    half the file, and ONNX Runtime computes with the very same fp32 values (it folds the Casts at
    load). Returns whether it did; a graph with any weight that fp16 would round is left as it is."""
    graph = onnx.load(str(path))
    large = [
        t for t in graph.graph.initializer if t.data_type == onnx.TensorProto.FLOAT and int(np.prod(t.dims)) >= min_size
    ]
    values = {t.name: numpy_helper.to_array(t) for t in large}
    if not large or any(not np.array_equal(v.astype(np.float16).astype(np.float32), v) for v in values.values()):
        return False
    casts = []
    for t in large:
        name = t.name
        t.CopyFrom(numpy_helper.from_array(values[name].astype(np.float16), f"{name}.fp16"))
        casts.append(
            onnx.helper.make_node("Cast", [f"{name}.fp16"], [name], to=onnx.TensorProto.FLOAT, name=f"{name}.cast")
        )
    nodes = casts + list(graph.graph.node)
    del graph.graph.node[:]
    graph.graph.node.extend(nodes)
    onnx.save(graph, str(path))
    return True


def export(model: CapsNet, out_dir: Path) -> tuple[Path, Path]:
    """Write capsnet.onnx and decoder.onnx (example batch of 2 so no axis is specialised to 1), with Casts
    for the exporter's CastLikes (casts_for_castlikes) and their weights stored as fp16 where that is
    lossless (store_fp16_if_lossless)."""
    model = model.eval().cpu()
    model = model.to(memory_format=torch.contiguous_format)  # type: ignore[call-overload]  # stub omits memory_format
    out_dir.mkdir(parents=True, exist_ok=True)
    size, c = model.config.image_size, model.config
    capsnet_path, decoder_path = out_dir / contract.CAPSNET_ONNX, out_dir / contract.DECODER_ONNX
    exported = ExportedCapsNet(model).eval()
    with torch.no_grad():
        _export(exported, torch.rand(2, 1, size, size), capsnet_path, contract.CAPSNET_INPUTS, exported.outputs)
        _export(
            ExportedDecoder(model).eval(),
            torch.rand(2, c.num_classes, c.caps_dim),
            decoder_path,
            contract.DECODER_INPUTS,
            contract.DECODER_OUTPUTS,
        )
    for path in (capsnet_path, decoder_path):
        casts_for_castlikes(path)
        store_fp16_if_lossless(path)
    return capsnet_path, decoder_path


@torch.no_grad()
def check_parity(
    model: CapsNet,
    capsnet_path: Path,
    decoder_path: Path,
    images: np.ndarray,
    batches=PARITY_BATCHES,
    tol: float = PARITY_TOL,
) -> float:
    """Max |ORT - PyTorch| over every output (the iteration outputs too, for dynamic routing) at each batch
    size; raises if above tol or argmax differs."""
    sess = ort.InferenceSession(str(capsnet_path), providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(decoder_path), providers=["CPUExecutionProvider"])
    exported = ExportedCapsNet(model.eval().cpu())
    worst = 0.0
    for n in batches:
        x = images[:n, None].astype(np.float32) / 255.0
        ours = sess.run(list(exported.outputs), {contract.IMAGE: x})
        ref = exported(torch.from_numpy(x))
        masked = mask_capsules(ref[1], ref[0].argmax(1))
        (recon,) = dec.run(None, {contract.CAPSULES: masked.numpy()})
        pairs = [*list(zip(exported.outputs, ours, ref, strict=True)), ("decoder", recon, ref[3])]
        for name, got, want in pairs:
            want = want.numpy()
            if got.shape != want.shape:
                raise AssertionError(f"{name}: ONNX shape {got.shape} != PyTorch {want.shape} at batch {n}")
            worst = max(worst, float(np.abs(got - want).max()))
        if not np.array_equal(ours[0].argmax(1), ref[0].numpy().argmax(1)):
            raise AssertionError(f"ONNX and PyTorch predict different classes at batch {n}")
    if worst > tol:
        raise AssertionError(f"ONNX differs from PyTorch by {worst:.2e} > {tol:.0e}")
    return worst


def stored_weights(path: Path) -> str:
    """How a graph stores its weights: "fp32", or "fp16" (cast to fp32 in the graph, store_fp16_if_lossless)."""
    types = {t.data_type for t in onnx.load(str(path), load_external_data=False).graph.initializer}
    return "fp16" if onnx.TensorProto.FLOAT16 in types else "fp32"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_from_graphs(model_dir: Path) -> CapsNet:
    """The PyTorch model whose weights a model folder's capsnet.onnx holds, built from its card's
    model_config; weights stored as fp16 (store_fp16_if_lossless) come back as the fp32 they stand for.
    Every parameter must be found (a strict load), so a graph from other code fails here."""
    card = json.loads((model_dir / contract.MODEL_CARD).read_text())
    model = CapsNet(CapsNetConfig(**card["model_config"]))
    prefix = "model."  # ExportedCapsNet's attribute
    state = {}
    for tensor in onnx.load(str(model_dir / contract.CAPSNET_ONNX)).graph.initializer:
        name = tensor.name.removesuffix(".fp16")
        if name.startswith(prefix) and name[len(prefix) :] in model.state_dict():
            state[name[len(prefix) :]] = torch.from_numpy(numpy_helper.to_array(tensor).astype(np.float32))
    model.load_state_dict(state)
    return model.eval()


def compare_graphs(old: Path, new: Path, images: np.ndarray, batch_size: int = 64) -> tuple[float, int]:
    """Max |new - old| over every output the two graphs share on images (N, S, S) uint8, and on how many
    the argmax of lengths differs."""
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (old, new)]
    new_names = {o.name for o in sessions[1].get_outputs()}
    shared = [o.name for o in sessions[0].get_outputs() if o.name in new_names]
    lengths = shared.index(contract.LENGTHS)
    worst, differ = 0.0, 0
    for start in range(0, len(images), batch_size):
        x = images[start : start + batch_size, None].astype(np.float32) / 255.0
        a, b = (s.run(shared, {contract.IMAGE: x}) for s in sessions)
        worst = max(worst, *(float(np.abs(p - q).max()) for p, q in zip(a, b, strict=True)))
        differ += int((a[lengths].argmax(1) != b[lengths].argmax(1)).sum())
    return worst, differ
