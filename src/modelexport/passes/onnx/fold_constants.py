"""`fold-constants`: what the fixed input shapes make constant is computed once.

Exporters compute shapes, position buckets and masks in the graph from Shape nodes. With the input
shapes fixed these are constants, and ONNX Runtime folds them when it loads a float model. The
quantizer sees them before that and gives their float steps Q/DQ pairs: T5's relative-position
buckets (Shape → Range → Sub → Abs → Div → Log → ...) became a quantized Log that QNN refuses to
build (t5_span_encoder_int8 at 8a8w: error at /enc/block.0/layer.0/SelfAttention/Log). Folded
first, by onnxscript's constant folder (the one torch.onnx uses), no such step is left to quantize.
In fp16 ONNX Runtime folds the same nodes when it loads the model; folded here first, the repairs
after this one see the constants too (a GatherND over indices computed from Shape: gathernd-as-gather).
The folder writes its values as Constant nodes; `constants-as-initializers` (next) makes them initializers.
"""
from __future__ import annotations

import warnings
from collections import Counter

from . import RepairContext, onnx_repair


@onnx_repair("fold-constants", 42, "nodes that only compute constants once the input shapes are fixed (shapes, "
             "position buckets) are folded (onnxscript's constant folder)")
def fold_constants(model, ctx: RepairContext) -> dict | None:
    import onnx_ir as ir
    from onnxscript import optimizer
    before = Counter(n.op_type for n in model.graph.node)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # numpy's casts of masks' extreme values while folding
            folded_model = ir.serde.deserialize_model(model)
            optimizer.fold_constants(folded_model)
            optimizer.remove_unused_nodes(folded_model)
            out = ir.serde.serialize_model(folded_model)
    except Exception:                                # noqa: BLE001 - a graph the folder cannot read stays as it is
        return None
    after = Counter(n.op_type for n in out.graph.node)
    gone = {op: k - after.get(op, 0) for op, k in before.items() if op != "Constant" and k > after.get(op, 0)}
    if not gone:
        return None
    model.CopyFrom(out)
    return {"nodes": sum(gone.values()), "ops": dict(sorted(gone.items(), key=lambda kv: -kv[1])[:12])}

