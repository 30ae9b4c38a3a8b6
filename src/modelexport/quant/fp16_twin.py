"""The fp16 twin of a float ONNX model: what an fp16 compile stores, emulated on the CPU EP.

The HTP runs an fp16 compile with every activation and constant in float16. The twin keeps the
float32 graph and rounds each float constant to float16 and each float node output through a
float16 Cast and back, under its own name, so that `per_layer` compares it with the float model
layer by layer exactly as it compares a QDQ model. What it shows is the storage: a value past
65,504 becomes inf, a value below 6e-8 becomes 0 (an epsilon of 1e-10 guarding a Log included).
The arithmetic inside one op (a long sum) stays float32 here, so the twin is at least as good as
the HTP; a layer that is bad in the twin is bad on the HTP.
"""
from __future__ import annotations

import numpy as np

FP16_MAX = 65504.0
FP16_TINY = 5.96e-8          # the smallest float16 subnormal: anything smaller is 0
_FLOAT = 1                   # onnx.TensorProto.FLOAT


def fp16_twin(model):
    """→ a copy of `model` (onnx.ModelProto) whose float constants and node outputs are rounded to float16."""
    import onnx
    from onnx import helper, numpy_helper, shape_inference
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    g = twin.graph
    for t in g.initializer:
        if t.data_type == _FLOAT:
            t.CopyFrom(numpy_helper.from_array(_round(numpy_helper.to_array(t)), t.name))
    floats = _float_tensors(shape_inference.infer_shapes(model))
    nodes = []
    for node in g.node:
        if node.op_type == "Constant":
            _round_constant(node)
        renamed = []
        for i, out in enumerate(node.output):
            if out and out in floats:
                node.output[i] = f"{out}__fp32"
                renamed.append(out)
        nodes.append(node)
        for out in renamed:
            nodes.append(helper.make_node("Cast", [f"{out}__fp32"], [f"{out}__fp16"], to=onnx.TensorProto.FLOAT16,
                                          name=f"{out}__to_fp16"))
            nodes.append(helper.make_node("Cast", [f"{out}__fp16"], [out], to=_FLOAT, name=f"{out}__from_fp16"))
    del g.node[:]
    g.node.extend(nodes)
    return twin


def _round(a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return a.astype(np.float16).astype(np.float32)


def _round_constant(node) -> None:
    from onnx import numpy_helper
    for a in node.attribute:
        if a.name == "value" and a.t.data_type == _FLOAT:
            a.t.CopyFrom(numpy_helper.from_array(_round(numpy_helper.to_array(a.t)), a.t.name))


def _float_tensors(model) -> set[str]:
    """Names of the node outputs known to be float32 (from shape inference and the graph outputs)."""
    vis = list(model.graph.value_info) + list(model.graph.output)
    return {v.name for v in vis if v.type.tensor_type.elem_type == _FLOAT}


def fp16_cause(values: list[np.ndarray], op_type: str) -> str:
    """Why a layer's float values do not survive float16, in words (or '' when they fit)."""
    a = np.abs(np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in values]))
    a = a[np.isfinite(a)]
    if not a.size:
        return ""
    top = float(a.max())
    if top > FP16_MAX:
        share = float(np.mean(a > FP16_MAX))
        return f"its float values reach {top:.4g}, past float16's largest (65,504): {share:.1%} of them become inf"
    nz = a[a > 0]
    if nz.size and float(np.mean(nz < FP16_TINY)) > 0.01:
        return (f"{float(np.mean(nz < FP16_TINY)):.1%} of its nonzero float values are below float16's smallest "
                f"(6e-8; down to {float(nz.min()):.3g}) and become 0 (the {op_type} after them sees 0 or inf)")
    return ""
