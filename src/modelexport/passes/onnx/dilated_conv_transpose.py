"""`dilated-conv-transpose-as-conv`: a ConvTranspose of stride 1 with a dilation becomes a Conv.

QNN's TransposeConv2d takes dilation 1 only, and the QNN EP leaves a dilated ConvTranspose on the
CPU at every precision (gtcrn's decoder: depthwise 3x3 ConvTransposes at dilations (2, 1) and
(5, 1), splitting the graph into three). At stride 1 a ConvTranspose is a Conv: the same dilation,
the kernel flipped along every spatial axis with its input and output channels swapped within each
group, and pads of dilation · (kernel − 1) − pad on each side. The HTP runs dilated Convs.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import GraphEdit


def _attrs(node) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def conv_weight(w: np.ndarray, group: int) -> np.ndarray:
    """A ConvTranspose weight [C_in, C_out/g, k...] → the Conv weight [C_out, C_in/g, k...] of stride 1."""
    c_in, c_out_g, *k = w.shape
    per = w.reshape(group, c_in // group, c_out_g, *k).swapaxes(1, 2).reshape(group * c_out_g, c_in // group, *k)
    return np.ascontiguousarray(np.flip(per, axis=tuple(range(2, per.ndim))))


def _plan(node, edit: GraphEdit) -> tuple[np.ndarray, list[int], dict] | None:
    """(Conv weight, Conv pads, Conv attributes) when `node` is a ConvTranspose this rewrites."""
    if node.op_type != "ConvTranspose" or node.domain not in ("", "ai.onnx"):
        return None
    a, w = _attrs(node), edit.const(node.input[1])
    if w is None or w.ndim < 3:
        return None
    rank = w.ndim - 2
    dil = list(a.get("dilations", [1] * rank))
    pads = list(a.get("pads", [0] * 2 * rank))
    k = list(a.get("kernel_shape", w.shape[2:]))
    plain = (all(s == 1 for s in a.get("strides", [1] * rank)) and not any(a.get("output_padding", []))
             and "output_shape" not in a and a.get("auto_pad", b"NOTSET") in (b"NOTSET", "NOTSET"))
    if not plain or all(d == 1 for d in dil) or list(w.shape[2:]) != k:
        return None
    new_pads = [dil[i % rank] * (k[i % rank] - 1) - p for i, p in enumerate(pads)]
    if min(new_pads) < 0:
        return None
    group = int(a.get("group", 1))
    return conv_weight(w, group), new_pads, {"dilations": dil, "group": group, "kernel_shape": k}


@onnx_repair("dilated-conv-transpose-as-conv", 75, "a ConvTranspose of stride 1 with a dilation (QNN takes "
             "dilation 1 only) becomes the Conv it equals: kernel flipped, channels swapped, pads d(k-1)-p")
def dilated_conv_transpose_as_conv(model, ctx: RepairContext) -> dict | None:
    from onnx import helper
    edit = GraphEdit(model)
    done = []
    for node in model.graph.node:
        plan = _plan(node, edit)
        if plan is None:
            continue
        w, pads, attrs = plan
        base = node.name or node.output[0]
        edit.new_inits[f"{base}/conv_weight"] = w
        conv = helper.make_node("Conv", [node.input[0], f"{base}/conv_weight", *node.input[2:]], list(node.output),
                                name=f"{base}/as_conv", pads=pads, **attrs)
        node.CopyFrom(conv)
        done.append(base)
    if not done:
        return None
    edit.commit()
    return {"nodes": done[:20], "count": len(done)}
