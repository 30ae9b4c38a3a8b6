"""What an ONNX node costs: its multiply-accumulate count (its module path: module_paths); and
what feeds it: constant sizes, the tensor a Q/DQ chain starts from; the nodes in an order that runs."""
from __future__ import annotations

import math

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


def _shapes(g, outer: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    """Known shapes of a graph's tensors (a subgraph also sees its outer graph's)."""
    out = dict(outer or {})
    for v in list(g.value_info) + list(g.input) + list(g.output):
        tt = v.type.tensor_type
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
            out[v.name] = dims
    for t in g.initializer:
        out[t.name] = list(t.dims)
    for n in g.node:                      # weights held by Constant nodes (some exporters, weight norm)
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = list(a.t.dims)
    return out


def _known(shape) -> bool:
    return shape is not None and all(d > 0 for d in shape)


def _macs(n, shapes: dict[str, list[int]]) -> int:
    try:
        if n.op_type in ("Conv", "ConvTranspose") and len(n.input) > 1:
            w, y, x = shapes.get(n.input[1]), shapes.get(n.output[0]), shapes.get(n.input[0])
            if _known(w) and _known(y):
                if n.op_type == "Conv":      # W: [Cout, Cin/g, k...] (1-D, 2-D, 3-D): each output element Cin/g * k
                    return math.prod(y) * math.prod(w[1:])
                if _known(x):                # W: [Cin, Cout/g, k...]; each input element: Cout/g * k
                    return math.prod(x) * math.prod(w[1:])
        elif n.op_type in ("MatMul", "Gemm"):
            a, y = shapes.get(n.input[0]), shapes.get(n.output[0])
            if _known(a) and _known(y):
                trans_a = any(at.name == "transA" and at.i for at in n.attribute)
                k = a[-2] if (n.op_type == "Gemm" and trans_a) else a[-1]
                return math.prod(y) * k
    except (IndexError, TypeError):
        pass
    return 0


def _graph_macs(g, outer: dict[str, list[int]] | None, out: dict[str, int] | None) -> int:
    """Total MACs of graph `g`, recording each named node's in `out`. A control-flow node (If,
    Loop, Scan) counts its costliest branch: a model whose body sits in an If is not free."""
    shapes = _shapes(g, outer)
    total = 0
    for n in g.node:
        macs = _macs(n, shapes)
        branches = [a.g for a in n.attribute if a.type == a.GRAPH]
        if branches:
            macs = max(_graph_macs(b, shapes, None) for b in branches)
        if out is not None and n.name:
            out[n.name] = int(macs)
        total += macs
    return total


def node_macs(model) -> dict[str, int]:
    """MACs per node name for Conv / ConvTranspose / MatMul / Gemm, and for control-flow nodes the
    MACs of their costliest branch (0 where shapes are unknown: dynamic dims without --input-shape)."""
    if not model.graph.value_info:
        try:                              # a model saved without intermediate shapes
            import onnx
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:                 # noqa: BLE001 - shapes are a nicety here, not a requirement
            pass
    out: dict[str, int] = {}
    _graph_macs(model.graph, None, out)
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
    """The tensor a chain of Q/DQ (and Identity) nodes starts from (`roi` for roi_QuantizeLinear_Output)."""
    n = producer.get(name)
    if n is None or n.op_type not in QDQ_OPS + ("Identity",) or seen > 6:
        return name
    return qdq_source(n.input[0], producer, seen + 1)


def topological_order(model) -> None:
    """Reorder the nodes so that each comes after the producers of its inputs (a repair that appended
    nodes); a graph with a cycle or a dangling input keeps its order."""
    g = model.graph
    known = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    pending, order = list(g.node), []
    while pending:
        ready = [n for n in pending if all(t in known for t in n.input)]
        if not ready:
            return
        ids = {id(n) for n in ready}
        order.extend(ready)
        for n in ready:
            known.update(n.output)
        pending = [n for n in pending if id(n) not in ids]
    del g.node[:]
    g.node.extend(order)
