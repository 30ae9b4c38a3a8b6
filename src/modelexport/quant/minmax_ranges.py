"""MinMax calibration ranges for ONNX Runtime's QDQ quantizer, computed in one cheap pass.

ONNX Runtime's `MinMaxCalibrater` finds where to insert each tensor's ReduceMin/ReduceMax by
scanning the node list, once per tensor, in Python: quadratic in the graph's size. On a 30-layer
decoder (~4,000 nodes) that took ~90 s per graph (py-spy), for 8 inference runs of a second each.
Here the reduce nodes are appended at the end of the graph (ONNX Runtime orders the nodes itself),
the tensors are chosen by the calibrator's own rule (every float, non-initializer input and output
of a node whose type is quantized) and reduced the same way, so the ranges are the ones it would
compute (tested equal). They reach the quantizer through its calibration cache file
(`quantize_static(calibration_cache_path=...)`), so the quantization itself stays ONNX Runtime's.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from pathlib import Path
from typing import Iterable

_FLOAT_TYPES = (1, 10)   # onnx.TensorProto.FLOAT, FLOAT16


def tensors_to_calibrate(model, op_types: Iterable[str] | None) -> list[str]:
    """The tensors ONNX Runtime's calibrator would calibrate, in a stable order."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    infos = {vi.name: vi for vi in inferred.graph.value_info}
    infos.update({vi.name: vi for vi in model.graph.output})
    infos.update({vi.name: vi for vi in model.graph.input})
    inits = {i.name for i in model.graph.initializer}
    ops = set(op_types) if op_types else None
    seen: dict[str, None] = {}
    for node in model.graph.node:
        if ops is not None and node.op_type not in ops:
            continue
        for name in (*node.input, *node.output):
            vi = infos.get(name)
            if (vi is not None and name not in inits and vi.type.HasField("tensor_type")
                    and vi.type.tensor_type.elem_type in _FLOAT_TYPES):
                seen[name] = None
    return list(seen)


def minmax_ranges(model_path: str | Path, samples: Iterable[dict], op_types: Iterable[str] | None = None):
    """ONNX Runtime `TensorsData` (MinMax) of `model_path` over `samples` (input dicts)."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper
    from onnxruntime.quantization.calibrate import CalibrationMethod, TensorsData

    model_path = Path(model_path)
    model = onnx.load(str(model_path), load_external_data=False)
    names = tensors_to_calibrate(model, op_types)
    outputs = []
    for i, name in enumerate(names):
        for op in ("ReduceMin", "ReduceMax"):
            out = f"__range_{i}_{op}"
            # no axes: reduce everything (opset 13 and 18 alike), one scalar per tensor and run
            model.graph.node.append(helper.make_node(op, [name], [out], keepdims=0, name=out))
            model.graph.output.append(onnx.ValueInfoProto(name=out))   # type left to ONNX Runtime
            outputs.append(out)
    # saved beside the original so that its external data (a relative path) resolves
    tmp = model_path.parent / f".ranges-{uuid.uuid4().hex}.onnx"
    try:
        onnx.save(model, str(tmp))
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL   # as the calibrator runs it
        session = ort.InferenceSession(str(tmp), opts, providers=["CPUExecutionProvider"])
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    lo = np.full(len(names), np.inf, dtype=np.float64)
    hi = np.full(len(names), -np.inf, dtype=np.float64)
    n_runs = 0
    for feed in samples:
        vals = session.run(outputs, feed)
        lo = np.fmin(lo, np.array(vals[0::2], dtype=np.float64))   # fmin/fmax: NaN-ignoring, as nanmin is
        hi = np.fmax(hi, np.array(vals[1::2], dtype=np.float64))
        n_runs += 1
    if not n_runs:
        raise ValueError("no calibration samples")
    return TensorsData(CalibrationMethod.MinMax,
                       {n: (np.array([a], dtype=np.float32), np.array([b], dtype=np.float32))
                        for n, a, b in zip(names, lo, hi)})


def quantize_with_ranges(model_input: str | Path, model_output: str | Path, config, ranges) -> None:
    """ONNX Runtime's `quantize(model_input, model_output, config)` with `ranges` as its calibration."""
    from onnxruntime.quantization.calibrate import save_tensors_data
    from onnxruntime.quantization.quantize import quantize_static

    from .ort_fast_paths import fast_quantizer

    with tempfile.TemporaryDirectory(prefix="modelexport-ranges-") as d, fast_quantizer():
        cache = Path(d) / "ranges.json"
        save_tensors_data(ranges, cache)
        quantize_static(
            model_input, model_output, None, calibrate_method=config.calibrate_method,
            quant_format=config.quant_format, activation_type=config.activation_type,
            weight_type=config.weight_type, op_types_to_quantize=config.op_types_to_quantize,
            nodes_to_quantize=config.nodes_to_quantize, nodes_to_exclude=config.nodes_to_exclude,
            per_channel=config.per_channel, reduce_range=config.reduce_range,
            use_external_data_format=config.use_external_data_format,
            calibration_providers=config.calibration_providers, extra_options=config.extra_options,
            calibration_cache_path=cache)
