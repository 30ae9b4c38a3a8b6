"""`finite-masks`: in a quantized compile, an infinite constant a Where selects (an attention
mask: `masked_fill(mask, -inf)`) becomes a finite one.

A quantized tensor cannot hold -inf: QNN refuses to build the graph at its Quantize node (error
6007; khmer_segmenter's `view_14_QuantizeLinear`). After a softmax, -MASK_VALUE weighs
exp(-MASK_VALUE) ≈ 0, as -inf does; as a quantized value it keeps the mask's range small enough
that the scores it is added to keep their steps.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair

MASK_VALUE = 100.0


@onnx_repair("finite-masks", 7, "quantized compiles: ±inf constants selected by Where (attention masks) become ±100")
def finite_masks(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    from onnx import numpy_helper
    g = model.graph
    fed = {t for n in g.node if n.op_type == "Where" for t in n.input[1:]}
    inits = {t.name: t for t in g.initializer if t.name in fed}
    changed = []
    for name, t in inits.items():
        a = numpy_helper.to_array(t)
        if a.dtype.kind == "f" and np.isinf(a).any():
            t.CopyFrom(numpy_helper.from_array(np.where(np.isinf(a), np.sign(a) * MASK_VALUE, a).astype(a.dtype), name))
            changed.append(name)
    for n in g.node:
        if n.op_type == "Constant" and n.output[0] in fed and n.attribute and n.attribute[0].name == "value":
            a = numpy_helper.to_array(n.attribute[0].t)
            if a.dtype.kind == "f" and np.isinf(a).any():
                n.attribute[0].t.CopyFrom(numpy_helper.from_array(np.where(np.isinf(a), np.sign(a) * MASK_VALUE, a).astype(a.dtype)))
                changed.append(n.output[0])
    return {"constants": changed, "value": MASK_VALUE} if changed else None
