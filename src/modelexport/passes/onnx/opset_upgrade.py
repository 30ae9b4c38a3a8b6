"""`opset-upgrade`: convert the model to the opset a later repair needs (onnx.version_converter).

Only when needed: when an empty optional input may be dropped only from a later opset (Resize
`roi` is required below opset 13; paddle2onnx writes opset 11/12 models with it empty), and when
the model will be quantized per channel below opset 13: ONNX Runtime's quantizer then writes
DequantizeLinear with `axis`, an attribute of opset 13, and the QDQ model does not load
(`Unrecognized attribute: axis for operator DequantizeLinear`; MTCNN's opset-12 nets). And when a
Clip holds its bounds as attributes (opset 6-10): the QNN EP reads a Clip's bounds from its inputs
only, so it compiled such a Clip with no bounds at all and the model computed something else on the
HTP (pp-ocr's opset-10 DBNet: every HardSwish's Clip(0, 6) dropped, -119 dB). From opset 11 the
bounds are inputs, which the EP reads.
"""
from __future__ import annotations

from ...core.errors import UnsupportedError
from . import RepairContext, onnx_repair
from .empty_inputs import needed_opset
from .graph_edit import default_opset

QDQ_OPSET = 13          # per-channel DequantizeLinear (axis)
CLIP_INPUTS_OPSET = 11  # Clip's min/max become inputs


def clip_attribute_bounds(model) -> list[str]:
    """Clip nodes that hold min/max as attributes (opset < 11), which the QNN EP does not read."""
    return [n.name or n.output[0] for n in model.graph.node if n.op_type == "Clip" and n.domain in ("", "ai.onnx")
            and any(a.name in ("min", "max") for a in n.attribute)]


@onnx_repair("opset-upgrade", 40, "upgrade the default-domain opset when a later repair needs it (onnx.version_converter)")
def upgrade_opset(model, ctx: RepairContext) -> dict | None:
    have = default_opset(model)
    reasons = {}
    if (empty := needed_opset(model)) is not None:
        reasons[empty] = "empty optional inputs that are optional only from this opset"
    if clip_attribute_bounds(model):
        reasons.setdefault(CLIP_INPUTS_OPSET, "Clip's min/max are attributes below opset 11, and the QNN EP reads "
                                              "them from inputs only")
    if ctx.quantized:
        reasons.setdefault(QDQ_OPSET, "per-channel quantization writes DequantizeLinear with axis (opset 13)")
    want = max(reasons, default=None)
    if want is None or have >= want:
        return None
    from onnx import version_converter
    try:
        converted = version_converter.convert_version(model, want)
    except Exception as e:               # the converter raises its own C++ errors
        why = reasons[want].split(",")[0]
        raise UnsupportedError(f"the model needs opset {want} ({why}) and onnx's version converter "
                               f"could not convert it from {have}: {str(e).splitlines()[0][:300]}",
                               f"re-export the model at opset {want} or later") from None
    model.CopyFrom(converted)
    return {"from": have, "to": want, "why": "; ".join(reasons[v] for v in sorted(reasons) if v > have)}
