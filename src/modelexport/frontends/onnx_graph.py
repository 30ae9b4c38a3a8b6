"""What an ONNX node costs: its multiply-accumulate count (its module path: module_paths); and
what feeds it: constant sizes, the tensor a Q/DQ chain starts from."""
from __future__ import annotations

import math

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def _shapes(model) -> dict[str, list[int]]:
    out = {}
    g = model.graph
    for v in list(g.value_info) + list(g.input) + list(g.output):
        tt = v.type.tensor_type
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            out[v.name] = dims
    for t in g.initializer:
        out[t.name] = list(t.dims)
    return out


def _known(shape) -> bool:
    return shape is not None and all(d > 0 for d in shape)


def node_macs(model) -> dict[str, int]:
    """MACs per node name for Conv / ConvTranspose / MatMul / Gemm (0 where shapes are unknown)."""
    shapes = _shapes(model)
    out: dict[str, int] = {}
    for n in model.graph.node:
        macs = 0
        try:
            if n.op_type in ("Conv", "ConvTranspose") and len(n.input) > 1:
                w, y = shapes.get(n.input[1]), shapes.get(n.output[0])
                x = shapes.get(n.input[0])
                if _known(w) and _known(y):
                    if n.op_type == "Conv":      # W: [Cout, Cin/g, k...]; each output element: Cin/g * k
                        macs = math.prod(y) * math.prod(w[1:])
                    elif _known(x):              # W: [Cin, Cout/g, k...]; each input element: Cout/g * k
                        macs = math.prod(x) * math.prod(w[1:])
            elif n.op_type in ("MatMul", "Gemm"):
                a, y = shapes.get(n.input[0]), shapes.get(n.output[0])
                if _known(a) and _known(y):
                    trans_a = any(at.name == "transA" and at.i for at in n.attribute)
                    k = a[-2] if (n.op_type == "Gemm" and trans_a) else a[-1]
                    macs = math.prod(y) * k
        except (IndexError, TypeError):
            macs = 0
        if n.name:
            out[n.name] = int(macs)
    return out


def constant_sizes(graph) -> dict[str, int]:
    """Element count of every constant tensor: initializers and Constant nodes' values."""
    sizes = {t.name: math.prod(t.dims) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    sizes[n.output[0]] = math.prod(a.t.dims)
    return sizes


def qdq_source(name: str, producer: dict, seen: int = 0) -> str:
    """The tensor a chain of Q/DQ nodes starts from (`roi` for roi_QuantizeLinear_Output)."""
    n = producer.get(name)
    if n is None or n.op_type not in QDQ_OPS or seen > 4:
        return name
    return qdq_source(n.input[0], producer, seen + 1)
