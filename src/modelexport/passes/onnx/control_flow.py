"""`fold-control-flow`: fold `If` nodes whose condition is known once shapes and input values are fixed.

The folding is ONNX Runtime's own graph optimizer (basic level: constant folding, which inlines an
`If` with a constant condition, then folds the Shape/Gather/Equal chains the inlined branch
brings), run until the graph stops shrinking. What is left on an input is named by
`control_flow_on_inputs`, which the audit and compile turn into a `--input-value` fix.
"""
from __future__ import annotations

import math
import os
import tempfile

from . import RepairContext, onnx_repair

CONTROL_FLOW = ("If", "Loop", "Scan")
_MAX_ROUNDS = 4


def _count(model) -> int:
    return sum(1 for n in model.graph.node if n.op_type in CONTROL_FLOW)


def control_flow_on_inputs(model) -> dict[str, list[str]]:
    """{control-flow node name: graph inputs its condition / trip count depends on}."""
    inits = {t.name for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input} - inits
    producer = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for i, n in enumerate(model.graph.node):
        if n.op_type not in CONTROL_FLOW:
            continue
        seen, stack, hit = set(), [x for x in n.input[:2] if x], set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in inputs:
                hit.add(name)
            elif name in producer and producer[name].op_type != "Shape":   # shapes are fixed by --input-shape
                stack.extend(x for x in producer[name].input if x)
        if hit:
            out[n.name or f"{n.op_type}_{i}"] = sorted(hit)
    return out


def data_inputs(model) -> set[str]:
    """Float inputs of more than one value: data (audio, embeddings), not a flag or a rate to fix."""
    out = set()
    for i in model.graph.input:
        t = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
        if t.elem_type in (1, 10, 11) and (not dims or 0 in dims or math.prod(dims) > 1):
            out.add(i.name)
    return out


def _optimize(model):
    import onnx
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.log_severity_level = 3
    with tempfile.TemporaryDirectory(prefix="modelexport-fold-") as tmp:
        so.optimized_model_filepath = os.path.join(tmp, "folded.onnx")
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return onnx.load(so.optimized_model_filepath)


@onnx_repair("fold-control-flow", 30, "fold If nodes whose condition is constant (ONNX Runtime's constant folding)")
def fold_control_flow(model, ctx: RepairContext) -> dict | None:
    before = _count(model)
    if not before or control_flow_on_inputs(model):
        return None                          # nothing to fold, or still open on an input (audit / compile say so)
    opsets = {o.domain: o.version for o in model.opset_import}
    current = model
    for _ in range(_MAX_ROUNDS):
        folded = _optimize(current)
        if len(folded.graph.node) >= len(current.graph.node) and _count(folded) == _count(current):
            break
        current = folded
    if current is model:
        return None
    # the optimizer lists every domain it knows; keep the model's own
    del current.opset_import[:]
    for domain, version in opsets.items():
        current.opset_import.add(domain=domain, version=version)
    model.CopyFrom(current)
    return {"control_flow_nodes": [before, _count(model)]}
