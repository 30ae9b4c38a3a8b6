"""`depthwise-1x1-as-mul-add`: in a quantized compile, a depthwise Conv with a 1x1 kernel (a
per-channel scale and bias, as some exporters write an affine or a BatchNorm) becomes Mul + Add.

At 16-bit activations the HTP computes such a Conv wrongly in every channel: on [1, 8, 32] and
[1, 8, 16, 16] maps, 2.1-4.4 dB against its QDQ model on the CPU, with or without a bias; a 3x3
depthwise Conv of the same channels holds at 85-90 dB, and 8-bit activations at 51 dB. Mul + Add
computes what its QDQ model says (tests/test_batch_norm_htp.py).
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import replace_with_affine


@onnx_repair("depthwise-1x1-as-mul-add", 67, "quantized compiles: a depthwise Conv with a 1x1 kernel → Mul + Add "
             "(the HTP computes it wrongly at 16-bit activations)")
def depthwise_1x1_as_mul_add(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    from onnx import numpy_helper
    inits = {t.name: t for t in model.graph.initializer}
    done = []
    for n in list(model.graph.node):
        w = numpy_helper.to_array(inits[n.input[1]]) if n.op_type == "Conv" and len(n.input) > 1 and n.input[1] in inits else None
        bias = n.input[2] if len(n.input) > 2 and n.input[2] else None
        if w is None or not _plain_depthwise_1x1(n, w) or (bias is not None and bias not in inits):
            continue                                 # a computed bias: the Conv stays
        shift = numpy_helper.to_array(inits[bias]) if bias is not None else None
        done.append(replace_with_affine(model, n, w, shift, w.ndim))
    return {"nodes": done[:20], "count": len(done)} if done else None


def _plain_depthwise_1x1(n, w: np.ndarray) -> bool:
    """group = channels in = channels out, a 1x1 kernel, no stride, dilation or padding."""
    from onnx import helper
    a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
    ones = [1] * (w.ndim - 2)
    return (w.ndim >= 3 and w.shape[1] == 1 and a.get("group", 1) == w.shape[0] > 1 and list(w.shape[2:]) == ones
            and list(a.get("strides", ones)) == ones and list(a.get("dilations", ones)) == ones
            and not any(a.get("pads", [])) and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET", b"VALID", "VALID"))
