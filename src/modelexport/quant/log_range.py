"""A 16-bit Log's output range of at least LOG_MIN_SPAN, so the HTP computes it.

The HTP computes a Log whose output is quantized at 16 bits as all zeros when that output's range is
narrower than 4 (a scale below 2**-14): x in [1, 50] (Log in [0, 3.9]) gives 0.0 dB against its QDQ
model on the CPU, x in [1, 60] (Log in [0, 4.1]) 91.9 dB; x in [0.2, 1] 0.0 dB, x in [0.015, 1]
80.9 dB. 8-bit Logs, fp16 Logs, and Exp, Sqrt, Reciprocal and Tanh at 16 bits over the same ranges
are computed right (tests/test_log_range.py). Such a Log's output gets a quantization range widened to
LOG_MIN_SPAN (an override of its calibrated range): 16 bits over 4.2 still step by 6.4e-5.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .calibration import CalibrationSet

LOG_MIN_SPAN = 4.2
SIXTEEN_BIT = ("QUInt16", "QInt16")


def widen_log_ranges(config, src: Path, calibration: CalibrationSet) -> list[str]:
    """Give every 16-bit Log output of the model at `src` a range of at least LOG_MIN_SPAN, as
    TensorQuantOverrides in the quantizer's `config`, from its range on the calibration samples.
    → the tensors widened."""
    import onnx
    model = onnx.load(str(src))
    overrides = config.extra_options.setdefault("TensorQuantOverrides", {})
    logs = [n.output[0] for n in model.graph.node if n.op_type == "Log"]
    logs = [t for t in logs if _quant_type(overrides.get(t), config.activation_type) in SIXTEEN_BIT]
    if not logs:
        return []
    widened = []
    for t, (lo, hi) in _ranges(model, logs, calibration).items():
        rmin, rmax = min(lo, 0.0), max(hi, 0.0)            # the quantizer's own range holds 0
        if rmax - rmin >= LOG_MIN_SPAN:
            continue
        if rmax > 0:
            rmax = rmin + LOG_MIN_SPAN
        else:
            rmin = rmax - LOG_MIN_SPAN
        entry = overrides.setdefault(t, [{}])[0]
        entry["rmin"], entry["rmax"] = np.array(rmin, np.float32), np.array(rmax, np.float32)
        widened.append(t)
    return widened


def _quant_type(entries: list[dict] | None, default) -> str:
    qt = (entries or [{}])[0].get("quant_type", default)
    return getattr(qt, "name", str(qt))


def _ranges(model, tensors: list[str], calibration: CalibrationSet) -> dict[str, tuple[float, float]]:
    """{tensor: (min, max)} over the calibration samples, the float model on the CPU EP."""
    import onnxruntime as ort
    from onnx import helper
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(helper.make_empty_tensor_value_info(t) for t in tensors if t not in have)
    try:
        data = model.SerializeToString()
    except ValueError:                       # over protobuf's 2 GB: no Log of such a model is widened
        return {}
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])  # noqa: TID251 - a float run for ranges
    inputs = {i.name for i in sess.get_inputs()}
    out = dict.fromkeys(tensors, (np.inf, -np.inf))
    for s in calibration.samples:
        for t, v in zip(tensors, sess.run(tensors, {k: v for k, v in s.items() if k in inputs})):
            v = np.asarray(v, dtype=np.float64)
            v = v[np.isfinite(v)]
            if v.size:
                out[t] = (min(out[t][0], float(v.min())), max(out[t][1], float(v.max())))
    return {t: r for t, r in out.items() if np.isfinite(r).all()}
