"""Write a Triton Inference Server model repository of every shipped CapsNet, to serve them on a fleet.

$ python -m training.triton triton_repo                          # every shipped model (contract.SHIPPED)
$ python -m training.triton triton_repo --model mine=runs/export # one folder, named mine
$ python -m training.export --triton triton_repo                 # export, then the exported model
$ docker run --gpus=1 -p8000:8000 -v $PWD/triton_repo:/models nvcr.io/nvidia/tritonserver:<yy.mm>-py3 \
      tritonserver --model-repository=/models

    triton_repo/
      mnist/1/model.onnx               image -> lengths, capsules, routing, reconstruction, ...
      mnist/config.pbtxt
      mnist_decoder/1/model.onnx       capsules (masked) -> reconstruction
      mnist_decoder/config.pbtxt
      fashion-mnist/ ... multimnist/ ... affine/ ... (and their _decoder)

The names are the app's: GET /models and its Open Inference Protocol routes (/v2/models/NAME and
NAME_decoder), so a client moves between the two servers unchanged. config.pbtxt is generated from
the ONNX graph's own inputs and outputs (names, element types, shapes), read with the `onnx` package,
and checked against model/contract.py at the input size of the model's card: every contract name must
be in the graph with the contract's shape (the optional iteration outputs of dynamic routing, where the
graph has them, at the card's routing iterations), and the batch axis must be dynamic, since Triton's dynamic
batching (the same idea as the app's batcher) stacks requests along it. No torch needed.
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import onnx
from onnx import TensorProto

from model import contract

MAX_BATCH = 64  # the app's default CAPSNET_MAX_BATCH
MAX_QUEUE_DELAY_US = 2000  # the app's default CAPSNET_MAX_WAIT_MS = 2
DECODER = "_decoder"  # NAME_decoder beside NAME, as the app's Open Inference Protocol names them
TRITON_TYPES = {
    TensorProto.FLOAT: "TYPE_FP32",
    TensorProto.FLOAT16: "TYPE_FP16",
    TensorProto.BFLOAT16: "TYPE_BF16",
    TensorProto.DOUBLE: "TYPE_FP64",
    TensorProto.INT8: "TYPE_INT8",
    TensorProto.INT16: "TYPE_INT16",
    TensorProto.INT32: "TYPE_INT32",
    TensorProto.INT64: "TYPE_INT64",
    TensorProto.UINT8: "TYPE_UINT8",
    TensorProto.UINT16: "TYPE_UINT16",
    TensorProto.UINT32: "TYPE_UINT32",
    TensorProto.UINT64: "TYPE_UINT64",
    TensorProto.BOOL: "TYPE_BOOL",
    TensorProto.STRING: "TYPE_STRING",
}


def graph_io(path: Path) -> tuple[list[tuple], list[tuple]]:
    """[(name, triton type, shape)] of the graph's inputs and outputs; a symbolic axis is its name."""
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}

    def describe(value):
        t = value.type.tensor_type
        shape = tuple(d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in t.shape.dim)
        return value.name, TRITON_TYPES[t.elem_type], shape

    inputs = [describe(v) for v in graph.input if v.name not in initializers]
    return inputs, [describe(v) for v in graph.output]


def check_contract(path: Path, inputs, outputs, want_inputs, want_outputs, want_shapes) -> None:
    """Raise if the graph lacks a name of want_inputs or want_outputs, has another shape than want_shapes for
    any tensor that want_shapes names, or a fixed batch axis."""
    have = {name: shape for name, _, shape in inputs + outputs}
    if [name for name, _, _ in inputs] != list(want_inputs):
        raise ValueError(f"{path}: inputs {[n for n, _, _ in inputs]} != contract {list(want_inputs)}")
    missing = [name for name in want_outputs if name not in have]
    if missing:
        raise ValueError(
            f"{path}: outputs {missing} of model/contract.py are not in the graph "
            f"(it has {[n for n, _, _ in outputs]}); re-export the model"
        )
    for name in [name for name in have if name in want_shapes]:  # optional outputs too, where the graph has them
        if have[name] != tuple(want_shapes[name]):
            raise ValueError(
                f"{path}: {name} has shape {list(have[name])}, the contract says {list(want_shapes[name])}"
            )
    for name, shape in have.items():
        if not shape or isinstance(shape[0], int):
            raise ValueError(f"{path}: {name} has no dynamic batch axis ({list(shape)}); Triton cannot batch it")


def _tensor(name: str, dtype: str, shape: tuple) -> str:
    # with max_batch_size > 0, Triton's dims leave the batch axis out; -1 = any size
    dims = ", ".join(str(d) if isinstance(d, int) and d > 0 else "-1" for d in shape[1:])
    return f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: [ {dims} ]\n  }}'


