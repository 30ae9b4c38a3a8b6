"""`batch-norm-as-mul-add`: in a quantized compile, a BatchNormalization no Conv absorbed becomes Mul by
scale / sqrt(var + eps) and Add of bias - mean * that, per channel.

ONNX Runtime folds a BatchNormalization into the Conv that feeds it; any other is left as a QNN
BatchNorm op, and the HTP's quantized BatchNorm miscomputes channels whose folded offset is large:
on one BatchNorm over [1, 8, 32] with offsets 0 … 2.5, the last channel came back as the output's
lowest value (8.0 dB against its QDQ model, at 8 and at 16 bits; fp16 is exact). Where it strikes
depends on the offsets, the channel count and the width (2 or 4 channels, or a width of 8, pass).
Seen on real models: openwakeword's speech embedding (a BatchNorm after a Relu: 8.0 dB at 8a8w, 30.9
as Mul + Add) and WakeHuBERT's BatchNorm over log-mel features (its last channel all zeros; 14.6 dB at
16a8w). Mul + Add is computed as its QDQ model says everywhere measured (tests/test_tf_exports.py).
It quantizes one more tensor, which costs where the op was right: vcb_captcha's BatchNorms after
MaxPool gave 48.8 dB as the op, 37.5 dB as Mul + Add. Float (fp16) compiles keep the op.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import replace_with_affine


@onnx_repair("batch-norm-as-mul-add", 62, "quantized compiles: a BatchNormalization no Conv absorbs → Mul + Add "
             "(the HTP's quantized BatchNorm miscomputes channels with a large offset)")
def batch_norm_as_mul_add(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    from onnx import numpy_helper
    inits = {t.name: t for t in model.graph.initializer}
    done = []
    for n in list(model.graph.node):
        if n.op_type != "BatchNormalization" or len(n.output) != 1 or any(i not in inits for i in n.input[1:5]):
            continue
        gamma, beta, mean, var = (numpy_helper.to_array(inits[i]).astype(np.float64) for i in n.input[1:5])
        eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
        rank = _rank(model, n.input[0])
        if rank is None or rank < 2:
            continue
        scale = gamma / np.sqrt(var + eps)
        done.append(replace_with_affine(model, n, scale, beta - mean * scale, rank))
    return {"nodes": done[:20], "count": len(done)} if done else None


def _rank(model, tensor: str) -> int | None:
    for v in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if v.name == tensor and v.type.tensor_type.HasField("shape"):
            return len(v.type.tensor_type.shape.dim)
    return None
