"""`grouped-einsum-as-matmul`: Einsum('...gi,gih->...gh') over a constant weight becomes MatMul.

DeepFilterNet's grouped linear layers (every DeepFilterNet 2/3 export: its encoder, ERB and DF
decoders) are one Einsum each, 'btgi,gih->btgh': input x [b, t, g, i], weight W [g, i, h]. The QNN
EP takes no such Einsum, so each ran on the CPU and split the graph (Hush's DeepFilterNet encoder:
3 of 48 nodes, 4 graphs). The same arithmetic as MatMul:
- one group: x @ W[0] (x's last axis against [i, h]);
- g groups, x of rank 4: Transpose to [b, g, t, i], MatMul with W [g, i, h] (broadcast over b),
  Transpose back.
"""
from __future__ import annotations

import re

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import GraphEdit

_GROUPED = re.compile(r"^([a-z]*)([a-z])([a-z]),\2\3([a-z])->\1\2\4$")


def _plan(node, edit: GraphEdit) -> tuple[np.ndarray, int] | None:
    """(weight [g, i, h], rank of x) when `node` is a grouped-linear Einsum this rewrites."""
    if node.op_type != "Einsum" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    eq = next((a.s.decode() for a in node.attribute if a.name == "equation"), "").replace(" ", "")
    m = _GROUPED.match(eq)
    w = edit.const(node.input[1])
    if m is None or w is None or w.ndim != 3 or edit.const(node.input[0]) is not None:
        return None
    letters = m.group(1) + m.group(2) + m.group(3) + m.group(4)
    if len(set(letters)) != len(letters):
        return None
    rank = len(m.group(1)) + 2
    return (w, rank) if w.shape[0] == 1 or rank == 4 else None


@onnx_repair("grouped-einsum-as-matmul", 76, "an Einsum '...gi,gih->...gh' over a constant weight (DeepFilterNet's "
             "grouped linear layers; the QNN EP takes no such Einsum) becomes MatMul, with Transposes for several groups")
def grouped_einsum_as_matmul(model, ctx: RepairContext) -> dict | None:
    from onnx import helper
    edit = GraphEdit(model)
    done, extra = [], []
    for node in model.graph.node:
        plan = _plan(node, edit)
        if plan is None:
            continue
        w, _ = plan
        base = node.name or node.output[0]
        x, y = node.input[0], node.output[0]
        if w.shape[0] == 1:
            edit.new_inits[f"{base}/weight"] = np.ascontiguousarray(w[0])
            node.CopyFrom(helper.make_node("MatMul", [x, f"{base}/weight"], [y], name=f"{base}/as_matmul"))
        else:
            edit.new_inits[f"{base}/weight"] = np.ascontiguousarray(w)
            node.CopyFrom(helper.make_node("Transpose", [x], [f"{base}/by_group"], name=f"{base}/to_groups",
                                           perm=[0, 2, 1, 3]))
            extra.append((node, [helper.make_node("MatMul", [f"{base}/by_group", f"{base}/weight"], [f"{base}/mm"],
                                                  name=f"{base}/as_matmul"),
                                 helper.make_node("Transpose", [f"{base}/mm"], [y], name=f"{base}/from_groups",
                                                  perm=[0, 2, 1, 3])]))
        done.append(base)
    if not done:
        return None
    for node, after in extra:          # right after the node they follow, the graph stays in order
        at = next(i for i, n in enumerate(edit.nodes) if n is node) + 1
        edit.nodes[at:at] = after
    edit.commit()
    return {"nodes": done[:20], "count": len(done)}
