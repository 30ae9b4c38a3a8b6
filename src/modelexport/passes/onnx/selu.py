"""`selu-as-elu`: in a quantized compile, Selu(x) becomes gamma * Elu(x, alpha).

The HTP's quantized Selu is a slow kernel: between two 1x1 Convs on a [1, 8, 256, 256] map it took
3,866 M simulator cycles at 8a8w and 3,536 M at 16a8w, where the same map's Elu takes 6.5 M and 32 M;
written as gamma * Elu(x, alpha) (its definition) it verifies at the same 32.0 and 43.6 dB. fp16
compiles keep Selu: the HTP's fp16 Elu is no cheaper.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair
from .graph_edit import ops_of, scalar_initializer

ALPHA, GAMMA = 1.67326319217681884765625, 1.05070102214813232421875     # ONNX's defaults


@onnx_repair("selu-as-elu", 69, "quantized compiles: Selu(x) → gamma * Elu(x, alpha) (the HTP's quantized Selu is a slow kernel)")
def selu_as_elu(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    nodes = ops_of(model, "Selu")
    if not nodes:
        return None
    from onnx import helper
    for n in nodes:
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        base = n.name or n.output[0]
        gamma = scalar_initializer(model, f"{base}/gamma", a.get("gamma", GAMMA))
        at = list(model.graph.node).index(n)
        model.graph.node.insert(at, helper.make_node("Elu", [n.input[0]], [f"{base}/elu"], name=f"{base}/elu",
                                                     alpha=a.get("alpha", ALPHA)))
        n.op_type = "Mul"
        del n.attribute[:]
        del n.input[:]
        n.input.extend([f"{base}/elu", gamma])
    return {"nodes": [n.name or n.output[0] for n in nodes][:20], "count": len(nodes)}
