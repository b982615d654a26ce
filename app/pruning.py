"""A graph cut down to some of its outputs: the nodes that none of them needs are left out, with their weights.

ONNX Runtime runs every node of a graph, whichever outputs a run fetches. A CapsNet graph pruned to the class
capsules (contract.CAPSULE_OUTPUTS) runs without the nodes of the routing maps' lengths and of the decoder,
which an answer without routing or reconstruction does not read: app/engine.py runs a lone request of that
kind on it (capsnet_lean).
"""

from collections.abc import Sequence


def prune(graph: bytes, outputs: Sequence[str]) -> bytes:
    """A serialized graph with only `outputs` of its outputs and the nodes they depend on (onnx's Extractor);
    its inputs stay as they were."""
    # onnx only here: a process that prunes nothing (on a GPU, one core, Ray Serve) never loads it (6.5 MB)
    import onnx
    from onnx import utils

    model = onnx.load_from_string(graph)
    weights = {tensor.name for tensor in model.graph.initializer}
    inputs = [value.name for value in model.graph.input if value.name not in weights]
    return utils.Extractor(model).extract_model(inputs, list(outputs)).SerializeToString()
