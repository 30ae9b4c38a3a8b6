"""`exp-input-floor`: in an fp16 compile, every Exp's input is floored at EXP_FLOOR first.

The HTP's fp16 Exp is wrong below about -88 (measured on the simulator over x in [-200, 0]):
exp(-87.7) comes back as 0, as it should, but exp(-91.7) as -131,008 and exp(-176) as -4.2, back to
-0 only past -196. One logit that low ruins an output: ppocr_det's DBNet map (logits down to -153,
through the output-sigmoid Exp form) fell from 45.6 dB to 14.1 dB. exp(EXP_FLOOR) = 1.6e-28 is far
below float16's smallest subnormal (6e-8), so Max(x, EXP_FLOOR) changes no fp16 result.
Quantized compiles keep the op: their Exp reads a calibrated input range.
"""
from __future__ import annotations

import numpy as np

from . import RepairContext, onnx_repair
from .graph_edit import NUMPY_OF, elem_types

EXP_FLOOR = -64.0
_FLOOR = "modelexport_exp_floor"


@onnx_repair("exp-input-floor", 66, "fp16 compiles: every Exp's input is floored at -64 (the HTP's fp16 Exp "
             "returns garbage below about -88)")
def exp_input_floor(model, ctx: RepairContext) -> dict | None:
    if ctx.quantized:
        return None
    done = {n.output[0] for n in model.graph.node if n.op_type == "Max" and n.input[-1].startswith(_FLOOR)}
    nodes = [n for n in model.graph.node if n.op_type == "Exp" and n.domain in ("", "ai.onnx") and n.input[0] not in done]
    if not nodes:
        return None
    from onnx import helper, numpy_helper
    types = elem_types(model)
    floors = {numpy_helper.to_array(t).dtype.type: t.name for t in model.graph.initializer if t.name.startswith(_FLOOR)}
    for n in nodes:
        dtype = NUMPY_OF.get(types.get(n.input[0], 1), np.float32)
        if dtype not in floors:
            floors[dtype] = f"{_FLOOR}_{np.dtype(dtype).name}"
            model.graph.initializer.append(numpy_helper.from_array(np.array(EXP_FLOOR, dtype), floors[dtype]))
        floored = f"{n.name or n.output[0]}/floored"
        at = list(model.graph.node).index(n)
        model.graph.node.insert(at, helper.make_node("Max", [n.input[0], floors[dtype]], [floored], name=floored))
        n.input[0] = floored
    return {"nodes": [n.name or n.output[0] for n in nodes][:20], "count": len(nodes), "floor": EXP_FLOOR}
