"""A graph's long convolutions written as matrix products of their patches, for a single image on a GPU.

At batch 1 PrimaryCaps' 9x9 stride-2 convolution has only 6 x 6 x 256 outputs, each a sum of 256 x 9 x 9 =
20,736 products (Sabour et al. 2017, section 4: 32 channels of 8D capsules, 256 inputs). An implicit-GEMM
convolution kernel gives each block of outputs to one of the GPU's cores, so a few cores do all the work; a
GEMM library splits such long sums over many (split-K). Written as a Gather of each output's patch and one
MatMul, the same arithmetic on an H200 replays a single image's CUDA graph in 0.29 ms against 1.03 ms, its
outputs within 3e-7 (benchmarks/results/run_binding_cuda.md). app/engine.py replays a single image on CUDA
through a graph made so (app/cuda_graph.py). On the CPU ONNX Runtime's own convolution is twice as fast as
the rewrite (benchmarks/results/run_binding.md), so CPU sessions keep the graph as it is.
"""

import numpy as np

MIN_REDUCTION = 4096  # the shortest dot product rewritten: PrimaryCaps' 20,736, not conv1's 81


def conv_as_matmul(graph: bytes, min_reduction: int = MIN_REDUCTION) -> bytes:
    """graph with each unpadded, ungrouped, undilated convolution whose dot products are at least `min_reduction`
    long (C x kh x kw) written as one matrix product of its patches: the input's pixels gathered into
    (N, OH*OW, C*kh*kw) rows by a Gather of fixed indices, MatMul with the weights as (C*kh*kw, O), the bias
    added, and the result laid out as the convolution's (N, O, OH, OW). Its input's channels, height and width
    must be known (shape inference); the batch axis may be free (each Reshape copies it). A convolution
    without them, or outside these bounds, stays as it is."""
    # onnx only here and in app/pruning.py: a process that rewrites no graph never loads it
    import onnx
    from onnx import helper, numpy_helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load_from_string(graph))
    infos = [*model.graph.value_info, *model.graph.input, *model.graph.output]
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in infos}
    weights = {w.name: w for w in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        weight = weights.get(node.input[1]) if node.op_type == "Conv" else None
        shape = shapes.get(node.input[0], []) if weight is not None else []
        if (
            weight is None
            or len(weight.dims) != 4
            or attrs.get("group", 1) != 1
            or any(attrs.get("pads", [0]))
            or any(d != 1 for d in attrs.get("dilations", [1]))
            or attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID")
            or len(shape) != 4
            or not all(shape[1:])
            or int(np.prod(weight.dims[1:])) < min_reduction
        ):
            nodes.append(node)
            continue
        (c, h, w), (o, _, kh, kw) = shape[1:], weight.dims
        sy, sx = attrs.get("strides", [1, 1])
        oh, ow = (h - kh) // sy + 1, (w - kw) // sx + 1
        rows = (np.arange(oh)[:, None] * sy + np.arange(kh)[None]) * w  # (oh, kh): each patch row's first pixel
        cols = np.arange(ow)[:, None] * sx + np.arange(kw)[None]  # (ow, kw)
        index = (rows[:, None, :, None] + cols[None, :, None, :]).reshape(oh * ow, kh * kw)
        name = node.output[0]
        matrix = numpy_helper.to_array(weight).reshape(o, c * kh * kw).T
        consts = {  # each shape's 0 copies the batch axis (Reshape)
            f"{name}_flat": np.array([0, c, h * w], np.int64),
            f"{name}_index": index.astype(np.int64),
            f"{name}_rows": np.array([0, oh * ow, c * kh * kw], np.int64),
            f"{name}_weight": np.ascontiguousarray(matrix),
            f"{name}_out": np.array([0, o, oh, ow], np.int64),
        }
        model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in consts.items())
        t = [f"{name}_{step}" for step in ("pixels", "patches", "moved", "matrix", "product", "biased", "back")]
        nodes += [
            helper.make_node("Reshape", [node.input[0], f"{name}_flat"], [t[0]]),
            helper.make_node("Gather", [t[0], f"{name}_index"], [t[1]], axis=2),  # (n, c, oh*ow, kh*kw)
            helper.make_node("Transpose", [t[1]], [t[2]], perm=[0, 2, 1, 3]),  # (n, oh*ow, c, kh*kw)
            helper.make_node("Reshape", [t[2], f"{name}_rows"], [t[3]]),
            helper.make_node("MatMul", [t[3], f"{name}_weight"], [t[4]]),  # (n, oh*ow, o)
        ]
        last = t[4]
        if len(node.input) > 2 and node.input[2]:
            nodes.append(helper.make_node("Add", [t[4], node.input[2]], [t[5]]))
            last = t[5]
        nodes += [
            helper.make_node("Transpose", [last], [t[6]], perm=[0, 2, 1]),
            helper.make_node("Reshape", [t[6], f"{name}_out"], [name]),
        ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    used = {i for node in model.graph.node for i in node.input}
    kept = [w for w in model.graph.initializer if w.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model.SerializeToString()
