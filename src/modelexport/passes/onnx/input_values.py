"""`input-values`: inputs the user fixed with `--input-value NAME=VALUE` become constants.

A model may switch on an input that is constant in practice (Silero VAD's `sr` picks the 8 kHz
or 16 kHz body through an `If`). Fixed, the input leaves the graph's inputs and becomes an
initializer, so `fold-control-flow` can pick the branch and fold what follows.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair


@onnx_repair("input-values", 20, "replace the inputs given with --input-value by constants")
def fix_input_values(model, ctx: RepairContext) -> dict | None:
    if not ctx.input_values:
        return None
    from onnx import numpy_helper
    fixed = {}
    for name, value in ctx.input_values.items():
        model.graph.initializer.append(numpy_helper.from_array(value, name))
        fixed[name] = value.tolist()
    keep = [i for i in model.graph.input if i.name not in ctx.input_values]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    return {"values": fixed}
