"""`drop-empty-optional-inputs`: optional inputs given as empty constants become absent ('').

Exporters (paddle2onnx) write Resize's unused `roi` as a constant of shape (0,). Quantized, that
constant gets a Q/DQ pair and QNN cannot create a tensor of zero elements (`Failed to create
tensor for node ..._DequantizeLinear ... error code: 7004`, then `Failed to compose Qnn graph`).
An absent input means the same. The table says from which opset each input may be absent:
below it, `opset-upgrade` converts the model first.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair
from .graph_edit import default_opset

# (op type, input index) → first opset where the input is optional
OPTIONAL_INPUTS: dict[tuple[str, int], int] = {
    ("Resize", 1): 13,    # roi
    ("Resize", 2): 13,    # scales (when sizes is given)
}


def empty_constants(model) -> set[str]:
    """Names of initializers and Constant outputs holding zero elements."""
    out = {t.name for t in model.graph.initializer if 0 in t.dims}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value" and 0 in n.attribute[0].t.dims:
            out.add(n.output[0])
    return out


def empty_optional_inputs(model) -> list[tuple[object, int]]:
    """(node, input index) pairs that are optional inputs fed an empty constant."""
    empty = empty_constants(model)
    return [(n, i) for n in model.graph.node for i, x in enumerate(n.input)
            if (n.op_type, i) in OPTIONAL_INPUTS and x in empty]


def needed_opset(model) -> int | None:
    found = [OPTIONAL_INPUTS[(n.op_type, i)] for n, i in empty_optional_inputs(model)]
    return max(found) if found else None


@onnx_repair("drop-empty-optional-inputs", 50, "empty optional inputs (Resize roi / scales) become absent")
def drop_empty_optional_inputs(model, ctx: RepairContext) -> dict | None:
    opset = default_opset(model)
    hits = [(n, i) for n, i in empty_optional_inputs(model) if opset >= OPTIONAL_INPUTS[(n.op_type, i)]]
    if not hits:
        return None
    for n, i in hits:
        n.input[i] = ""
    # unused empty constants would still be quantized; drop them
    used = {x for n in model.graph.node for x in n.input}
    keep = [n for n in model.graph.node if not (n.op_type == "Constant" and n.output[0] not in used)]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    inits = [t for t in model.graph.initializer if t.name in used or t.name in {o.name for o in model.graph.output}]
    del model.graph.initializer[:]
    model.graph.initializer.extend(inits)
    return {"inputs": sorted({f"{n.name or n.op_type}:{i}" for n, i in hits})[:20], "count": len(hits)}
