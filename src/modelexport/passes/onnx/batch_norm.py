"""`batch-norm-as-mul-add`: in a quantized compile, a BatchNormalization right after a Relu becomes
Mul by scale / sqrt(var + eps) and Add of bias - mean * that, per channel.

ONNX Runtime folds a BatchNormalization into the Conv that feeds it; one after a Relu (Keras'
Conv → ReLU → BatchNorm, as tf2onnx writes it) is left as a QNN BatchNorm op. On openwakeword's
speech embedding at 8a8w that op ran at 7.5 dB against the QDQ model's float where the same
arithmetic as Mul + Add ran at 36.2 dB (the whole model: 8.0 → 30.9 dB). After other ops the QNN
op is kept: vcb_captcha's BatchNorms after MaxPool hold 48.8 dB as the op and 37.5 dB as Mul + Add
(one more 8-bit tensor). Float (fp16) compiles keep the op.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair

_AFTER = {"Relu"}                 # where the HTP's quantized BatchNorm was measured off


@onnx_repair("batch-norm-as-mul-add", 62, "quantized compiles: a BatchNormalization after a Relu → Mul + Add "
             "(the HTP's quantized BatchNorm is off there)")
def batch_norm_as_mul_add(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    from onnx import helper, numpy_helper
    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    done = []
    for n in list(model.graph.node):
        if n.op_type != "BatchNormalization" or len(n.output) != 1 or any(i not in inits for i in n.input[1:5]):
            continue
        if getattr(producers.get(n.input[0]), "op_type", None) not in _AFTER:
            continue
        gamma, beta, mean, var = (numpy_helper.to_array(inits[i]).astype(np.float64) for i in n.input[1:5])
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
        rank = _rank(model, n.input[0])
        if rank is None or rank < 2:
            continue
        scale = gamma / np.sqrt(var + eps)
        shift = beta - mean * scale
        shape = [-1] + [1] * (rank - 2)
        base = n.name or n.output[0]
        s_name, b_name, mid = f"{base}/scale", f"{base}/shift", f"{base}/scaled"
        model.graph.initializer.extend([numpy_helper.from_array(scale.reshape(shape).astype(np.float32), s_name),
                                        numpy_helper.from_array(shift.reshape(shape).astype(np.float32), b_name)])
        at = list(model.graph.node).index(n)
        model.graph.node.remove(n)
        model.graph.node.insert(at, helper.make_node("Add", [mid, b_name], [n.output[0]], name=f"{base}/Add"))
        model.graph.node.insert(at, helper.make_node("Mul", [n.input[0], s_name], [mid], name=f"{base}/Mul"))
        done.append(base)
    return {"nodes": done[:20], "count": len(done)} if done else None


def _rank(model, tensor: str) -> int | None:
    for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if v.name == tensor and v.type.tensor_type.HasField("shape"):
            return len(v.type.tensor_type.shape.dim)
    return None
