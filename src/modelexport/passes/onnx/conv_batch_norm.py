"""`fold-conv-batch-norm`: in a quantized compile, a BatchNormalization right after a Conv is folded
into the Conv's weights and bias.

paddle2onnx writes every Conv without bias followed by its BatchNormalization. Quantized as two ops,
the HTP computes the BatchNormalization differently from the CPU EP: ppocr_cls at 16a16w fell to
-0.8 dB, its BatchNormalization@3 at -6.8 dB against the same graph on the CPU (the simulator's
probes at that node). Folded, y = W'x + b' with W' = W·γ/√(σ² + ε) per output channel and
b' = (b − μ)·γ/√(σ² + ε) + β: the same values, one op, and one quantized tensor fewer.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair


@onnx_repair("fold-conv-batch-norm", 59, "quantized compiles: a BatchNormalization right after a Conv is folded into "
             "its weights (the HTP's quantized BatchNormalization departs from the CPU's)")
def fold_conv_batch_norm(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    from onnx import numpy_helper
    g = model.graph
    arrays = {t.name: numpy_helper.to_array(t) for t in g.initializer}   # Constant nodes are initializers by now
    producer = {o: n for n in g.node for o in n.output}
    readers: dict[str, int] = {}
    for n in g.node:
        for t in n.input:
            readers[t] = readers.get(t, 0) + 1
    outputs = {o.name for o in g.output}
    folded = []
    touched: set[str] = set()
    for bn in [n for n in g.node if n.op_type == "BatchNormalization" and not any(n.output[1:])]:
        conv = producer.get(bn.input[0])
        if conv is None or conv.op_type != "Conv" or readers.get(conv.output[0]) != 1 or conv.output[0] in outputs:
            continue
        params = [arrays.get(t) for t in [*bn.input[1:5], conv.input[1]]]
        if any(p is None for p in params) or (len(conv.input) > 2 and conv.input[2] not in arrays):
            continue
        gamma, beta, mean, var, w = (p.astype(np.float64) for p in params)
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        k = gamma / np.sqrt(var + eps)
        b = arrays[conv.input[2]].astype(np.float64) if len(conv.input) > 2 else np.zeros_like(mean)
        pre = conv.name or conv.output[0]
        g.initializer.extend([numpy_helper.from_array((w * k.reshape(-1, *[1] * (w.ndim - 1))).astype(np.float32), f"{pre}/W_bn"),
                              numpy_helper.from_array(((b - mean) * k + beta).astype(np.float32), f"{pre}/B_bn")])
        touched.update([*bn.input[1:5], *conv.input[1:]])
        del conv.input[1:]
        conv.input.extend([f"{pre}/W_bn", f"{pre}/B_bn"])
        conv.output[0] = bn.output[0]
        g.node.remove(bn)
        folded.append(bn.name or bn.output[0])
    if not folded:
        return None
    used = {t for n in g.node for t in n.input}
    kept = [t for t in g.initializer if t.name in used or t.name not in touched]
    del g.initializer[:]
    g.initializer.extend(kept)
    return {"nodes": folded[:20], "count": len(folded)}
