"""`dilated-conv-as-taps`: a 1-D Conv with a wide dilation becomes one 1x1 Conv per kernel tap.

A temporal convolutional network (eeg_spindles: kernel 3, dilations 2, 4, ... 4096 over 7,500
samples) is slow to place and run on the HTP at some wide dilations: one Conv of 128 channels at
dilation 1024 took minutes where dilation 128 takes seconds, and the whole model passed 900 s.
A dilated Conv is the sum over its taps j of a 1x1 Conv of the input shifted by j x dilation, so
it is written that way: Slice → Conv 1x1 per tap, Add, the bias once. Same arithmetic, every op
plain for the HTP.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import names_read, replace_node, sum_nodes

MIN_DILATION = 256                       # below it the HTP's own dilated Conv is quick (measured: 128 → 5 s)


@onnx_repair("dilated-conv-as-taps", 61, "a 1-D Conv with dilation >= 256 becomes a 1x1 Conv per kernel tap "
             "(the HTP is slow to place and run wide dilations)")
def dilated_conv_as_taps(model, ctx: RepairContext) -> dict | None:
    import onnx
    from onnx import helper, numpy_helper
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    lengths = _lengths(onnx.shape_inference.infer_shapes(model).graph)
    done = []
    for n in list(g.node):
        plan = _plan(n, inits, lengths)
        if plan is None:
            continue
        w, d, pads, length = plan
        new = []
        base = n.name or n.output[0]
        x = n.input[0]
        if any(pads):
            new.append(helper.make_node("Pad", [x, f"{base}/pads"], [f"{base}/padded"], name=f"{base}/Pad"))
            g.initializer.append(numpy_helper.from_array(np.array([0, 0, pads[0], 0, 0, pads[1]], np.int64), f"{base}/pads"))
            x = f"{base}/padded"
        out_len = length + sum(pads) - d * (w.shape[2] - 1)
        taps = []
        for j in range(w.shape[2]):
            s = f"{base}/tap{j}"
            g.initializer.extend([numpy_helper.from_array(np.array([j * d], np.int64), f"{s}/start"),
                                  numpy_helper.from_array(np.array([j * d + out_len], np.int64), f"{s}/end"),
                                  numpy_helper.from_array(np.array([2], np.int64), f"{s}/axis"),
                                  numpy_helper.from_array(np.ascontiguousarray(w[:, :, j:j + 1]), f"{s}/w")])
            inputs = [f"{s}/x", f"{s}/w"] + ([n.input[2]] if j == 0 and len(n.input) > 2 and n.input[2] else [])
            new += [helper.make_node("Slice", [x, f"{s}/start", f"{s}/end", f"{s}/axis"], [f"{s}/x"], name=f"{s}/Slice"),
                    helper.make_node("Conv", inputs, [f"{s}/y"], name=f"{s}/Conv", kernel_shape=[1])]
            taps.append(f"{s}/y")
        replace_node(g, n, new + sum_nodes(taps, n.output[0], base))
        done.append({"node": base, "dilation": d})
    if done:
        used = names_read(g.node)
        for t in [t for t in g.initializer if t.name not in used]:
            g.initializer.remove(t)
    return {"nodes": done[:20], "count": len(done)} if done else None


def _lengths(graph) -> dict[str, int]:
    """The static length of every 3-D tensor whose shape inference knows it."""
    out = {}
    for v in list(graph.value_info) + list(graph.input):
        dims = v.type.tensor_type.shape.dim
        if len(dims) == 3 and dims[2].HasField("dim_value"):
            out[v.name] = dims[2].dim_value
    return out


def _plan(n, inits, lengths):
    """(weights, dilation, (pad left, pad right), input length) for a Conv this repair rewrites, else None."""
    from onnx import numpy_helper
    if n.op_type != "Conv" or n.domain not in ("", "ai.onnx") or len(n.input) < 2 or n.input[1] not in inits:
        return None
    w = numpy_helper.to_array(inits[n.input[1]])
    a = {x.name: x for x in n.attribute}
    d = list(a["dilations"].ints) if "dilations" in a else [1]
    if w.ndim != 3 or len(w) == 0 or d[0] < MIN_DILATION or n.input[0] not in lengths:
        return None
    if (a["group"].i if "group" in a else 1) != 1 or list(a["strides"].ints if "strides" in a else [1]) != [1]:
        return None
    if "auto_pad" in a and a["auto_pad"].s not in (b"", b"NOTSET"):
        return None
    pads = tuple(a["pads"].ints) if "pads" in a else (0, 0)
    return w, d[0], pads, lengths[n.input[0]]
