"""`rank-above-5-out`: a tensor above rank 5 that only Reshapes read is not made at all.

The HTP takes tensors up to rank 5 (QNN error 3110 above). gtcrn's subband feature extraction
unfolds a spectrogram with a Gather of 2-D indices ([3, 129] on axis 4 of a rank-5 tensor: a
rank-6 result) and reshapes it back through another rank-6 Reshape; the five nodes went to the CPU
at every precision, splitting the graph. Only Reshapes read those tensors, and a Reshape keeps the
elements' order, so:
- a Gather of constant N-D indices gathers the same indices flattened (its output keeps the data's
  rank, the elements in the same order);
- a Reshape whose output only Reshapes read is skipped: they read its input.
A reader whose target shape copies a dimension (a 0 in it) keeps the tensor as it is.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import GraphEdit, static_shapes

MAX_RANK = 5


def _reshape_readers(edit: GraphEdit, t: str) -> list | None:
    """The nodes reading `t`, when every one is a Reshape of it to a constant shape without a 0."""
    readers = edit.consumers(t)
    if not readers or t in edit.outputs:
        return None
    for r in readers:
        target = edit.const(r.input[1]) if r.op_type == "Reshape" and len(r.input) > 1 else None
        if r.input[0] != t or t in r.input[1:] or target is None or not np.all(target != 0):
            return None
    return readers


def _flatten_indices(edit: GraphEdit, node, shapes: dict) -> bool:
    idx = edit.const(node.input[1])
    data = shapes.get(node.input[0])
    if idx is None or idx.ndim < 2 or data is None or len(data) > MAX_RANK:
        return False
    flat = f"{node.name or node.output[0]}/flat_indices"
    edit.new_inits[flat] = idx.reshape(-1)
    node.input[1] = flat
    edit.retyped.add(node.output[0])          # its value_info names the rank it had
    return True


@onnx_repair("rank-above-5-out", 74, "a tensor above rank 5 (the HTP's limit) that only Reshapes read is not made: "
             "a Gather takes its N-D indices flat, a Reshape is skipped (gtcrn's unfold)")
def rank_above_5_out(model, ctx: RepairContext) -> dict | None:
    candidates = [n for n in model.graph.node if n.op_type in ("Gather", "Reshape") and n.domain in ("", "ai.onnx")]
    shapes = static_shapes(model) if candidates else {}
    edit = GraphEdit(model)
    done = []
    for n in candidates:
        out = shapes.get(n.output[0])
        readers = _reshape_readers(edit, n.output[0]) if out is not None and len(out) > MAX_RANK else None
        if readers is None:
            continue
        if n.op_type == "Gather" and _flatten_indices(edit, n, shapes):
            done.append(n.name or n.output[0])
        elif n.op_type == "Reshape":
            for r in readers:
                r.input[0] = n.input[0]
            edit.dead.add(id(n))
            done.append(n.name or n.output[0])
    if not done:
        return None
    edit.commit()
    return {"nodes": done[:20], "count": len(done)}
