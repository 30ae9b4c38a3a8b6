"""`--split-weights`: each convolution's 8-bit weights as two 8-bit halves, for about 16-bit weights.

A Conv, ConvTranspose, MatMul or Gemm y = W * x + b becomes y = W_hi * x + b + W_lo * x (the
second one without the bias): W_hi is W on the int8
grid the quantizer itself gives it (symmetric, per output channel: scale max|W|/127), so quantizing
W_hi again loses nothing; W_lo = W - W_hi is at most half a step, and its own 8-bit grid is 255 times
finer. The float graph computes the same values (the two convolutions add up to the original); the
QDQ graph carries weights about 48 dB more precise, at the cost of a second convolution per layer.

Where the error of 8-bit weights adds up over a deep network, this is what 16-bit weights would give,
without them: PP-OCRv4's text detector, fake-quant on the CPU at 16a8w, 16.5 dB → 38.6 dB with split
weights. The HTP's own 16-bit weights do not give it: a depthwise Conv with int16 weights comes out on
the simulator at the precision of 8-bit weights (bench/results/htp_conv_precision.json).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .onnx_overrides import weight_override

SPLIT_OPS = {"Conv": 0, "ConvTranspose": 1, "MatMul": 1, "Gemm": 1}   # op → its weight's output-channel axis


def _axis(node) -> int:
    """The weight's output-channel axis (a Gemm with transB=1 holds its weight as [N, K])."""
    if node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute):
        return 0
    return SPLIT_OPS[node.op_type]
LO_SUFFIX = "_weight_lo"
SUM_SUFFIX = "_weight_sum"


def on_int8_grid(w: np.ndarray, axis: int | None) -> np.ndarray:
    """W rounded to the symmetric int8 grid ONNX Runtime's quantizer gives it: scale max|W|/127 per
    channel on `axis` (None: per tensor), values in [-127, 127]."""
    w64 = w.astype(np.float64)
    if axis is None:
        scale = np.abs(w64).max(keepdims=True) / 127
    else:
        other = tuple(i for i in range(w.ndim) if i != axis)
        scale = np.abs(w64).max(axis=other, keepdims=True) / 127
    scale = np.where(scale == 0, 1.0, scale)
    return np.clip(np.round(w64 / scale), -127, 127) * scale


def split_weights(model, per_channel: bool, skip: Callable[[object], bool] = lambda node: False) -> dict:
    """Split every Conv / ConvTranspose / MatMul / Gemm whose weight is an initializer (2-D for the
    last two), in place; `skip(node)` keeps a node whole (one with an --override of its own).
    → {"layers": n, "weights": [lo initializer names], "init_overrides": both halves of every split
    weight as int8, symmetric, per channel where the compile is (the grid `on_int8_grid` put W_hi on)}."""
    from onnx import helper, numpy_helper
    from onnxruntime.quantization import QuantType
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    readers: dict[str, int] = {}
    for n in g.node:
        for t in n.input:
            readers[t] = readers.get(t, 0) + 1
    nodes, los, overrides = [], [], {}
    for node in g.node:
        w_name = node.input[1] if node.op_type in SPLIT_OPS and len(node.input) > 1 else None
        if w_name is None or w_name not in inits or readers.get(w_name) != 1 or skip(node):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(inits[w_name])
        if node.op_type in ("MatMul", "Gemm") and w.ndim != 2:
            nodes.append(node)
            continue
        axis = _axis(node) if per_channel else None
        hi = on_int8_grid(w, axis)
        lo = w.astype(np.float64) - hi
        if not np.any(lo):
            nodes.append(node)
            continue
        name = node.name or node.output[0]
        lo_name, out = w_name + LO_SUFFIX, node.output[0]
        inits[w_name].CopyFrom(numpy_helper.from_array(hi.astype(w.dtype), w_name))
        g.initializer.append(numpy_helper.from_array(lo.astype(w.dtype), lo_name))
        node.output[0] = out + "_hi"
        lo_node = helper.make_node(node.op_type, [node.input[0], lo_name], [out + "_lo"], name=name + LO_SUFFIX)
        lo_node.attribute.extend(node.attribute)
        nodes += [node, lo_node, helper.make_node("Add", [out + "_hi", out + "_lo"], [out], name=name + SUM_SUFFIX)]
        los.append(lo_name)
        overrides[w_name] = overrides[lo_name] = [weight_override(QuantType.QInt8, axis)]
    del g.node[:]
    g.node.extend(nodes)
    return {"layers": len(los), "weights": los, "init_overrides": overrides}
