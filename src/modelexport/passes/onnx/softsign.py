"""`softsign-as-div`: in a quantized compile, Softsign(x) becomes x / (1 + |x|).

The HTP's quantized Softsign is a slow kernel: between two 1x1 Convs on a [1, 8, 256, 256] map it
took 415 M simulator cycles at 8a8w (a LeakyRelu of the same map: 17 M) and 347 M at 16a8w; written
as x / (1 + |x|) (its definition), 149 M and 144 M at the same 31.9 and 43.3 dB. fp16 compiles keep
Softsign (40 M).
"""
from __future__ import annotations

from . import RepairContext, onnx_repair
from .graph_edit import ops_of, scalar_initializer

_ONE = "modelexport_softsign_one"


@onnx_repair("softsign-as-div", 71, "quantized compiles: Softsign(x) → x / (1 + |x|) (the HTP's quantized Softsign is a slow kernel)")
def softsign_as_div(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    nodes = ops_of(model, "Softsign")
    if not nodes:
        return None
    from onnx import helper
    one = scalar_initializer(model, _ONE, 1.0)
    for n in nodes:
        x, base = n.input[0], n.name or n.output[0]
        at = list(model.graph.node).index(n)
        model.graph.node.insert(at, helper.make_node("Abs", [x], [f"{base}/abs"], name=f"{base}/abs"))
        model.graph.node.insert(at + 1, helper.make_node("Add", [f"{base}/abs", one], [f"{base}/den"], name=f"{base}/den"))
        n.op_type = "Div"
        del n.input[:]
        n.input.extend([x, f"{base}/den"])
    return {"nodes": [n.name or n.output[0] for n in nodes][:20], "count": len(nodes)}
