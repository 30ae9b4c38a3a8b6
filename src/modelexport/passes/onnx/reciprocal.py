"""`reciprocal-as-div`: in a quantized compile, Reciprocal(x) becomes Div(1, x).

The HTP's quantized Reciprocal does not compute what the QDQ model does: on a decomposed
LayerNorm's `Sqrt → Reciprocal` (tf2onnx writes Rsqrt so; magika's classifier, every TF/JAX
export with a LayerNorm) the simulator's output fell to 1.6 dB from the QDQ model's 55.8 dB at
that node. Its quantized Div agrees with the QDQ model (magika at 16a8w: -3.1 → 33.0 dB). Float
(fp16) compiles keep Reciprocal: the HTP's fp16 Reciprocal is right.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair
from .graph_edit import ops_of, scalar_initializer

_ONE = "modelexport_one"


@onnx_repair("reciprocal-as-div", 60, "quantized compiles: Reciprocal(x) → Div(1, x) (the HTP's quantized Reciprocal is off)")
def reciprocal_as_div(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    nodes = ops_of(model, "Reciprocal")
    if not nodes:
        return None
    scalar_initializer(model, _ONE, 1.0)
    for n in nodes:
        x = n.input[0]
        n.op_type = "Div"
        del n.input[:]
        n.input.extend([_ONE, x])
    return {"nodes": [n.name or n.output[0] for n in nodes][:20], "count": len(nodes)}
