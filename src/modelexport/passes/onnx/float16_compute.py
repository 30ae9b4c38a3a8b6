"""`float16-as-float32`: in a quantized compile, float16 weights and activations are computed in float32.

A Keras mixed-precision model exported by tf2onnx (slovorez's morpheme tagger) keeps float16
weights and casts its activations to float16 around them, inside a float32 graph. ONNX Runtime's
quantizer then writes float16 scales for those weights, and a DequantizeLinear below opset 19 takes
float32 scales only: the QDQ model does not load ("Type 'tensor(float16)' of input parameter
(w_scale) of operator (DequantizeLinear) ... is invalid"). The quantized graph computes in integers
whatever type the float model used, so the float16 parts are made float32 before quantizing: float16
initializers and Constants widened, Casts to float16 cast to float32. A float16 graph input or output
keeps its type through a Cast at the boundary. fp16 compiles keep the model as it is.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair

_F16, _F32 = 10, 1           # onnx.TensorProto.FLOAT16, FLOAT


@onnx_repair("float16-as-float32", 41, "quantized compiles: float16 weights and activations inside the graph are "
             "computed in float32 (the quantizer's float16 scales do not load below opset 19)")
def float16_as_float32(model, ctx: RepairContext) -> dict | None:
    if not ctx.quantized:
        return None
    g = model.graph
    inits = [t for t in g.initializer if t.data_type == _F16]
    consts = [n for n in g.node if n.op_type in ("Constant", "ConstantOfShape") for a in n.attribute
              if a.name == "value" and a.t.data_type == _F16]
    outputs = {o.name for o in g.output}
    casts = [n for n in g.node if n.op_type == "Cast" and n.output[0] not in outputs  # not a float16 output's own
             for a in n.attribute if a.name == "to" and a.i == _F16]
    if not (inits or consts or casts):
        return None
    from onnx import numpy_helper
    for t in inits:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype("float32"), t.name))
    for n in consts:
        a = next(a for a in n.attribute if a.name == "value")
        a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype("float32"), a.t.name))
    for n in casts:
        next(a for a in n.attribute if a.name == "to").i = _F32
    boundary = _keep_boundary_types(model)
    del g.value_info[:]              # float16 types of intermediate values: inferred again
    return {"initializers": len(inits), "constants": len(consts), "casts": len(casts),
            **({"boundary_casts": boundary} if boundary else {})}


def _keep_boundary_types(model) -> list[str]:
    """Float16 graph inputs and outputs keep their type: a Cast to float32 after an input, from float32
    before an output."""
    from onnx import helper
    g = model.graph
    kept = []
    for v in g.input:
        if v.type.tensor_type.elem_type == _F16:
            wide = f"{v.name}__float32"
            for n in g.node:
                n.input[:] = [wide if t == v.name else t for t in n.input]
            g.node.insert(0, helper.make_node("Cast", [v.name], [wide], to=_F32, name=f"{v.name}/as_float32"))
            kept.append(v.name)
    made_by_cast = {n.output[0] for n in g.node if n.op_type == "Cast"}
    for v in g.output:
        if v.type.tensor_type.elem_type == _F16 and v.name not in made_by_cast:
            wide = f"{v.name}__float32"
            for n in g.node:
                n.output[:] = [wide if t == v.name else t for t in n.output]
                n.input[:] = [wide if t == v.name else t for t in n.input]
            g.node.append(helper.make_node("Cast", [wide], [v.name], to=_F16, name=f"{v.name}/as_float16"))
            kept.append(v.name)
    return kept
