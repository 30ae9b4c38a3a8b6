"""Small in-place edits of an ONNX graph for the repairs: producer and consumer lookups, nodes
marked dead, tensors renamed to others, new float initializers; `commit()` writes them back (a graph
output that was renamed away keeps its name through an Identity; the value_info of tensors gone or
retyped goes with them, as does any without a shape)."""
from __future__ import annotations

import numpy as np

from ...frontends.onnx_graph import topological_order  # noqa: F401 - the repairs' shared edits


class GraphEdit:
    """The model's nodes with producer/consumer lookups; edits are collected and written by commit()."""

    def __init__(self, model):
        from onnx import numpy_helper
        self.model = model
        self.nodes = list(model.graph.node)
        self.inits = {t.name: t for t in model.graph.initializer}
        self.arrays = {k: numpy_helper.to_array(t) for k, t in self.inits.items()}
        self.outputs = {o.name for o in model.graph.output}
        self.dead: set[int] = set()
        self.new_inits: dict[str, np.ndarray] = {}
        self.rename: dict[str, str] = {}
        self.retyped: set[str] = set()         # tensors whose element type an edit changed: their value_info goes

    def producer(self, t: str):
        return next((n for n in self.nodes if t in n.output and id(n) not in self.dead), None)

    def consumers(self, t: str) -> list:
        return [n for n in self.nodes if t in n.input and id(n) not in self.dead]

    def const(self, t: str) -> np.ndarray | None:
        return self.new_inits.get(t, self.arrays.get(t))

    def commit(self) -> None:
        from onnx import helper, numpy_helper
        g = self.model.graph
        keep = [n for n in self.nodes if id(n) not in self.dead]
        for n in keep:
            for i, t in enumerate(n.input):
                n.input[i] = self._resolve(t)
        extra = []
        for out in self.outputs:               # a graph output that was a dropped DQ: an Identity keeps its name
            src = self._resolve(out)
            if src != out:
                extra.append(helper.make_node("Identity", [src], [out], name=f"{out}_dequantized"))
            elif out in self.new_inits:
                extra.append(helper.make_node("Identity", [out + "_w"], [out], name=f"{out}_dequantized"))
                self.new_inits[out + "_w"] = self.new_inits.pop(out)
        del g.node[:]
        g.node.extend(keep + extra)
        produced = {o for n in g.node for o in n.output}
        # and those with a type but no shape (inferred past an op ONNX does not know): the checker refuses them
        stale = [v for v in g.value_info if v.name in self.retyped or v.name not in produced
                 or (v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape"))]
        for v in stale:
            g.value_info.remove(v)
        used = {t for n in g.node for t in n.input}
        kept = [t for t in g.initializer if t.name in used and t.name not in self.new_inits]
        del g.initializer[:]
        g.initializer.extend(kept + [numpy_helper.from_array(a, k) for k, a in self.new_inits.items() if k in used])

    def _resolve(self, t: str) -> str:
        seen = set()
        while t in self.rename and t not in seen:
            seen.add(t)
            t = self.rename[t]
        return t


def drop_identities(edit: GraphEdit, kept_input) -> list[str]:
    """Drop every two-input node that returns one of its inputs unchanged: `kept_input(node, consts)`
    (consts: each input's constant value or None) gives the index of the input the node returns, or
    None. Readers of the node's output read that input instead; → the names of the nodes dropped."""
    dropped = []
    for n in edit.nodes:
        if len(n.input) != 2 or id(n) in edit.dead:
            continue
        k = kept_input(n, [edit.const(i) for i in n.input])
        if k is None:
            continue
        edit.rename[n.output[0]] = n.input[k]
        edit.dead.add(id(n))
        dropped.append(n.name or n.output[0])
    return dropped


def ops_of(model, op_type: str) -> list:
    """The default-domain nodes of `op_type`."""
    return [n for n in model.graph.node if n.op_type == op_type and n.domain in ("", "ai.onnx")]


def scalar_initializer(model, name: str, value: float) -> str:
    """A float32 scalar initializer `name` (added once) → its name."""
    from onnx import numpy_helper
    if not any(t.name == name for t in model.graph.initializer):
        model.graph.initializer.append(numpy_helper.from_array(np.array(value, np.float32), name))
    return name


def default_opset(model) -> int:
    """The model's default-domain opset version (0 when it imports none)."""
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


NUMPY_OF = {1: np.float32, 10: np.float16, 11: np.float64}     # ONNX float element type → numpy dtype


def elem_types(model) -> dict[str, int]:
    """Element type of every tensor ONNX's shape inference can name (a float16 Exp needs a float16 floor)."""
    import onnx
    try:
        g = onnx.shape_inference.infer_shapes(model).graph
    except Exception:                            # noqa: BLE001 - no types known: float32, the common case
        g = model.graph
    infos = list(g.value_info) + list(g.input) + list(g.output)
    out = {v.name: v.type.tensor_type.elem_type for v in infos}
    out |= {t.name: t.data_type for t in g.initializer}
    return out


def static_shapes(model) -> dict[str, list[int]]:
    """Every tensor's shape that ONNX's shape inference knows in full (all dims > 0), by name."""
    import onnx
    inferred = onnx.shape_inference.infer_shapes(model).graph
    out = {}
    for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
        d = [x.dim_value if x.HasField("dim_value") else -1 for x in v.type.tensor_type.shape.dim]
        if d and min(d) > 0:
            out[v.name] = d
    return out


def sum_nodes(terms: list[str], out: str, base: str) -> list:
    """Add nodes that sum `terms` in order into `out` (the partial sums named `{base}/sumJ`)."""
    from onnx import helper
    nodes, acc = [], terms[0]
    for j, t in enumerate(terms[1:], 1):
        y = out if j == len(terms) - 1 else f"{base}/sum{j}"
        nodes.append(helper.make_node("Add", [acc, t], [y], name=f"{base}/Add{j}"))
        acc = y
    return nodes


def replace_node(graph, node, new: list) -> None:
    """`new` in `node`'s place in the graph's node list, in order."""
    at = list(graph.node).index(node)
    graph.node.remove(node)
    for k, m in enumerate(new):
        graph.node.insert(at + k, m)


def names_read(nodes) -> set[str]:
    """Every tensor name the nodes read, inside If/Loop bodies too (they may read outer tensors)."""
    out = set()
    for n in nodes:
        out.update(n.input)
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                out |= names_read(sub.node)
    return out


def reader_counts(graph) -> dict[str, int]:
    """How many node inputs read each tensor."""
    readers: dict[str, int] = {}
    for n in graph.node:
        for t in n.input:
            readers[t] = readers.get(t, 0) + 1
    return readers


def replace_with_affine(model, node, scale: np.ndarray, shift: np.ndarray | None, rank: int) -> str:
    """`node` (one input x, one output) becomes x · scale [+ shift], per channel (axis 1 of a rank-`rank`
    tensor), in its place: Mul, then Add when there is a shift. → the name the new nodes start with."""
    from onnx import helper, numpy_helper
    shape = [-1] + [1] * (rank - 2)
    base = node.name or node.output[0]
    s_name, b_name, mid = f"{base}/scale", f"{base}/shift", f"{base}/scaled"
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(scale).reshape(shape).astype(np.float32), s_name))
    new = [helper.make_node("Mul", [node.input[0], s_name], [mid if shift is not None else node.output[0]], name=f"{base}/Mul")]
    if shift is not None:
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(shift).reshape(shape).astype(np.float32), b_name))
        new.append(helper.make_node("Add", [mid, b_name], [node.output[0]], name=f"{base}/Add"))
    at = list(model.graph.node).index(node)
    model.graph.node.remove(node)
    for n in reversed(new):
        model.graph.node.insert(at, n)
    return base
