"""Quantize an ONNX model to QDQ the way ONNX Runtime's QNN EP wants it.

qnn_preprocess_model (fuses patterns such as the Erf-based GELU into ops the HTP has) →
get_qnn_qdq_config (the QNN quantization rules for each op) → quantize with the user's data.
"""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..core.errors import CalibrationError, InputError, clip
from ..frontends.module_paths import onnx_module_path
from .calibration import CalibrationSet
from .log_range import widen_log_ranges
from .onnx_overrides import parse_onnx_overrides, tensor_overrides
from .ort_qnn import qnn_quantization
from .precision import Precision
from . import weight_split

# How activation ranges are set from the calibration data: ONNX Runtime's calibrators. MinMax keeps
# every value; Percentile clips each tensor's range to the 99.99th percentile of |x|, giving the bulk
# of the values more of the 256 steps at 8 bits (the HTP at 8a8w: +4.2 dB median over min-max on four
# corpus models, bench/quant_engines.md), at the cost of a histogram per tensor.
RANGE_METHODS = {"minmax": ("MinMax", {}), "percentile": ("Percentile", {"CalibPercentile": 99.99})}


@contextlib.contextmanager
def float32_histograms() -> Iterator[None]:
    """ONNX Runtime's percentile collector bins a tensor's values in the tensor's own type: a float16
    activation (a Keras mixed-precision export: slovorez) cannot hold 2048 distinct bin edges over its
    range (numpy: "Too many bins for data range"). While this runs, such values are binned as float32."""
    from onnxruntime.quantization.calibrate import HistogramCollector
    original = HistogramCollector.collect_absolute_value

    def collect(self, name_to_arr):
        return original(self, {k: _as_float32(v) for k, v in name_to_arr.items()})
    HistogramCollector.collect_absolute_value = collect
    try:
        yield
    finally:
        HistogramCollector.collect_absolute_value = original


def _as_float32(v):
    if isinstance(v, list):
        return [_as_float32(a) for a in v]
    return v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype == np.float16 else v


def quantize_onnx(float_path: Path, out_path: Path, precision: Precision, calibration: CalibrationSet,
                  per_channel: bool = True, overrides: list[str] | None = None, method: str = "minmax",
                  split_weights: bool = False) -> dict:
    """Write the QDQ model to `out_path`; returns what was done (for the manifest). `split_weights`:
    each Conv/MatMul/Gemm weight as two 8-bit halves (quant/weight_split.py)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, quantize

    qnn = qnn_quantization()
    act, weight = precision.quant_types()
    if method not in RANGE_METHODS:
        raise InputError(f"unknown calibration method {method!r}", f"choose one of: {', '.join(RANGE_METHODS)}")
    calib_name, calib_extra = RANGE_METHODS[method]
    pre = out_path.with_name(out_path.stem + ".pre.onnx")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)      # the quantizer logs "consider pre-processing" warnings at root
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            changed = qnn.qnn_preprocess_model(str(float_path), str(pre))
            src = pre if changed else float_path
            init_overrides, matched, island, split = None, {}, [], None
            parsed = _parsed_overrides(overrides, precision)
            if split_weights:
                src, split = _split(src, pre, out_path, precision, per_channel, parsed)
            graph = onnx.load(str(src), load_external_data=False)      # the graph's structure, read once
            if overrides:
                init_overrides, matched, island = tensor_overrides(graph, parsed, precision, per_channel)
            if split:
                init_overrides = (init_overrides or {}) | split.pop("init_overrides")
            config = qnn.get_qnn_qdq_config(str(src), calibration.reader(), activation_type=act, weight_type=weight,
                                        per_channel=per_channel, init_overrides=init_overrides,
                                        nodes_to_exclude=island or None, calibrate_method=CalibrationMethod[calib_name])
            config.extra_options.update(calib_extra)
            keep_constants_float(config)
            unsigned_norm_scales(config, graph, weight)
            quantize_fanned_inputs(config, graph)
            widened = widen_log_ranges(config, src, calibration)
            try:
                with float32_histograms(), contextlib.redirect_stdout(io.StringIO()):   # its percentile calibrator prints
                    quantize(str(src), str(out_path), config)
            except Exception as e:  # onnxruntime raises its own Fail/InvalidArgument classes
                msg = clip(str(e), 1000)
                if "feed" in msg.lower() or "invalid_argument" in msg.lower() or "input" in msg.lower():
                    raise CalibrationError(f"calibration failed: {msg}",
                                           "check the calibration arrays against the model's inputs") from None
                if "scale issue" in msg:   # quant_utils: a tensor's calibrated range is NaN or infinite
                    raise CalibrationError("calibration gave a tensor a NaN or infinite range (ONNX Runtime's "
                                           "quantizer: scale issue): the calibration inputs drive the float model "
                                           "out of range, e.g. random values where it expects token ids or a 0/1 mask",
                                           "calibrate on real inputs (--calibration DIR|list.txt|file.npz), or "
                                           "compile at --precision fp16, which needs no calibration") from None
                if not type(e).__module__.startswith("onnxruntime"):   # numpy's or Python's: the quantizer's own code
                    raise CalibrationError(f"ONNX Runtime's quantizer failed on this graph ({type(e).__name__}: {msg})",
                                           "compile at --precision fp16, which does not quantize; and report the model: "
                                           "modelexport has no repair for this graph yet") from None
                raise InputError(f"the float model fails to run on the CPU during calibration: {msg}",
                                 "the model itself is broken; check it with onnxruntime on the CPU first") from None
    finally:
        root.setLevel(level)
    return {"preprocessed": bool(changed), "preprocessed_model": str(src), "per_channel": per_channel,
            "activation_type": precision.activation_type, "weight_type": precision.weight_type,
            "calibration_method": calib_name,
            **({"overrides": [{"regex": k, "nodes": v} | {"precision": spec.rpartition("=")[2]}
                              for (k, v), spec in zip(matched.items(), overrides)]} if overrides else {}),
            **({"fp16_nodes": len(island)} if island else {}),
            **({"split_weights": {"layers": split["layers"]}} if split else {}),
            **({"log_ranges_widened": widened} if widened else {})}


def check_split(precision: Precision) -> None:
    """--split-weights splits 8-bit weights: a quantized precision with 8-bit weights."""
    if not precision.quantized or precision.weight_bits != 8:
        what = "keeps float weights" if not precision.quantized else f"has {precision.weight_bits}-bit weights"
        raise InputError(f"--split-weights splits 8-bit weights; {precision.name} {what}",
                         "use it with --precision 8a8w or 16a8w")


def _parsed_overrides(overrides: list[str] | None, precision: Precision) -> list:
    if not overrides:
        return []
    return parse_onnx_overrides(overrides, precision)


def _split(src: Path, pre: Path, out_path: Path, precision: Precision, per_channel: bool, parsed: list) -> tuple[Path, dict]:
    """The model with its Conv/MatMul/Gemm weights split (those an --override gives a precision of their
    own stay whole), written beside `out_path`; the preprocessed copy it replaces is removed."""
    import onnx
    check_split(precision)
    model = onnx.load(str(src))
    info = weight_split.split_weights(model, per_channel,
                                      skip=lambda n: any(o.matches(onnx_module_path(n), n.name) for o in parsed))
    path = out_path.with_name(out_path.stem + ".split.onnx")
    onnx.save(model, str(path))
    if src == pre:
        pre.unlink()
    return path, info


MOVE_OPS = {"Slice", "Squeeze", "Unsqueeze", "Reshape", "Transpose", "Split", "Flatten", "Identity", "Gather"}


def fanned_inputs(model) -> list[str]:
    """Graph inputs read only by data-movement ops, two or more of them (a streaming model's packed state
    `[1, 2, 128, 2]` sliced into each LSTM's h and c)."""
    readers: dict[str, list[str]] = {}
    for n in model.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n.op_type)
    return [i.name for i in model.graph.input
            if len(readers.get(i.name, [])) >= 2 and set(readers[i.name]) <= MOVE_OPS]


