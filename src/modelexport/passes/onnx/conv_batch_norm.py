"""`fold-conv-batch-norm`: in a quantized compile, a BatchNormalization right after a Conv (or a
ConvTranspose, with or without a bias Add between them) is folded into its weights and bias.

paddle2onnx writes every Conv without bias followed by its BatchNormalization. Quantized as two ops,
the HTP computes the BatchNormalization differently from the CPU EP: ppocr_cls at 16a16w fell to
-0.8 dB, its BatchNormalization@3 at -6.8 dB against the same graph on the CPU (the simulator's
probes at that node). Folded, y = W'x + b' with W' = W·γ/√(σ² + ε) per output channel and
b' = (b − μ)·γ/√(σ² + ε) + β: the same values, one op, and one quantized tensor fewer. DBNet's head
(every PP-OCR detector) upsamples with ConvTranspose → Add → BatchNormalization → Relu: ppocr_det at
16a16w fell to 18.3 dB there on the simulator against 59.2 dB for the same QDQ model on the CPU.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import reader_counts


_OUT_AXIS = {"Conv": 0, "ConvTranspose": 1}        # the weight's output-channel axis


def _const_operand(add, arrays: dict):
    return next((arrays[t] for t in add.input if t in arrays), None)


def _source(bn, producer: dict, readers: dict, outputs: set, arrays: dict):
    """(the Conv / ConvTranspose the BatchNormalization folds into, the bias Add between them or None);
    (None, None) when it has none: a ConvTranspose of more than one group, a tensor read elsewhere."""
    def alone(n) -> bool:
        return readers.get(n.output[0]) == 1 and n.output[0] not in outputs
    node, add = producer.get(bn.input[0]), None
    if node is not None and node.op_type == "Add" and alone(node):
        c = _const_operand(node, arrays)
        channels = arrays.get(bn.input[1])
        data = [t for t in node.input if t not in arrays]
        if c is None or channels is None or len(data) != 1 or c.size != channels.size or \
                (c.ndim > 1 and c.shape[1] != c.size):
            return None, None
        node, add = producer.get(data[0]), node
        if node is not None and len(node.input) > 2:
            return None, None                      # its own bias and an Add's: leave both
    if node is None or node.op_type not in _OUT_AXIS or not alone(node):
        return None, None
    if node.op_type == "ConvTranspose" and any(a.name == "group" and a.i != 1 for a in node.attribute):
        return None, None
    return node, add


@onnx_repair("fold-conv-batch-norm", 59, "quantized compiles: a BatchNormalization right after a Conv is folded into "
             "its weights (the HTP's quantized BatchNormalization departs from the CPU's)")
def fold_conv_batch_norm(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    from onnx import numpy_helper
    g = model.graph
    arrays = {t.name: numpy_helper.to_array(t) for t in g.initializer}   # Constant nodes are initializers by now
    producer = {o: n for n in g.node for o in n.output}
    readers = reader_counts(g)
    outputs = {o.name for o in g.output}
    folded = []
    touched: set[str] = set()
    for bn in [n for n in g.node if n.op_type == "BatchNormalization" and not any(n.output[1:])]:
        conv, add = _source(bn, producer, readers, outputs, arrays)
        if conv is None:
            continue
        params = [arrays.get(t) for t in [*bn.input[1:5], conv.input[1]]]
        if any(p is None for p in params) or (len(conv.input) > 2 and conv.input[2] not in arrays):
            continue
        gamma, beta, mean, var, w = (p.astype(np.float64) for p in params)
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        k = gamma / np.sqrt(var + eps)
        b = arrays[conv.input[2]].astype(np.float64) if len(conv.input) > 2 else np.zeros_like(mean)
        if add is not None:                        # ConvTranspose → Add(bias) → BatchNormalization (paddle2onnx)
            b = b + _const_operand(add, arrays).astype(np.float64).reshape(-1)
        axis = _OUT_AXIS[conv.op_type]
        shape = [1] * w.ndim
        shape[axis] = -1
        pre = conv.name or conv.output[0]
        g.initializer.extend([numpy_helper.from_array((w * k.reshape(shape)).astype(np.float32), f"{pre}/W_bn"),
                              numpy_helper.from_array(((b - mean) * k + beta).astype(np.float32), f"{pre}/B_bn")])
        touched.update([*bn.input[1:5], *conv.input[1:], *(add.input if add is not None else [])])
        del conv.input[1:]
        conv.input.extend([f"{pre}/W_bn", f"{pre}/B_bn"])
        conv.output[0] = bn.output[0]
        g.node.remove(bn)
        if add is not None:
            g.node.remove(add)
        folded.append(bn.name or bn.output[0])
    if not folded:
        return None
    used = {t for n in g.node for t in n.input}
    kept = [t for t in g.initializer if t.name in used or t.name not in touched]
    del g.initializer[:]
    g.initializer.extend(kept)
    return {"nodes": folded[:20], "count": len(folded)}
