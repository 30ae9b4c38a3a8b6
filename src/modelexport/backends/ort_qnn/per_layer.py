"""`verify --per-layer` of an ONNX Runtime bundle: the float ONNX and its QDQ (fake-quant) twin, layer by
layer on the CPU EP; the per-output numbers are the compiled graph's on the HTP simulator.

ONNX bundles keep both models (roles float-model / quantized-model), so every layer can be compared;
the compiled context binary exposes only its graph outputs."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...core.errors import InputError
from ...quant.per_layer import per_layer
from ...quant.precision import pass_mark
from .verify import stored_samples, verify_bundle

SOURCE = "float ONNX vs QDQ fake-quant on the CPU EP (the context binary exposes only its outputs)"


def ort_per_layer(bundle, inputs, part, target, threshold_db, min_sqnr, max_samples) -> tuple[Any, list, str]:
    """→ (VerifyReport of the compiled graph, [PerLayerReport per part], where the numbers come from)."""
    layers = _per_layer(bundle, inputs, part, threshold_db, max_samples)
    return verify_bundle(bundle.path, inputs, part, target, min_sqnr, max_samples), layers, SOURCE


def _per_layer(bundle, inputs, part, threshold_db, max_samples):
    out = []
    for pm in bundle.manifest.parts:
        if part and pm.name != part:
            continue
        files = pm.files
        if not files.quantized_model:
            raise InputError(f"{bundle.path}: part {pm.name} is {pm.precision}, with no quantized model to compare layers of",
                             "per-layer numerics compare a quantized (QDQ) model with its float one; compile with --precision 8a8w/16a8w/...")
        if inputs:
            samples = [inputs] if isinstance(inputs, dict) else _given(inputs, pm)
        else:
            samples = stored_samples(bundle, pm.name)
        if max_samples:
            samples = samples[:max_samples]
        thr = pass_mark(threshold_db, pm.precision)
        out.append(per_layer(bundle.file(files.float_model), bundle.file(files.quantized_model), samples, thr,
                             pm.precision, pm.name))
    if not out:
        raise InputError(f"{bundle.path} has no part {part!r}", "leave --part out or name one of the bundle's parts")
    return out


def _given(paths, pm) -> list[dict]:
    import numpy as np
    names = [i.name for i in pm.inputs]
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