def quantize_fanned_inputs(config, model) -> None:
    """A graph input's Q/DQ pair where data-movement ops read it in several places.

    ONNX Runtime's quantizer leaves a data-movement op unquantized when its input is (a graph input
    has no range of its own), and quantizes each reader further on; at compile, ONNX Runtime moves
    those quantizations up through the data-movement ops to the input: one per path, each with its
    own range. The QNN EP takes one quantization of an input into the graph and leaves the others
    on the CPU (DTLN's state input: three QuantizeLinear nodes on the CPU at 8a8w). Quantizing such
    ops whatever their input (`ForceQuantizeNoInputCheck`) gives the input one range of its own."""
    if fanned_inputs(model):
        config.extra_options["ForceQuantizeNoInputCheck"] = True


def unsigned_norm_scales(config, model, weight) -> None:
    """An InstanceNormalization's scale at 16 bits is quantized unsigned.

    At 16-bit weights ONNX Runtime's quantizer gives the scale int16, and the HTP's InstanceNorm
    takes only an unsigned scale: the QNN EP turns an int8 scale into uint8 itself but not an int16
    one, so it refuses the op after its NHWC layout pass and the whole graph fails to compile (a
    GroupNorm exported as Reshape → InstanceNormalization → Reshape, every diffusion UNet's)."""
    from onnxruntime.quantization import QuantType
    if weight not in (QuantType.QUInt16, QuantType.QInt16):
        return
    inits = {t.name for t in model.graph.initializer}
    overrides = config.extra_options.setdefault("TensorQuantOverrides", {})
    for node in model.graph.node:
        if node.op_type == "InstanceNormalization" and len(node.input) > 1 and node.input[1] in inits:
            overrides.setdefault(node.input[1], [{"quant_type": QuantType.QUInt16}])


def keep_constants_float(config) -> None:
    """Constant nodes are not quantized as ops of their own: a consumer quantizes what it reads.

    get_qnn_qdq_config lists every op type of the model, Constant included, and a Constant's output
    then gets a Q/DQ pair for every consumer, also for inputs that are not activations: a Resize's
    scales [1, 1, 2, 2] came back as 1.0039 and 2.0000001 and the upsampled map one row or channel
    short (layout_cdla: 'C: 255 kernel channels: 256'; ppocr_det: 'broadcast 95 by 96').
    """
    config.op_types_to_quantize = [t for t in config.op_types_to_quantize if t != "Constant"]
