"""`constants-as-initializers`: weights written as Constant nodes become initializers.

paddle2onnx writes every weight and bias as a Constant node (ppocr_det: 326 Constants, 4
initializers), and the constant folder writes what it folds the same way. ONNX Runtime's quantizer
takes only initializers for weights: a Conv whose weight came from a Constant had it quantized as
an activation (one scale for all channels, from the calibration run) and its bias left in float,
which the HTP then computes differently from the CPU (ppocr_det 8a8w: 7.4 dB, departing at the
first depthwise Conv). Its fusions (qnn_preprocess_model's Erf-GELU) also read initializers only.
"""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from . import RepairContext, onnx_repair

_SCALARS = {"value_float": np.float32, "value_floats": np.float32, "value_int": np.int64, "value_ints": np.int64}


@onnx_repair("constants-as-initializers", 43, "Constant nodes (paddle2onnx's weights, folded values) become initializers "
             "(ONNX Runtime's quantizer reads weights from initializers only)")
def constants_as_initializers(model, ctx: RepairContext) -> dict | None:
    g = model.graph
    outputs = {o.name for o in g.output}
    keep, moved = [], 0
    for n in g.node:
        value = _value(n) if n.output and n.output[0] not in outputs else None
        if value is None:
            keep.append(n)
            continue
        g.initializer.append(numpy_helper.from_array(value, n.output[0]))
        moved += 1
    if not moved:
        return None
    del g.node[:]
    g.node.extend(keep)
    return {"count": moved}


def _value(node) -> np.ndarray | None:
    """The array a plain Constant node holds, or None for any other node (sparse, string, other domains)."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
        return None
    a = node.attribute[0]
    if a.name == "value":
        return numpy_helper.to_array(a.t)
    if a.name in _SCALARS:
        v = a.f if a.name == "value_float" else a.i if a.name == "value_int" else list(a.floats or a.ints)
        return np.asarray(v, dtype=_SCALARS[a.name])
    return None
