"""`modelexport verify BUNDLE --per-layer`: the whole-model verify plus a layer-by-layer diff of the
float model and its fake-quant twin, written into the bundle's manifest.numerics and report.html.

Each bundle format brings its own per-layer run (its row's `per_layer` in core/formats.py): ONNX
Runtime bundles compare their float and QDQ ONNX models (backends/ort_qnn/per_layer.py); LLM bundles
re-export the float decoder from the source model and compare on the calibration text
(backends/llm_qnn/per_layer.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..contract import open_bundle
from ..contract.bundle import refresh_report, save_manifest
from ..core.errors import UnsupportedError
from ..core.formats import bundle_format
from .runners import check_verify_arguments


def per_layer_verify(bundle_path: str | Path, inputs=None, part: str | None = None, target: str | None = None,
                     threshold_db: float | None = None, min_sqnr: float | None = None, max_samples: int | None = None,
                     record: bool = True) -> tuple[Any, list]:
    """→ (VerifyReport of the compiled graph, [PerLayerReport per part]); records both in the bundle."""
    check_verify_arguments(min_sqnr, max_samples, threshold_db)
    bundle = open_bundle(bundle_path)
    m = bundle.manifest
    row = bundle_format(m.format, m.kind)
    run = row.entry("per_layer") if row else None
    if run is None:
        raise UnsupportedError(f"--per-layer is not available for {m.format} {m.kind} bundles ({bundle.path}) yet",
                               "run `modelexport verify` without --per-layer for the per-output numbers; for a .pte, "
                               "export the model to ONNX and compile that for a per-layer diff")
    rep, layers, source = run(bundle, inputs, part, target, threshold_db, min_sqnr, max_samples)
    if record:
        bundle = open_bundle(bundle_path)      # re-read: verify may have touched it
        g = rep.graphs[0]
        pl = layers[0]
        num = dict(bundle.manifest.numerics or {})
        num.update({"outputs": [{"name": o.name, "sqnr_db": min(o.sqnr_db, 200.0), "cosine": o.cosine,
                                 "max_abs_error": o.max_abs_error} for o in g.outputs],
                    "threshold_db": g.threshold_db, "part": g.part, "target": g.target, "samples": g.samples,
                    "per_layer": [{"name": x.name, "sqnr_db": x.sqnr_db} for x in pl.layers],
                    "per_layer_threshold_db": pl.threshold_db, "first_bad_layer": pl.first_bad_layer,
                    "per_layer_culprit": pl.culprit_layer, "suggested_override": pl.suggestion,
                    "per_layer_source": source, "per_layer_seconds": round(pl.seconds, 2)})
        bundle.manifest.numerics = num
        save_manifest(bundle)
        refresh_report(bundle)
    return rep, layers
