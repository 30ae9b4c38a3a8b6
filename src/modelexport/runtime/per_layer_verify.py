"""`modelexport verify BUNDLE --per-layer`: the whole-model verify plus a layer-by-layer diff of the
float model and its QDQ (fake-quant) twin on the CPU, written into the bundle's manifest.numerics
and report.html.

ONNX bundles keep both models (roles float-model / quantized-model), so every layer can be
compared. The compiled context binary exposes only its graph outputs, so per-layer numbers are the
fake-quant ones; the per-output numbers are from the compiled graph on the HTP simulator.
Other bundle kinds register a hook in PER_LAYER_HOOKS. LLM bundles (modelexport.backends.llm_qnn.per_layer)
re-export the float decoder from the source model and compare on the calibration text; their
per-output numbers are the fake-quant logits (the compiled graphs' agreement with fake-quant is
what `modelexport eval` measures).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from ..contract import open_bundle
from ..contract.bundle import refresh_report, save_manifest
from ..core.errors import InputError, UnsupportedError
from ..quant import get_precision

# kind → fn(bundle, inputs, part, threshold_db, max_samples) -> list[PerLayerReport]
PER_LAYER_HOOKS: dict[str, Callable[..., list]] = {}


def _onnx_per_layer(bundle, inputs, part, threshold_db, max_samples):
    from ..quant.per_layer import per_layer
    from ..backends.ort_qnn.verify import stored_samples
    out = []
    for pm in bundle.manifest.extra.get("parts", []):
        if part and pm["name"] != part:
            continue
        files = pm.get("files", {})
        if not files.get("quantized_model"):
            raise InputError(f"{bundle.path}: part {pm['name']} is {pm.get('precision')}, with no quantized model to compare layers of",
                             "per-layer numerics compare a quantized (QDQ) model with its float one; compile with --precision 8a8w/16a8w/...")
        if inputs:
            samples = [inputs] if isinstance(inputs, dict) else _given(inputs, pm)
        else:
            samples = stored_samples(bundle, pm["name"])
        if max_samples:
            samples = samples[:max_samples]
        thr = threshold_db if threshold_db is not None else get_precision(pm["precision"]).min_sqnr_db
        out.append(per_layer(bundle.file(files["float_model"]), bundle.file(files["quantized_model"]), samples, thr,
                             pm["precision"], pm["name"]))
    if not out:
        raise InputError(f"{bundle.path} has no part {part!r}", "leave --part out or name one of the bundle's parts")
    return out


def _given(paths, pm) -> list[dict]:
    import numpy as np
    names = [i["name"] for i in pm.get("inputs", [])]
    feed: dict[str, Any] = {}
    for spec in paths:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = (names[0] if len(names) == 1 else ""), spec
        p = Path(path)
        if not p.is_file():
            raise InputError(f"input file {p} does not exist", "give .npy files (name=path.npy) or one .npz")
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                feed.update({k: z[k] for k in z.files})
        else:
            if not name:
                raise InputError(f"{p}: the model has several inputs", "write --input NAME=path.npy")
            feed[name] = np.load(p, allow_pickle=False)
    return [feed]


def _llm_per_layer(*a):
    from ..backends.llm_qnn.per_layer import llm_per_layer
    return llm_per_layer(*a)


def _logits_report(bundle, pl, min_sqnr):
    """A VerifyReport for an LLM bundle from its per-layer run: the last module's (lm_head's) numbers."""
    from ..backends.ort_qnn.verify import GraphCheck, OutputCheck, VerifyReport
    last = pl.layers[-1]
    threshold = min_sqnr if min_sqnr is not None else get_precision(pl.precision).min_sqnr_db
    g = GraphCheck(pl.part, "cpu fake-quant", pl.precision, threshold, pl.samples, "calibration text (held out)")
    g.outputs.append(OutputCheck(f"logits ({last.name})", last.sqnr_db, last.cosine, last.max_abs_error, None,
                                 last.sqnr_db >= threshold))
    return VerifyReport(str(bundle.path), [g])


PER_LAYER_HOOKS["model"] = _onnx_per_layer
PER_LAYER_HOOKS["llm"] = _llm_per_layer


def per_layer_verify(bundle_path: str | Path, inputs=None, part: str | None = None, target: str | None = None,
                     threshold_db: float | None = None, min_sqnr: float | None = None, max_samples: int | None = None,
                     record: bool = True) -> tuple[Any, list]:
    """→ (VerifyReport of the compiled graph, [PerLayerReport per part]); records both in the bundle."""
    from .runners import runner_for
    bundle = open_bundle(bundle_path)
    m = bundle.manifest
    if m.format == "pte":
        raise UnsupportedError(f"--per-layer is not available for the .pte bundle {bundle.path} yet",
                               "export the model to ONNX and compile that for a per-layer diff; `verify` without --per-layer works")
    hook = PER_LAYER_HOOKS.get(m.kind)
    if hook is None:
        raise UnsupportedError(f"--per-layer is not wired up for {m.kind} bundles yet (hook: modelexport.runtime.per_layer_verify.PER_LAYER_HOOKS)",
                               "run `modelexport verify` without --per-layer for the per-output numbers")
    layers = hook(bundle, inputs, part, threshold_db, max_samples)
    if m.kind == "llm":
        rep = _logits_report(bundle, layers[0], min_sqnr)
        source = "float decoder (re-exported from the source) vs the bundle's QDQ fake-quant graph on the CPU EP"
    else:
        rep = runner_for(bundle_path).verify(bundle_path, inputs, part, target, min_sqnr, max_samples)
        source = "float ONNX vs QDQ fake-quant on the CPU EP (the context binary exposes only its outputs)"
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
