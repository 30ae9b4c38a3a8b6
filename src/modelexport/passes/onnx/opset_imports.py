"""`opset-imports`: one opset_import entry per domain (the highest version).

Two models merged by `onnx.compose` keep both opset lists: text2tashkeel's ensemble lists
('', 17) and ('com.microsoft', 1) twice. ONNX Runtime loads it, but the quantizer's model
wrapper does not (`Failed to find proper ai.onnx domain`), so a quantized compile fails in
calibration. 'ai.onnx' is the default domain's other spelling and is merged into ''.
"""
from __future__ import annotations

from . import RepairContext, onnx_repair


@onnx_repair("opset-imports", 1, "merge repeated opset_import entries of a domain (onnx.compose) into one, the highest version")
def merge_opset_imports(model, ctx: RepairContext) -> dict | None:
    best: dict[str, int] = {}
    for o in model.opset_import:
        d = "" if o.domain == "ai.onnx" else o.domain
        best[d] = max(best.get(d, 0), o.version)
    if len(best) == len(model.opset_import):
        return None
    from onnx import helper
    repeated = sorted({o.domain or "ai.onnx" for o in model.opset_import
                       if sum(("" if p.domain == "ai.onnx" else p.domain) == ("" if o.domain == "ai.onnx" else o.domain)
                              for p in model.opset_import) > 1})
    del model.opset_import[:]
    model.opset_import.extend(helper.make_opsetid(d, v) for d, v in best.items())
    return {"domains": repeated, "kept": {d or "ai.onnx": best[d] for d in sorted(best) if (d or "ai.onnx") in repeated}}
