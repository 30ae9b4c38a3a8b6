"""`metadata-props`: detach the model's metadata_props before quantization, put them back after.

ONNX Runtime's qnn_preprocess_model (1.2x) passes the repeated StringStringEntryProto field to
dict.update, which raises `TypeError: cannot convert dictionary update sequence element #0`
for any model that carries metadata (RapidOCR's recognizer holds its 13 k-character vocabulary
there). The props are kept in the context and re-attached to the bundle's float and QDQ models.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair


def attach(model, props: list[tuple[str, str]]) -> None:
    """Put detached props back on `model` (after any earlier ones of the same key)."""
    have = {p.key for p in model.metadata_props}
    for k, v in props:
        if k not in have:
            entry = model.metadata_props.add()
            entry.key, entry.value = k, v


@onnx_repair("metadata-props", 10, "detach metadata_props (they crash qnn_preprocess_model); re-attached after quantization")
def detach_metadata(model, ctx: RepairContext) -> dict | None:
    if not model.metadata_props:
        return None
    props = [(p.key, p.value) for p in model.metadata_props]
    ctx.detached_metadata.extend(props)
    del model.metadata_props[:]
    return {"keys": [k for k, _ in props], "chars": sum(len(v) for _, v in props), "reattached": True}
