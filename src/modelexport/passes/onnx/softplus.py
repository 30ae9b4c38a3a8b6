"""`softplus-as-log-exp`: at 16-bit activations, Softplus(x) becomes Relu(x) + Log(1 + Exp(-|x|)).

The HTP's 16-bit Softplus is a slow kernel: between two 1x1 Convs on a [1, 8, 256, 256] map it took
3,594 M simulator cycles at 16a8w, 86x a Sigmoid's of the same map, and 7,040 M of trueocr's
8,247 M cycles at 16a8w (its one Softplus, on a 512x1024 map). Written out, the same map takes 220 M
cycles and verifies at 45.3 dB against 40.3 dB: every piece's range is bounded (Exp of a non-positive
input in (0, 1], the Log's output in (0, 0.7], widened by quant/log_range.py). At 8-bit activations
the HTP's own Softplus is cheap (8.7 M cycles on that map) and stays; so does an fp16 one (3,027 M:
slow too, but written out in fp16 it takes 4,765 M).
"""
from __future__ import annotations

from . import RepairContext, onnx_repair
from .graph_edit import ops_of, scalar_initializer, topological_order

_ONE = "modelexport_softplus_one"


@onnx_repair("softplus-as-log-exp", 68, "16-bit quantized compiles: Softplus(x) → Relu(x) + Log(1 + Exp(-|x|)) "
             "(the HTP's 16-bit Softplus is a slow kernel)")
def softplus_as_log_exp(model, ctx: RepairContext) -> dict | None:
    if ctx.activation_bits != 16:
        return None
    nodes = ops_of(model, "Softplus")
    if not nodes:
        return None
    from onnx import helper
    scalar_initializer(model, _ONE, 1.0)
    for n in nodes:
        x, y, base = n.input[0], n.output[0], n.name or n.output[0]
        t = {k: f"{base}/{k}" for k in ("abs", "neg", "exp", "add", "log", "relu")}
        model.graph.node.extend([
            helper.make_node("Abs", [x], [t["abs"]], name=t["abs"]),
            helper.make_node("Neg", [t["abs"]], [t["neg"]], name=t["neg"]),
            helper.make_node("Exp", [t["neg"]], [t["exp"]], name=t["exp"]),
            helper.make_node("Add", [t["exp"], _ONE], [t["add"]], name=t["add"]),
            helper.make_node("Log", [t["add"]], [t["log"]], name=t["log"]),
            helper.make_node("Relu", [x], [t["relu"]], name=t["relu"]),
            helper.make_node("Add", [t["relu"], t["log"]], [y], name=base)])
        model.graph.node.remove(n)
    topological_order(model)
    return {"nodes": [n.name or n.output[0] for n in nodes][:20], "count": len(nodes)}
