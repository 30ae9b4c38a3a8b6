"""Vectorized stand-ins for the Python loops of ONNX Runtime's QDQ quantizer (1.32), active only
while our own `quantize_with_ranges` call runs. Each computes exactly what the loop it replaces
computes (the tests compare whole quantized models byte for byte); the quantization stays ONNX
Runtime's. Measured with cProfile on SmolLM2's ar1 decoder (16a4w, 113 s per graph before):

| loop (ONNX Runtime)                                   | cost per graph | replaced by                 |
| `ONNXModel.replace_input_of_all_nodes`: every input   | ~21 s          | an index of each tensor's   |
|   of every node, per quantized tensor                 |                |   consumers                 |
| per-channel scale/zero point: one Python call per     | ~23 s          | one reduction per weight    |
|   output channel (204,672 calls)                      |                |                             |
| per-channel quantization of a weight, channel by      | ~10 s          | one broadcast division      |
|   channel                                             |                |                             |
| `pack_bytes_to_4bit`: a Python loop per byte          | ~20 s          | numpy nibble packing        |
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import numpy as np
from onnx import TensorProto

# the types the vectorized paths cover (float 8 stays on ONNX Runtime's own path)
_INT_TYPES = (TensorProto.INT4, TensorProto.UINT4, TensorProto.INT8, TensorProto.UINT8, TensorProto.INT16,
              TensorProto.UINT16)


# Bumped by every input edit made outside `_replace_input_of_all_nodes` (ONNX Runtime's static
# `replace_node_input`): the consumer index below is then rebuilt before it is used again.
_EDITS_ELSEWHERE = [0]


def _consumers(model) -> dict[str, list]:
    """{tensor: nodes reading it} of an ONNXModel, kept on it while the quantizer runs. The quantizer
    only appends nodes between two replacements, so new nodes are indexed as they appear; anything
    else (a node removed, the list rebuilt, an input edited elsewhere) shows as a changed last node,
    a shorter list or a bumped edit count, and the index is built again from the graph."""
    nodes = model.model.graph.node
    state = model.__dict__.get("_modelexport_consumers")
    stale = (state is None or state["edits"] != _EDITS_ELSEWHERE[0] or len(nodes) < state["seen"]
             or (state["seen"] and nodes[state["seen"] - 1] is not state["last"]))
    if stale:
        state = {"index": {}, "seen": 0, "last": None, "edits": _EDITS_ELSEWHERE[0]}
        model.__dict__["_modelexport_consumers"] = state
    index = state["index"]
    for i in range(state["seen"], len(nodes)):
        node = nodes[i]
        for name in node.input:
            index.setdefault(name, []).append(node)
    state["seen"] = len(nodes)
    state["last"] = nodes[len(nodes) - 1] if len(nodes) else None
    return index


def _replace_input_of_all_nodes(self, old_input_name, new_input_name):
    """ONNX Runtime's loop visits every input of every node for each quantized tensor (935 tensors x
    ~10,000 nodes per SmolLM2 chunk: 5-8 s); here the nodes come from the consumer index."""
    index = _consumers(self)
    moved = []
    for node in index.pop(old_input_name, []):
        if old_input_name in node.input:     # an entry may be out of date: the graph is the truth
            for j, name in enumerate(node.input):
                if name == old_input_name:
                    node.input[j] = new_input_name
            moved.append(node)
    if moved:
        index.setdefault(new_input_name, []).extend(moved)


def _make_replace_node_input(original: Callable) -> Callable:
    def replace_node_input(node, old_input_name, new_input_name):
        _EDITS_ELSEWHERE[0] += 1
        return original(node, old_input_name, new_input_name)
    return staticmethod(replace_node_input)


def pack_bytes_to_4bit(src_8bit: bytes) -> bytearray:
    """Two 4-bit values per byte, the first in the low nibble (as ONNX Runtime's loop packs them)."""
    src = np.frombuffer(bytes(src_8bit), dtype=np.uint8)
    if src.size % 2:
        src = np.append(src, np.uint8(0))
    return bytearray(((src[1::2] & 0xF) << 4 | (src[0::2] & 0xF)).astype(np.uint8).tobytes())


def channel_quant_params(data: np.ndarray, axis: int, quant_type: int, symmetric: bool, reduce_range: bool,
                         min_real_range: float | None = None):
    """ONNX Runtime's `compute_data_quant_params` for every slice along `axis` at once: (zero
    points, scales), each 1-D over the channels, in the dtypes its per-channel loop returns."""
    from onnxruntime.quantization.quant_utils import get_qmin_qmax_for_qType

    qmin, qmax = get_qmin_qmax_for_qType(quant_type, reduce_range, symmetric=symmetric)
    others = tuple(i for i in range(data.ndim) if i != axis)
    zero = np.zeros((), dtype=data.dtype)
    rmin = np.minimum(data.min(axis=others), zero)
    rmax = np.maximum(data.max(axis=others), zero)
    if min_real_range is not None:
        rmax = np.maximum(rmax, rmin + np.asarray(min_real_range, dtype=rmin.dtype))
    if symmetric:
        absmax = np.maximum(np.abs(rmin), np.abs(rmax))
        rmin, rmax = -absmax, absmax
    dq = np.float64(qmax) - np.float64(qmin)
    scale64 = (rmax.astype(np.float64) - rmin.astype(np.float64)) / dq
    stored = scale64.astype(data.dtype)
    tiny = np.finfo(data.dtype).smallest_subnormal if data.dtype == np.float16 else np.finfo(data.dtype).tiny
    degenerate = (stored if data.dtype == np.float16 else scale64) < tiny
    if symmetric:
        zp = np.full(scale64.shape, np.round((qmin + qmax) / np.float64(2.0)), dtype=np.float64)
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            zp = np.round(qmin - rmin / scale64)
    zp = np.where(degenerate, 0, zp).astype(qmin.dtype)
    scale = np.where(degenerate, np.array(1.0, data.dtype), stored).astype(data.dtype)
    return zp, scale


def _channel_params_or_none(quantizer, name: str, info, inits: dict) -> Any:
    """QuantizationParams for a per-channel weight the vectorized path covers exactly, else None."""
    from onnxruntime.quantization.base_quantizer import QuantizationParams
    from onnxruntime.quantization.qdq_quantizer import QDQQuantTensorType
    from onnxruntime.quantization.quant_utils import normalize_axis, tensor_proto_to_array

    init = inits.get(name)
    is_weight = info.tensor_type is QDQQuantTensorType.WEIGHT
    if init is None or not is_weight or quantizer.block_size > 0:
        return None
    if quantizer.tensor_quant_overrides.overrides_scale_zp(name):
        return None
    overrides = quantizer.tensor_quant_overrides.get(name, [{}])
    if any("rmin" in o or "rmax" in o for o in overrides):
        return None
    axis = overrides[0].get("axis", info.axis)
    if axis is None:
        return None
    quant_type = overrides[0]["quant_type"].tensor_type if "quant_type" in overrides[0] else quantizer.weight_qType
    if quant_type not in _INT_TYPES:
        return None
    data = tensor_proto_to_array(init)
    ok, axis = normalize_axis(axis, data.ndim)
    if not ok or data.dtype not in (np.float32, np.float16) or data.size == 0:
        return None
    symmetric = overrides[0].get("symmetric", True)   # per-channel weights default to symmetric
    reduce_range = overrides[0].get("reduce_range", quantizer.reduce_range)
    zp, scale = channel_quant_params(data, axis, quant_type, symmetric, reduce_range, quantizer.min_real_range)
    return QuantizationParams(zero_point=zp, scale=scale, quant_type=quant_type, axis=axis)


def _make_calc_initializer_quant_params(original: Callable) -> Callable:
    def calc(self):
        inits = {i.name: i for i in self.model.initializer()}
        fast = {}
        for name, info in self.tensors_to_quantize.items():
            params = _channel_params_or_none(self, name, info, inits)
            if params is not None:
                fast[name] = params
        everything = self.tensors_to_quantize
        self.tensors_to_quantize = {k: v for k, v in everything.items() if k not in fast}
        try:
            rest = original(self)
        finally:
            self.tensors_to_quantize = everything
        return {k: fast[k] if k in fast else rest[k] for k in everything if k in fast or k in rest}
    return calc


def _quantize_rows(data, scale, zero_point, qmin, qmax, dtype, rows_per_step: int = 0):
    """clip(round(data / scale) + zero_point) in `dtype`, a few rows at a time: an LLM head of
    400 MB in float32 would otherwise take three more float copies of itself at once."""
    rows_per_step = rows_per_step or max(1, 2**22 // max(1, data[0].size))
    q = np.empty(data.shape, dtype)
    for i in range(0, data.shape[0], rows_per_step):
        rows = slice(i, i + rows_per_step)
        s = scale[rows] if scale.ndim and scale.shape[0] > 1 else scale
        z = zero_point[rows] if zero_point.ndim and zero_point.shape[0] > 1 else zero_point
        block = data[rows].astype(np.float32) / s
        np.round(block, out=block)
        block += z
        np.clip(block, qmin, qmax, out=block)
        q[rows] = block
    return q


def _make_quantize_onnx_initializer(original: Callable) -> Callable:
    def quantize_onnx_initializer(weight, quant_type, zero_point, scale, axis=None, quant_weight_name=None, block_size=0):
        import onnx
        from onnxruntime.quantization.quant_utils import (ONNX_TYPE_TO_NP_TYPE, TENSOR_NAME_QUANT_SUFFIX,
                                                          get_qmin_qmax_for_qType, tensor_proto_to_array)
        if block_size > 0 or quant_type not in _INT_TYPES:
            return original(weight, quant_type, zero_point, scale, axis, quant_weight_name, block_size)
        data = tensor_proto_to_array(weight)
        per_tensor = axis is None      # an embedding table: its 8-bit scale is one for the whole table
        channels = 1 if per_tensor else data.shape[axis]
        if np.size(scale) != channels or np.size(zero_point) != channels or data.ndim == 0:
            return original(weight, quant_type, zero_point, scale, axis, quant_weight_name, block_size)
        shape = [1] * data.ndim          # per tensor: broadcast as is
        if not per_tensor:
            shape[axis] = data.shape[axis]
        qmin, qmax = get_qmin_qmax_for_qType(quant_type, reduce_range=False, symmetric=False)
        q = _quantize_rows(data, np.asarray(scale).reshape(shape), np.asarray(zero_point).reshape(shape), qmin, qmax,
                           ONNX_TYPE_TO_NP_TYPE[quant_type])
        name = quant_weight_name or f"{weight.name}{TENSOR_NAME_QUANT_SUFFIX}"
        if quant_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
            return onnx.helper.make_tensor(name, quant_type, weight.dims, bytes(pack_bytes_to_4bit(q.tobytes())), raw=True)
        return onnx.numpy_helper.from_array(np.asarray(q).reshape(weight.dims), name)
    return quantize_onnx_initializer


def _patches() -> list[tuple[Any, str, Callable[[Callable], Callable]]]:
    """(owner, attribute, make replacement from the original): every name the loops are reached by."""
    from onnxruntime.quantization import base_quantizer, quant_utils, qdq_quantizer
    from onnxruntime.quantization.onnx_model import ONNXModel
    return [
        (ONNXModel, "replace_input_of_all_nodes", lambda orig: _replace_input_of_all_nodes),
        (ONNXModel, "replace_node_input", _make_replace_node_input),
        (quant_utils, "pack_bytes_to_4bit", lambda orig: pack_bytes_to_4bit),
        (base_quantizer, "pack_bytes_to_4bit", lambda orig: pack_bytes_to_4bit),
        (qdq_quantizer, "quantize_onnx_initializer", _make_quantize_onnx_initializer),
        (qdq_quantizer.QDQQuantizer, "_calc_initializer_quant_params", _make_calc_initializer_quant_params),
    ]


@contextlib.contextmanager
def fast_quantizer():
    """ONNX Runtime's quantizer with the vectorized loops, for the duration of the block."""
    saved = []
    try:
        for owner, attr, make in _patches():
            # put back as it was defined: a class's staticmethod must not come back a plain function
            saved.append((owner, attr, vars(owner)[attr]))
            setattr(owner, attr, make(getattr(owner, attr)))
        yield
    finally:
        for owner, attr, original in reversed(saved):
            setattr(owner, attr, original)