def model_config(
    name: str, inputs, outputs, max_batch: int = MAX_BATCH, max_queue_delay_us: int = MAX_QUEUE_DELAY_US
) -> str:
    """config.pbtxt text (Triton's ModelConfig in protobuf text format)."""
    return "\n".join(
        [
            f'name: "{name}"',
            'backend: "onnxruntime"',
            f"max_batch_size: {max_batch}",
            "input [\n" + ",\n".join(_tensor(*t) for t in inputs) + "\n]",
            "output [\n" + ",\n".join(_tensor(*t) for t in outputs) + "\n]",
            "dynamic_batching {",
            f"  max_queue_delay_microseconds: {max_queue_delay_us}",
            "}",
            "# no instance_group: Triton places one instance on each GPU it sees, or on the CPU without one",
            "",
        ]
    )


def _external_data(path: Path) -> list[Path]:
    """Files an ONNX model keeps its large tensors in (none for ours, but they must travel with it)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    files = {
        entry.value
        for t in graph.initializer
        if t.data_location == TensorProto.EXTERNAL
        for entry in t.external_data
        if entry.key == "location"
    }
    return [path.parent / f for f in sorted(files)]


def graphs(model_dir: Path) -> dict[str, tuple]:
    """The two graphs of a model folder: suffix -> (ONNX file, contract inputs, contract outputs, shapes),
    the shapes at the input size and routing iterations its card names (the iteration outputs' too, which
    only dynamic routing's graphs have)."""
    card = json.loads((Path(model_dir) / contract.MODEL_CARD).read_text())
    size = card[contract.SERVING]["input"]["size"] if contract.SERVING in card else card["model_config"]["image_size"]
    shapes = contract.capsnet_shapes(size, card["model_config"]["routing_iters"])
    return {
        "": (contract.CAPSNET_ONNX, contract.CAPSNET_INPUTS, contract.CAPSNET_OUTPUTS, shapes),
        DECODER: (
            contract.DECODER_ONNX,
            contract.DECODER_INPUTS,
            contract.DECODER_OUTPUTS,
            {k: shapes[k] for k in contract.DECODER_INPUTS + contract.DECODER_OUTPUTS},
        ),
    }


def write_repository(
    repo: Path,
    models: dict[str, Path] | None = None,
    max_batch: int = MAX_BATCH,
    max_queue_delay_us: int = MAX_QUEUE_DELAY_US,
) -> list[Path]:
    """For each model folder, copy its two ONNX graphs into repo/NAME/1/ and repo/NAME_decoder/1/ and
    write their config.pbtxt.

    Args:
        repo: the model repository folder (created; the models' folders in it are replaced).
        models: name -> model folder (capsnet.onnx, decoder.onnx, capsnet.json); default: every shipped one.
        max_batch: Triton's max_batch_size; the ONNX batch axis allows up to 4096.
        max_queue_delay_us: how long Triton may hold a request to fill a batch.
    Returns:
        the config.pbtxt paths written.
    """
    models = models or dict(contract.SHIPPED)
    written = []
    for model_name, model_dir in models.items():
        for suffix, (filename, want_in, want_out, shapes) in graphs(model_dir).items():
            name = model_name + suffix
            source = Path(model_dir) / filename
            inputs, outputs = graph_io(source)
            check_contract(source, inputs, outputs, want_in, want_out, shapes)
            folder = Path(repo) / name
            shutil.rmtree(folder, ignore_errors=True)
            (folder / "1").mkdir(parents=True)
            shutil.copyfile(source, folder / "1" / "model.onnx")
            for extra in _external_data(source):
                shutil.copyfile(extra, folder / "1" / extra.name)
            config = folder / "config.pbtxt"
            config.write_text(model_config(name, inputs, outputs, max_batch, max_queue_delay_us))
            written.append(config)
    return written


def model_arg(text: str) -> tuple[str, Path]:
    """--model NAME (shipped) or NAME=DIR (contract.model_folder), its sentence as argparse's error."""
    try:
        return contract.model_folder(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv=None) -> list[Path]:
    p = argparse.ArgumentParser(prog="python -m training.triton", description=__doc__.splitlines()[0])
    p.add_argument("repo", type=Path, help="model repository folder to write")
    p.add_argument(
        "--model",
        type=model_arg,
        action="append",
        metavar="NAME[=DIR]",
        help="a model to write: a shipped one by name or a folder as NAME=DIR (repeatable); "
        "default: every shipped model",
    )
    p.add_argument("--max-batch", type=int, default=MAX_BATCH, help="Triton max_batch_size")
    p.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=MAX_QUEUE_DELAY_US,
        help="dynamic batching: longest wait to fill a batch, in microseconds",
    )
    args = p.parse_args(argv)
    if not 1 <= args.max_batch <= 4096:
        p.error("--max-batch must be in 1..4096 (the exported batch axis)")
    configs = write_repository(
        args.repo, dict(args.model) if args.model else None, args.max_batch, args.max_queue_delay_us
    )
    for config in configs:
        print(f"wrote {config.parent}/ (1/model.onnx, config.pbtxt)")
    return configs


if __name__ == "__main__":
    main()
    sys.exit(0)
