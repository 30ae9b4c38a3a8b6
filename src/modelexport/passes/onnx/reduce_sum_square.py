"""`reduce-sum-square-as-mul`: ReduceSumSquare(x) becomes ReduceSum(Mul(x, x)).

The QNN EP has no ReduceSumSquare ("Operators of type `ReduceSumSquare` are not supported"): the
power spectrum of onnx-asr's log-mel front ends (Whisper, GigaAM, NeMo, Kaldi) went to the CPU, one
partition in the middle of the graph. Mul and ReduceSum run on the HTP and compute the same sum.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import default_opset


@onnx_repair("reduce-sum-square-as-mul", 44, "ReduceSumSquare(x) → ReduceSum(Mul(x, x)) (the QNN EP has no "
             "ReduceSumSquare)")
def reduce_sum_square_as_mul(model, ctx: RepairContext) -> dict | None:
    from onnx import helper, numpy_helper
    g = model.graph
    nodes = [n for n in g.node if n.op_type == "ReduceSumSquare" and n.domain in ("", "ai.onnx")]
    if not nodes:
        return None
    opset = default_opset(model)
    for n in nodes:
        label = n.name or n.output[0]
        square = f"{label}/square"
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        inputs = [square, *n.input[1:]]
        if 13 <= opset < 18 and "axes" in attrs:        # ReduceSum takes its axes as an input from opset 13
            axes = f"{label}/axes"
            g.initializer.append(numpy_helper.from_array(np.array(attrs.pop("axes"), np.int64), axes))
            inputs = [square, axes]
        at = list(g.node).index(n)
        g.node.insert(at, helper.make_node("Mul", [n.input[0], n.input[0]], [square], name=square))
        n.op_type = "ReduceSum"
        del n.input[:]
        n.input.extend(inputs)
        del n.attribute[:]
        n.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
    return {"nodes": [n.name or n.output[0] for n in nodes][:20], "count": len(nodes)}
