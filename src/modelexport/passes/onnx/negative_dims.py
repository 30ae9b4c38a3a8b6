"""`negative-dims-as-dynamic`: a dimension written as -1 becomes a named (dynamic) dimension.

Old paddle2onnx exports (pp-ocr's PP-OCRv2 recognizer) mark a dynamic dimension with dim_value -1
instead of a dim_param. Shape inference and onnxscript's constant folder then take -1 as a known
size: Shape(x)[0] folded to -1 before --input-shape was applied, and an LSTM's initial state tiled
by that "batch" became Tile(zeros, [-1, 1]), which no runtime accepts. Named, the dimension is
unknown until the user's shape fixes it, as the exporter meant.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair


def _named(values) -> list[str]:
    changed = []
    for v in values:
        for i, d in enumerate(v.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value < 0:
                d.dim_param = f"{v.name}_dim{i}"          # setting dim_param clears dim_value (a oneof)
                changed.append(v.name)
    return changed


@onnx_repair("negative-dims-as-dynamic", 2, "dimensions written as -1 (old paddle2onnx) become named dynamic "
             "dimensions, so nothing folds -1 as a size")
def negative_dims_as_dynamic(model, ctx: RepairContext) -> dict | None:
    g = model.graph
    changed = _named(g.input) + _named(g.output) + _named(g.value_info)
    return {"tensors": sorted(set(changed))[:20], "count": len(set(changed))} if changed else None
