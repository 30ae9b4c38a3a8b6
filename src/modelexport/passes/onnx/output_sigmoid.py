"""`output-sigmoid`: in an fp16 compile, a Sigmoid whose value is a graph output is computed through Exp.

The HTP's fp16 Sigmoid has an absolute resolution of about 2.4e-4 (2^-12; measured on the
simulator over x in [-16, 0]): sigmoid(-6.9) = 1.05e-3 comes back as 9.8e-4, sigmoid(-8.4) =
2.3e-4 as 4.9e-4, anything below 5e-5 as 0. A probability the user reads (silero-vad's speech
probability on silence, 0.0011: 0.0 dB) loses all its relative precision. Computed as
s = exp(-|x|), then s / (1 + s) for x < 0 and 1 / (1 + s) otherwise, the HTP keeps a relative error
near 1e-3 down to 1e-7. Sigmoids inside the graph (gates, SiLU) keep the HTP's op: an absolute error
of 2.4e-4 there is below what fp16 carries anyway. Quantized compiles keep it too.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import NUMPY_OF, elem_types

_ONE, _ZERO = "modelexport_sigmoid_one", "modelexport_sigmoid_zero"
# after these a small probability is still one (silero-vad: Sigmoid → Squeeze → ReduceMean → Unsqueeze)
_PASS = {"Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Slice", "Gather", "Concat", "Split",
         "ReduceMean", "ReduceMax", "ReduceMin"}


@onnx_repair("output-sigmoid", 65, "fp16 compiles: a Sigmoid that is a graph output goes through Exp (the HTP's "
             "fp16 Sigmoid resolves 2.4e-4 absolute)")
def output_sigmoid(model, ctx: RepairContext) -> dict | None:
    if ctx.quantized:
        return None
    nodes = [n for n in model.graph.node if n.op_type == "Sigmoid" and n.domain in ("", "ai.onnx")
             and _reaches_output(model, n.output[0])]
    if not nodes:
        return None
    from onnx import helper
    types = elem_types(model)
    for n in nodes:
        one, zero = _constants(model, NUMPY_OF.get(types.get(n.input[0], 1), np.float32))
        at = list(model.graph.node).index(n)
        model.graph.node.remove(n)
        for k, new in enumerate(_exp_form(helper, n.name or n.output[0], n.input[0], n.output[0], one, zero)):
            model.graph.node.insert(at + k, new)
    return {"nodes": [n.name or n.output[0] for n in nodes][:20], "count": len(nodes)}


def _constants(model, dtype) -> tuple[str, str]:
    """The names of 1 and 0 in the Sigmoid's own type (a float16 model's Less takes float16 both sides)."""
    from onnx import numpy_helper
    suffix = "" if dtype is np.float32 else f"_{np.dtype(dtype).name}"
    one, zero = _ONE + suffix, _ZERO + suffix
    if not any(t.name == one for t in model.graph.initializer):
        model.graph.initializer.extend([numpy_helper.from_array(np.array(1.0, dtype), one),
                                        numpy_helper.from_array(np.array(0.0, dtype), zero)])
    return one, zero


def _exp_form(helper, name: str, x: str, y: str, one: str, zero: str) -> list:
    t = f"{name}/exp_form"
    return [helper.make_node("Abs", [x], [f"{t}/abs"], name=f"{t}/Abs"),
            helper.make_node("Neg", [f"{t}/abs"], [f"{t}/neg"], name=f"{t}/Neg"),
            helper.make_node("Exp", [f"{t}/neg"], [f"{t}/s"], name=f"{t}/Exp"),
            helper.make_node("Add", [f"{t}/s", one], [f"{t}/d"], name=f"{t}/Add"),
            helper.make_node("Div", [f"{t}/s", f"{t}/d"], [f"{t}/low"], name=f"{t}/DivLow"),
            helper.make_node("Div", [one, f"{t}/d"], [f"{t}/high"], name=f"{t}/DivHigh"),
            helper.make_node("Less", [x, zero], [f"{t}/negative"], name=f"{t}/Less",
                             doc_string="modelexport: picks between two forms equal at 0, decides nothing"),
            helper.make_node("Where", [f"{t}/negative", f"{t}/low", f"{t}/high"], [y], name=f"{t}/Where")]


def _reaches_output(model, t: str) -> bool:
    """`t` is a graph output, or becomes one through ops that select, move or average its values."""
    outputs = {o.name for o in model.graph.output}
    seen, todo = set(), [t]
    while todo:
        cur = todo.pop()
        if cur in outputs:
            return True
        seen.add(cur)
        users = [n for n in model.graph.node if cur in n.input]
        todo += [o for n in users if n.op_type in _PASS for o in n.output if o not in seen]
    return False
