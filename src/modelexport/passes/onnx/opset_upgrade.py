"""`opset-upgrade`: convert the model to the opset a later repair needs (onnx.version_converter).

Only when needed: when an empty optional input may be dropped only from a later opset (Resize
`roi` is required below opset 13; paddle2onnx writes opset 11/12 models with it empty), and when
the model will be quantized per channel below opset 13: ONNX Runtime's quantizer then writes
DequantizeLinear with `axis`, an attribute of opset 13, and the QDQ model does not load
(`Unrecognized attribute: axis for operator DequantizeLinear`; MTCNN's opset-12 nets).
"""
from __future__ import annotations

from . import RepairContext, onnx_repair
from .empty_inputs import needed_opset
from .graph_edit import default_opset

QDQ_OPSET = 13          # per-channel DequantizeLinear (axis)


@onnx_repair("opset-upgrade", 40, "upgrade the default-domain opset when a later repair needs it (onnx.version_converter)")
def upgrade_opset(model, ctx: RepairContext) -> dict | None:
    have = default_opset(model)
    reasons = {}
    if (empty := needed_opset(model)) is not None:
        reasons[empty] = "empty optional inputs that are optional only from this opset"
    if ctx.quantized:
        reasons.setdefault(QDQ_OPSET, "per-channel quantization writes DequantizeLinear with axis (opset 13)")
    want = max(reasons, default=None)
    if want is None or have >= want:
        return None
    from onnx import version_converter

    from ...core.errors import UnsupportedError
    try:
        converted = version_converter.convert_version(model, want)
    except Exception as e:               # the converter raises its own C++ errors
        raise UnsupportedError(f"the model needs opset {want} (empty optional inputs) and onnx's version converter "
                               f"could not convert it from {have}: {str(e).splitlines()[0][:300]}",
                               f"re-export the model at opset {want} or later") from None
    model.CopyFrom(converted)
    return {"from": have, "to": want, "why": "; ".join(reasons[v] for v in sorted(reasons) if v > have)}
