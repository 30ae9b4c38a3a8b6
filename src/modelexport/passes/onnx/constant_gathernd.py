"""`gathernd-as-gather`: a GatherND whose indices are constant becomes Reshape + Gather.

torch.export writes a mask's broadcast as GatherND over constant indices (MiniLM's attention mask,
[1, 128] bool → [1, 1, 1, 128]); the HTP validator rejects that GatherND (error 3110) and the node
stayed on the CPU. With the indices known, each index tuple is one row of the data reshaped to
[rows, *rest]: a Gather on axis 0 with the flattened row numbers computes the same tensor.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair


@onnx_repair("gathernd-as-gather", 57, "a GatherND with constant indices becomes Reshape + Gather (the HTP "
             "validator rejects it)")
def gathernd_as_gather(model, ctx: RepairContext) -> dict | None:
    import onnx
    from onnx import helper, numpy_helper
    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}   # Constant nodes are initializers by now
    nodes = [n for n in g.node if n.op_type == "GatherND" and n.input[1] in consts
             and not any(a.name == "batch_dims" and a.i for a in n.attribute)]
    if not nodes:
        return None
    shapes = _shapes(onnx, model)
    changed = []
    for n in nodes:
        dims, idx = shapes.get(n.input[0]), consts[n.input[1]].astype(np.int64)
        if not dims or idx.ndim < 1 or idx.shape[-1] > len(dims):
            continue
        k = idx.shape[-1]
        lead = dims[:k]
        rows = np.ravel_multi_index(tuple(np.moveaxis(np.where(idx < 0, idx + lead, idx), -1, 0)), lead)
        pre = n.name or n.output[0]
        g.initializer.extend([numpy_helper.from_array(np.array([int(np.prod(lead)), *dims[k:]], np.int64), f"{pre}/rows_shape"),
                              numpy_helper.from_array(rows.astype(np.int64), f"{pre}/rows")])
        at = list(g.node).index(n)
        g.node.remove(n)
        g.node.insert(at, helper.make_node("Reshape", [n.input[0], f"{pre}/rows_shape"], [f"{pre}/as_rows"], name=f"{pre}/Reshape"))
        g.node.insert(at + 1, helper.make_node("Gather", [f"{pre}/as_rows", f"{pre}/rows"], [n.output[0]], name=f"{pre}/Gather",
                                               axis=0))
        changed.append(pre)
    return {"nodes": changed[:20], "count": len(changed)} if changed else None


def _shapes(onnx, model) -> dict[str, list[int]]:
    """Static shapes ONNX's shape inference finds (graph inputs included)."""
    g = onnx.shape_inference.infer_shapes(model).graph
    out = {}
    for v in [*g.value_info, *g.input, *g.output]:
        dims = v.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") and d.dim_value > 0 for d in dims):
            out[v.name] = [d.dim_value for d in dims]
    return out
