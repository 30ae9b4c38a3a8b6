"""A QNN context binary's graphs in the manifest's terms, for every backend that writes one (the
ONNX and LLM backends through the QNN EP, ExecuTorch inside a .pte)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..contract.manifest import Encoding, TensorSpec
from ..core.errors import ToolchainError
from ..core.targets import SoC
from ..toolchain.native_io import native_stdout_to_stderr
from ..toolchain.qnn_context import read_context_binary

# QNN dtype → numpy name and bits
QNN_DTYPES = {"UFIXED_POINT_8": ("uint8", 8), "SFIXED_POINT_8": ("int8", 8), "UFIXED_POINT_16": ("uint16", 16),
              "SFIXED_POINT_16": ("int16", 16), "UFIXED_POINT_4": ("uint4", 4), "SFIXED_POINT_4": ("int4", 4),
              "SFIXED_POINT_32": ("int32", 32), "UFIXED_POINT_32": ("uint32", 32), "FLOAT_16": ("float16", 16),
              "FLOAT_32": ("float32", 32), "INT_32": ("int32", 32), "UINT_8": ("uint8", 8), "BOOL_8": ("bool", 8),
              "INT_64": ("int64", 64), "UINT_32": ("uint32", 32), "INT_8": ("int8", 8), "UINT_16": ("uint16", 16)}


def tensor_spec(t) -> TensorSpec:
    """One graph input or output (a `qnn_context.TensorInfo`): numpy dtype, shape and encoding."""
    dtype, bits = QNN_DTYPES.get(t.dtype, (t.dtype, None))
    return TensorSpec(name=t.name, shape=list(t.shape), dtype=dtype, encoding=_encoding(t.quantization, dtype, bits))


def _encoding(q, dtype: str, bits: int | None) -> Encoding | None:
    if q is None:
        return None
    if q.scale is not None:      # per tensor
        return Encoding(dtype=dtype, scale=q.scale, zero_point=q.zero_point, bits=q.bitwidth or bits)
    if q.scales is not None:     # per axis or per block
        return Encoding(dtype=dtype, scale=q.scales, zero_point=q.zero_points, axis=q.axis, bits=q.bitwidth or bits,
                        block_size=q.block_size[0] if q.block_size else None)
    return Encoding(dtype=dtype, bits=bits)   # an encoding the reader names without its values


def read_back(source: Path | bytes, soc: SoC | None = None) -> Any:
    """The binary's own account of itself (from its path or its bytes); refuses one built for another
    SoC than `soc`."""
    with native_stdout_to_stderr():
        info = read_context_binary(source)
    if soc is not None and info.soc_model is not None and info.soc_model != soc.soc_model:
        raise ToolchainError(f"the context binary built for {soc.name} names soc_model {info.soc_model}, not {soc.soc_model}",
                             "report this as a bug: the QNN EP ignored the soc_model option")
    return info
