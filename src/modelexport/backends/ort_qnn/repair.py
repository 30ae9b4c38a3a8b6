"""Load an ONNX model for this format: fix shapes, then run the graph repairs (passes/onnx) on a copy.

The source's path and sha256 stay those of the file as given; the repairs that changed the
graph ride on the LoadedOnnx into the manifest. Control flow still open on an input after the
repairs is named here, with the flag that folds it.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...core.errors import InputError, Setting
from ...frontends.onnx_model import LoadedOnnx, load_onnx, parse_input_shapes, parse_input_values
from ...passes.onnx import RepairContext, apply_repairs
from ...passes.onnx.control_flow import control_flow_on_inputs, data_inputs


def control_flow_fix(model) -> InputError | None:
    """The error to raise when control flow still depends on a graph input, else None."""
    open_on = control_flow_on_inputs(model)
    if not open_on:
        return None
    names = sorted({i for ins in open_on.values() for i in ins})
    nodes = ", ".join(f"{n} (on {', '.join(ins)})" for n, ins in list(open_on.items())[:4])
    data = data_inputs(model)
    if all(n in data for n in names):
        conds = _conditions(model, open_on)
        return InputError(f"control flow depends on what the model computes from its input(s) {', '.join(names)}: "
                          f"{nodes}; the HTP runs static graphs without If/Loop, and no fixed input value folds it",
                          "compile the graph up to the condition and run the branch in your own code: "
                          f"onnx.utils.extract_model(MODEL, 'head.onnx', {names!r}, {conds!r} + the branch's inputs)")
    return InputError(f"control flow depends on the input(s) {', '.join(names)}: {nodes}; the HTP runs static graphs "
                      "without If/Loop", "fix the value you will run with, and the branch is folded at compile time: "
                      "{setting}", Setting("input_values", {n: "VALUE" for n in names}))


def _conditions(model, open_on: dict[str, list[str]]) -> list[str]:
    """The condition tensors of the control-flow nodes named in `open_on`."""
    by_name = {n.name: n for n in model.graph.node}
    return [by_name[k].input[0] for k in open_on if k in by_name and by_name[k].input]


def _shapes_left(input_shapes: Any, values: dict[str, Any]) -> dict[str, list[int]] | None:
    """--input-shape without the inputs that --input-value made constants (their value gives the shape)."""
    shapes = parse_input_shapes(input_shapes)
    for name, v in values.items():
        if name in shapes and [int(d) for d in np.shape(v)] != shapes[name]:
            raise InputError(f"--input-shape {name}={','.join(map(str, shapes[name]))} does not match the shape "
                             f"{list(np.shape(v))} of its --input-value", f"give one of the two for {name}")
    return {k: v for k, v in shapes.items() if k not in values} or None


def _merge(records: list[dict]) -> list[dict]:
    """One record per repair: a repair that ran in both rounds keeps its first arguments and last counts."""
    out: dict[str, dict] = {}
    for r in records:
        if r["name"] in out and "control_flow_nodes" in r:
            out[r["name"]]["control_flow_nodes"] = [out[r["name"]]["control_flow_nodes"][0], r["control_flow_nodes"][1]]
        else:
            out.setdefault(r["name"], {}).update(r)
    return list(out.values())


def precision_repairs(prec) -> dict:
    """load_repaired's quantized / activation_bits / weight_bits for a compile or audit at `prec`."""
    q = prec.quantized
    return {"quantized": q, "activation_bits": prec.activation_bits if q else 0, "weight_bits": prec.weight_bits if q else 0}


def load_repaired(source: Any, input_shapes: Any = None, input_values: Any = None, allow_dynamic: bool = False,
                  allow_control_flow: bool = False, quantized: bool = False, activation_bits: int = 0,
                  weight_bits: int = 0) -> LoadedOnnx:
    import onnx
    first = load_onnx(source, None, allow_dynamic=True)
    bits = {"activation_bits": activation_bits, "weight_bits": weight_bits}
    ctx = RepairContext(parse_input_values(input_values, first.inputs), quantized=quantized, **bits)
    model = onnx.ModelProto()
    model.CopyFrom(first.model)
    # Two rounds: branches are folded before the shapes are fixed (ONNX Runtime's optimizer crashes on an
    # If whose dead branch no longer type-checks with the fixed shapes), and again after, when the
    # Shape → Equal conditions of the inlined branches have become constants.
    done = apply_repairs(model, ctx)
    loaded = load_onnx(model, _shapes_left(input_shapes, ctx.input_values), allow_dynamic=True)
    again = apply_repairs(loaded.model, RepairContext(quantized=quantized, **bits))
    if again:          # shapes inferred again from the fixed inputs through what the second round changed
        shapes = loaded.fixed_shapes
        loaded = load_onnx(loaded.model, shapes or None, allow_dynamic=True)
    loaded.path, loaded.sha256 = first.path, first.sha256
    loaded.repairs, loaded.detached_metadata = _merge(done + again), ctx.detached_metadata
    if not allow_control_flow and (cf := control_flow_fix(loaded.model)):
        raise cf
    if not allow_dynamic:
        loaded.require_static()
    return loaded
