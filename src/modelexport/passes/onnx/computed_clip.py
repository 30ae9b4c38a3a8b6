"""`computed-clip-bounds`: a Clip whose min or max is computed in the graph becomes Max / Min.

QNN's Clip takes constant bounds only ("QNN doesn't support dynamic min/max"), so the node stayed on
the CPU and split the graph: openWakeWord's mel front end clips its log-power at ReduceMax − 80 dB.
Clip(x, lo, hi) is Min(Max(x, lo), hi) for every value; the HTP has both ops.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair


@onnx_repair("computed-clip-bounds", 56, "a Clip whose min/max is computed in the graph becomes Max/Min (QNN's Clip "
             "takes constant bounds only)")
def computed_clip_bounds(model, ctx: RepairContext) -> dict | None:
    from onnx import helper
    g = model.graph
    constant = {t.name for t in g.initializer} | {n.output[0] for n in g.node if n.op_type == "Constant"}
    changed = []
    for n in list(g.node):
        if n.op_type != "Clip" or n.domain not in ("", "ai.onnx") or len(n.input) < 2:
            continue
        bounds = [(op, t) for op, t in zip(("Max", "Min"), list(n.input[1:3])) if t]
        if all(t in constant for _, t in bounds):
            continue
        at, cur, new = list(g.node).index(n), n.input[0], []
        for k, (op, t) in enumerate(bounds):
            out = n.output[0] if k == len(bounds) - 1 else f"{n.name or n.output[0]}/{op.lower()}"
            new.append(helper.make_node(op, [cur, t], [out], name=f"{n.name or n.output[0]}/{op}"))
            cur = out
        g.node.remove(n)
        for k, m in enumerate(new):
            g.node.insert(at + k, m)
        changed.append(n.name or n.output[0])
    return {"nodes": changed[:20], "count": len(changed)} if changed else None
