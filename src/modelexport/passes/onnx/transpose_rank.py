"""`transpose-unit-axes-out`: a Transpose above rank 5 loses its size-1 axes around it.

The HTP takes Transpose up to rank 5 (QNN error 3110 above). torch's pixel_unshuffle exports as
Reshape → a rank-6 Transpose (perm [0, 1, 3, 5, 2, 4]) → Reshape (trueocr's text detector), and
the node went to the CPU, splitting the graph in two. With batch 1 the same permutation moves five
axes: Reshape them out, transpose the rest in the same order, Reshape back. The same values; every
node on the HTP.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import static_shapes

MAX_RANK = 5


def reduced_perm(shape: list[int], perm: list[int]) -> tuple[list[int], list[int]] | None:
    """(the shape without its size-1 axes, the permutation of what is left), or None when that is still
    above MAX_RANK."""
    kept = [i for i, d in enumerate(shape) if d != 1]
    if not kept or len(kept) > MAX_RANK:
        return None
    return [shape[i] for i in kept], [kept.index(p) for p in perm if p in kept]


@onnx_repair("transpose-unit-axes-out", 64, "a Transpose above rank 5 (the HTP's limit) drops its size-1 axes "
             "(Reshape, Transpose, Reshape: pixel_unshuffle exports)")
def transpose_unit_axes_out(model, ctx: RepairContext) -> dict | None:
    from onnx import helper, numpy_helper
    g = model.graph
    wide = [n for n in g.node if n.op_type == "Transpose" and n.domain in ("", "ai.onnx")]
    shapes = static_shapes(model) if wide else {}
    done = []
    for n in wide:
        shape = shapes.get(n.input[0])
        perm = next((list(a.ints) for a in n.attribute if a.name == "perm"), None)
        if shape is None or perm is None or len(shape) <= MAX_RANK:
            continue
        plan = reduced_perm(shape, perm)
        if plan is None:
            continue
        small, new_perm = plan
        base, at = n.name or n.output[0], list(g.node).index(n)
        g.initializer.extend([numpy_helper.from_array(np.array(small, np.int64), f"{base}/squeezed_shape"),
                              numpy_helper.from_array(np.array([shape[p] for p in perm], np.int64), f"{base}/shape")])
        new = [helper.make_node("Reshape", [n.input[0], f"{base}/squeezed_shape"], [f"{base}/squeezed"], name=f"{base}/Squeeze"),
               helper.make_node("Transpose", [f"{base}/squeezed"], [f"{base}/moved"], name=f"{base}/Transpose", perm=new_perm),
               helper.make_node("Reshape", [f"{base}/moved", f"{base}/shape"], [n.output[0]], name=f"{base}/Unsqueeze")]
        g.node.remove(n)
        for k, m in enumerate(new):
            g.node.insert(at + k, m)
        done.append(base)
    return {"nodes": done[:20], "count": len(done)} if done else None
