"""Read a QNN context binary through the real libQnnSystem.so.

The library parses the binary (`QnnSystemContext_getMetadata`, or the older `getBinaryInfo`) and
hands back a `QnnSystemContext_BinaryInfo_t`; this module copies what it says into plain
dataclasses before the library's memory is freed. Nothing here scrapes strings out of the file.

HTP specifics come from the backend's own records, laid out as in HTP/QnnHtpSystemContext.h:
`contextMetadata` holds `QnnHtpSystemContext_ContextBlobInfo_t` (the DSP arch), and each graph's
`graphBlobInfo` holds a `QnnHtpSystemContext_GraphBlobInfo_t` (V1: spill-fill, VTCM) that QAIRT
2.5x follows with a `QnnHtpSystemContext_GraphBlobInfoV2_t` record (I/O, op-data, const and
shared-weights sizes). A record is decoded only when its version tag is known and it fits in the
blob; anything left over is reported as `unparsed_bytes`, never guessed at.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import mmap
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Union

from ...core.errors import InputError, ToolchainError
from ...core.targets import by_soc_model
from ..qairt import find_qairt, preload_runtime_libs
from . import structs as S

BinarySource = Union[str, os.PathLike, bytes, bytearray, memoryview]

# Byte sizes of the HTP records inside a graph blob (checked against gcc in the tests).
_HTP_GRAPH_BLOB_V1_SIZE = ctypes.sizeof(S.QnnHtpSystemContext_GraphBlobInfo_t)
_HTP_GRAPH_BLOB_V2_SIZE = ctypes.sizeof(S.QnnHtpSystemContext_GraphBlobInfoV2_t)
_HTP_BACKEND_ID = 6
_NOT_A_BINARY_FIX = ("pass a QNN context binary: the *_ctx_qnn.bin ONNX Runtime writes next to an "
                     "EPContext model, or the output of qnn-context-binary-generator; for an "
                     "EPContext .onnx use extract_from_epcontext()")


# ------------------------------------------------------------------------------------------------
# What a binary says, as plain data
# ------------------------------------------------------------------------------------------------
@dataclass
class QuantInfo:
    """A tensor's quantization. QNN stores `offset` = -zero_point; both are given."""
    encoding: str                     # SCALE_OFFSET, AXIS_SCALE_OFFSET, BW_SCALE_OFFSET, ...
    definition: str                   # DEFINED / IMPL_GENERATED
    scale: float | None = None        # per-tensor encodings
    offset: int | None = None
    zero_point: int | None = None
    bitwidth: int | None = None
    axis: int | None = None           # per-axis and block-expansion encodings
    scales: list[float] | None = None
    offsets: list[int] | None = None
    zero_points: list[int] | None = None
    block_size: list[int] | None = None
    num_blocks_per_axis: int | None = None
    block_scale_bitwidth: int | None = None
    block_scales: list[int] | None = None
    mapping: str | None = None
    decoded: bool = True              # False: the encoding is named but its values are not read


@dataclass
class TensorInfo:
    name: str
    direction: str                    # input, output, updateable, context
    dtype: str                        # e.g. UFIXED_POINT_8, FLOAT_16
    shape: list[int]
    tensor_type: str                  # APP_WRITE, APP_READ, ...
    id: int
    data_format: int                  # 0 = dense
    quantization: QuantInfo | None = None
    dynamic_dims: list[bool] | None = None
    tensor_version: int = 1


@dataclass
class HtpGraphInfo:
    """The HTP backend's per-graph record(s)."""
    spill_fill_buffer_size: int | None = None
    vtcm_bytes: int | None = None
    vtcm_mb: float | None = None
    optimization_level: int | None = None
    htp_dlbc: int | None = None
    num_hvx_threads: int | None = None
    # The V2 record (QAIRT 2.5x), None when absent.
    native_k_channel_size: int | None = None
    native_v_channel_size: int | None = None
    is_safe_share_io: bool | None = None
    io_tensor_size: int | None = None
    op_data_size: int | None = None
    const_size: int | None = None
    ddr_tensor_size: int | None = None
    shared_weights_size: int | None = None
    record_versions: list[int] = field(default_factory=list)
    unparsed_bytes: int = 0


@dataclass
class GraphInfo:
    name: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    updateable_tensors: list[TensorInfo] = field(default_factory=list)
    graph_info_version: int = 0
    start_op_index: int | None = None
    end_op_index: int | None = None
    graph_blob_size: int = 0
    htp: HtpGraphInfo | None = None


@dataclass
class DeviceInfo:
    device_id: int
    device_type: int
    cores: list[dict[str, int]]
    has_extension: bool


@dataclass
class ContextBinaryInfo:
    file_size: int
    sha256: str
    binary_info_version: int
    backend_id: int
    backend: str                      # HTP, GPU, ...
    build_id: str                     # QAIRT build that made the binary, e.g. v2.51.0.260929181845
    core_api_version: str
    backend_api_version: str
    context_blob_version: str
    context_blob_size: int
    graphs: list[GraphInfo]
    path: str | None = None
    soc_version: str | None = None    # empty in QAIRT 2.51 binaries; use soc_model / dsp_arch
    soc_model: int | None = None      # the QNN chipset id (57 = SM8650)
    soc_name: str | None = None       # from modelexport.core.targets, when the id is known
    dsp_arch: int | None = None       # 75 = HTP V75, from the context metadata
    htp_arch: str | None = None       # "v75"
    vtcm_mb: float | None = None      # largest VTCM size any graph was compiled for
    context_tensors: list[TensorInfo] = field(default_factory=list)
    devices: list[DeviceInfo] = field(default_factory=list)
    context_metadata_hex: str | None = None
    hw_info_blob_hex: str | None = None  # V1/V2 binary info only
    reader: str = ""                  # which library call produced this
    referenced_by: list[str] = field(default_factory=list)  # EPContext nodes, when read via a model

    @property
    def qairt_version(self) -> str:
        """The release part of the build id, e.g. 2.51.0."""
        parts = self.build_id.lstrip("v").split(".")
        return ".".join(parts[:3])

    def graph(self, name: str) -> GraphInfo:
        for g in self.graphs:
            if g.name == name:
                return g
        raise KeyError(f"no graph {name!r} in this context binary (graphs: {[g.name for g in self.graphs]})")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["qairt_version"] = self.qairt_version
        return d


# ------------------------------------------------------------------------------------------------
# The library
# ------------------------------------------------------------------------------------------------
_LOCK = threading.Lock()


@dataclass(frozen=True)
class _System:
    lib: ctypes.CDLL
    iface: S.QnnSystemInterface_t
    provider: str
    api_version: str
    path: Path


@functools.lru_cache(maxsize=1)
def _system() -> _System:
    q = find_qairt()
    path = q.lib("system")
    preload_runtime_libs(q.extra_lib_dirs)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise ToolchainError(f"cannot load {path}: {e}",
                             "reinstall onnxruntime-qnn (make setup) or fix QNN_SDK_ROOT") from None
    get = lib.QnnSystemInterface_getProviders
    get.argtypes = [ctypes.POINTER(ctypes.POINTER(ctypes.POINTER(S.QnnSystemInterface_t))),
                    ctypes.POINTER(ctypes.c_uint32)]
    get.restype = S.Qnn_ErrorHandle_t
    providers = ctypes.POINTER(ctypes.POINTER(S.QnnSystemInterface_t))()
    count = ctypes.c_uint32(0)
    rc = get(ctypes.byref(providers), ctypes.byref(count))
    if rc != S.QNN_SUCCESS or count.value == 0:
        raise ToolchainError(f"{path} offers no QNN system interface (error {S.error_code(rc)})",
                             "the library is broken or not libQnnSystem.so; reinstall onnxruntime-qnn")
    # All providers share the system-context calls this module uses (API major 1); take the first
    # that has them.
    for i in range(count.value):
        iface = providers[i].contents
        if iface.systemApiVersion.major == 1 and iface.impl.systemContextCreate and iface.impl.systemContextFree:
            return _System(lib, iface, (iface.providerName or b"").decode(), str(iface.systemApiVersion), path)
    raise ToolchainError(f"{path} has no system-context interface of API version 1.x",
                         "use the libQnnSystem.so of the same QAIRT as libQnnHtp.so")


def system_library_info() -> dict[str, str]:
    """Which libQnnSystem.so is used, and its provider and API version."""
    s = _system()
    return {"path": str(s.path), "provider": s.provider, "api_version": s.api_version}


# ------------------------------------------------------------------------------------------------
# Decoding
# ------------------------------------------------------------------------------------------------
def _s(p: bytes | None) -> str | None:
    return None if p is None else p.decode("utf-8", errors="replace")


def _array(ptr, n: int) -> list:
    return [ptr[i] for i in range(n)] if n and ptr else []


def _num_blocks(shape: list[int], block: list[int]) -> int:
    return math.prod(math.ceil(d / b) for d, b in zip(shape, block) if b) if block else 0


def decode_quantization(q: S.Qnn_QuantizeParams_t, shape: list[int]) -> QuantInfo | None:
    """A tensor's Qnn_QuantizeParams_t as data; None for an unquantized tensor."""
    enc = q.quantizationEncoding
    if enc == S.QNN_QUANTIZATION_ENCODING_UNDEFINED or q.encodingDefinition == 0x7FFFFFFF:
        return None
    info = QuantInfo(encoding=S.QUANTIZATION_ENCODINGS.get(enc, f"UNKNOWN_{enc}"),
                     definition=S.DEFINITIONS.get(q.encodingDefinition, str(q.encodingDefinition)))

    def per_tensor(scale: float, offset: int, bitwidth: int | None = None) -> None:
        info.scale, info.offset, info.zero_point, info.bitwidth = scale, offset, -offset, bitwidth

    def per_axis(axis: int, scales: list[float], offsets: list[int], bitwidth: int | None = None) -> None:
        info.axis, info.scales, info.offsets, info.bitwidth = axis, scales, offsets, bitwidth
        info.zero_points = [-o for o in offsets]

    def axis_len(axis: int) -> int:
        return shape[axis] if 0 <= axis < len(shape) else 0

    if enc == S.QNN_QUANTIZATION_ENCODING_SCALE_OFFSET:
        per_tensor(q.scaleOffsetEncoding.scale, q.scaleOffsetEncoding.offset)
    elif enc == S.QNN_QUANTIZATION_ENCODING_BW_SCALE_OFFSET:
        e = q.bwScaleOffsetEncoding
        per_tensor(e.scale, e.offset, e.bitwidth)
    elif enc == S.QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET:
        e = q.axisScaleOffsetEncoding
        pairs = _array(e.scaleOffset, e.numScaleOffsets)
        per_axis(e.axis, [p.scale for p in pairs], [p.offset for p in pairs])
    elif enc == S.QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET:
        e = q.bwAxisScaleOffsetEncoding
        n = e.numElements
        offsets = _array(e.offsets, n) if e.offsets else [0] * n  # NULL offsets = symmetric
        per_axis(e.axis, _array(e.scales, n), offsets, e.bitwidth)
    elif enc == S.QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET_MAPPED and q.bwAxisScaleOffsetMappedEncoding:
        e = q.bwAxisScaleOffsetMappedEncoding.contents
        n = e.numElements
        offsets = _array(e.offsets, n) if e.offsets else [0] * n
        per_axis(e.axis, _array(e.scales, n), offsets, e.bitwidth)
        info.mapping = S.ENCODING_MAPPINGS.get(e.mapping, str(e.mapping))
    elif enc in (S.QNN_QUANTIZATION_ENCODING_BLOCK, S.QNN_QUANTIZATION_ENCODING_BW_BLOCK_MAPPED):
        if enc == S.QNN_QUANTIZATION_ENCODING_BLOCK:
            e, bitwidth, mapping = q.blockEncoding, None, None
        elif q.bwBlockMappedEncoding:
            e = q.bwBlockMappedEncoding.contents
            bitwidth, mapping = e.bitwidth, S.ENCODING_MAPPINGS.get(e.mapping, str(e.mapping))
        else:
            info.decoded = False
            return info
        block = _array(e.blockSize, len(shape))
        pairs = _array(e.scaleOffset, _num_blocks(shape, block))
        info.block_size, info.bitwidth, info.mapping = block, bitwidth, mapping
        info.scales, info.offsets = [p.scale for p in pairs], [p.offset for p in pairs]
        info.zero_points = [-p.offset for p in pairs]
    elif enc in (S.QNN_QUANTIZATION_ENCODING_FLOAT_BLOCK, S.QNN_QUANTIZATION_ENCODING_BW_FLOAT_BLOCK):
        e = q.floatBlockEncoding if enc == S.QNN_QUANTIZATION_ENCODING_FLOAT_BLOCK else q.bwFloatBlockEncoding
        block = _array(e.blockSize, len(shape))
        pairs = _array(e.floatScaleOffset, _num_blocks(shape, block))
        info.block_size = block
        info.bitwidth = getattr(e, "bitwidth", None)
        info.scales = [p.scale for p in pairs]
        info.offsets = None  # float offsets (float_value = (q + offset/scale) * scale) are not integers
    elif enc in (S.QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION,
                 S.QNN_QUANTIZATION_ENCODING_BW_BLOCKWISE_EXPANSION_MAPPED):
        ptr = (q.blockwiseExpansion if enc == S.QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION
               else q.bwBlockwiseExpansionMappedEncoding)
        if not ptr:
            info.decoded = False
            return info
        e = ptr.contents
        n_axis = axis_len(e.axis)
        pairs = _array(e.scaleOffsets, n_axis)
        per_axis(e.axis, [p.scale for p in pairs], [p.offset for p in pairs], getattr(e, "bitwidth", None))
        if hasattr(e, "mapping"):
            info.mapping = S.ENCODING_MAPPINGS.get(e.mapping, str(e.mapping))
        info.num_blocks_per_axis, info.block_scale_bitwidth = e.numBlocksPerAxis, e.blockScaleBitwidth
        bits = S.BLOCK_SCALE_STORAGE.get(e.blockScaleStorageType)
        scales_ptr = e.blocksScale8 if bits == 8 else e.blocksScale16 if bits == 16 else None
        info.block_scales = _array(scales_ptr, n_axis * e.numBlocksPerAxis) if scales_ptr else None
    else:  # VECTOR and anything newer than the headers read: named, values not read
        info.decoded = False
    return info


def decode_tensor(t: S.Qnn_Tensor_t, direction: str) -> TensorInfo:
    if t.version == S.QNN_TENSOR_VERSION_1:
        v = t.v1
    elif t.version == S.QNN_TENSOR_VERSION_2:
        v = t.v2
    else:
        raise InputError(f"the context binary has a tensor of unknown version {t.version}",
                         "read it with the QAIRT that made it (QNN_SDK_ROOT)")
    shape = _array(v.dimensions, v.rank)
    dyn = None
    if t.version == S.QNN_TENSOR_VERSION_2 and v.isDynamicDimensions:
        dyn = [bool(x) for x in _array(v.isDynamicDimensions, v.rank)]
    return TensorInfo(
        name=_s(v.name) or "", direction=direction,
        dtype=S.DATA_TYPES.get(v.dataType, f"0x{v.dataType:04x}"), shape=shape,
        tensor_type=S.TENSOR_TYPES.get(v.type, str(v.type)), id=v.id, data_format=v.dataFormat,
        quantization=decode_quantization(v.quantizeParams, shape), dynamic_dims=dyn,
        tensor_version=t.version)


def decode_htp_graph_blob(blob: bytes) -> HtpGraphInfo:
    """The HTP records of one graph's graphBlobInfo: a V1 record, then (2.5x) a V2 record."""
    info = HtpGraphInfo()
    pos = 0
    while pos + 4 <= len(blob):
        version = int.from_bytes(blob[pos:pos + 4], "little")
        if version == S.QNN_SYSTEM_CONTEXT_HTP_GRAPH_INFO_BLOB_VERSION_V1 and pos + _HTP_GRAPH_BLOB_V1_SIZE <= len(blob):
            r = S.QnnHtpSystemContext_GraphBlobInfo_t.from_buffer_copy(blob, pos).contextBinaryGraphBlobInfoV1
            info.spill_fill_buffer_size = r.spillFillBufferSize
            # The header says "MB"; 2.51 writes bytes (vtcm_mb=2 at compile time gives 2097152).
            info.vtcm_bytes = r.vtcmSize if r.vtcmSize >= 1 << 16 else r.vtcmSize << 20
            info.vtcm_mb = info.vtcm_bytes / (1 << 20)
            info.optimization_level, info.htp_dlbc, info.num_hvx_threads = r.optimizationLevel, r.htpDlbc, r.numHvxThreads
            pos += _HTP_GRAPH_BLOB_V1_SIZE
        elif version == S.QNN_SYSTEM_CONTEXT_HTP_GRAPH_INFO_BLOB_VERSION_V2 and pos + _HTP_GRAPH_BLOB_V2_SIZE <= len(blob):
            r = S.QnnHtpSystemContext_GraphBlobInfoV2_t.from_buffer_copy(blob, pos)
            info.native_k_channel_size, info.native_v_channel_size = r.nativeKChannelSize, r.nativeVChannelSize
            info.is_safe_share_io = bool(r.isSafeShareIO)
            info.io_tensor_size, info.op_data_size = r.ioTensorSize, r.opDataSize
            info.const_size, info.ddr_tensor_size, info.shared_weights_size = r.constSize, r.ddrTensorSize, r.sharedWeightsSize
            pos += _HTP_GRAPH_BLOB_V2_SIZE
        else:
            break
        info.record_versions.append(version)
    info.unparsed_bytes = len(blob) - pos
    return info


def _decode_graph(g: S.QnnSystemContext_GraphInfo_t, backend_id: int) -> GraphInfo:
    if g.version not in (1, 2, 3):
        raise InputError(f"the context binary describes a graph with unknown info version {g.version}",
                         "read it with the QAIRT that made it (QNN_SDK_ROOT)")
    v = {1: g.graphInfoV1, 2: g.graphInfoV2, 3: g.graphInfoV3}[g.version]
    out = GraphInfo(
        name=_s(v.graphName) or "",
        inputs=[decode_tensor(t, "input") for t in _array(v.graphInputs, v.numGraphInputs)],
        outputs=[decode_tensor(t, "output") for t in _array(v.graphOutputs, v.numGraphOutputs)],
        graph_info_version=g.version)
    if g.version >= 2:
        out.updateable_tensors = [decode_tensor(t, "updateable")
                                  for t in _array(v.updateableTensors, v.numUpdateableTensors)]
    if g.version >= 3:
        out.start_op_index, out.end_op_index = v.startOpIndex, v.endOpIndex
        out.graph_blob_size = v.graphBlobInfoSize
        if v.graphBlobInfo and v.graphBlobInfoSize and backend_id == _HTP_BACKEND_ID:
            out.htp = decode_htp_graph_blob(ctypes.string_at(v.graphBlobInfo, v.graphBlobInfoSize))
    return out


def _decode_devices(p) -> list[DeviceInfo]:
    if not p or p.contents.version != 1:
        return []
    pi = p.contents.v1
    devices = []
    for d in _array(pi.hwDevices, pi.numHwDevices):
        if d.version != 1:
            continue
        cores = [{"core_id": c.v1.coreId, "core_type": c.v1.coreType}
                 for c in _array(d.v1.cores, d.v1.numCores) if c.version == 1]
        devices.append(DeviceInfo(d.v1.deviceId, d.v1.deviceType, cores, bool(d.v1.deviceInfoExtension)))
    return devices


def _decode(bi: S.QnnSystemContext_BinaryInfo_t, size: int, sha: str) -> ContextBinaryInfo:
    if bi.version not in (1, 2, 3):
        raise InputError(f"libQnnSystem returned binary info of unknown version {bi.version}",
                         "read it with the QAIRT that made it (QNN_SDK_ROOT)")
    v = {1: bi.contextBinaryInfoV1, 2: bi.contextBinaryInfoV2, 3: bi.contextBinaryInfoV3}[bi.version]
    info = ContextBinaryInfo(
        file_size=size, sha256=sha, binary_info_version=bi.version, backend_id=v.backendId,
        backend=S.BACKEND_NAMES.get(v.backendId, f"backend {v.backendId}"),
        build_id=_s(v.buildId) or "", core_api_version=str(v.coreApiVersion),
        backend_api_version=str(v.backendApiVersion), context_blob_version=str(v.contextBlobVersion),
        context_blob_size=v.contextBlobSize,
        graphs=[_decode_graph(g, v.backendId) for g in _array(v.graphs, v.numGraphs)],
        soc_version=_s(v.socVersion) or None,
        context_tensors=[decode_tensor(t, "context") for t in _array(v.contextTensors, v.numContextTensors)],
    )
    if bi.version >= 2:
        info.devices = _decode_devices(v.platformInfo)
    if bi.version in (1, 2) and v.hwInfoBlob and v.hwInfoBlobSize:
        info.hw_info_blob_hex = ctypes.string_at(v.hwInfoBlob, v.hwInfoBlobSize).hex()
    if bi.version >= 3:
        info.soc_model = v.socModel or None
        if v.contextMetadata and v.contextMetadataSize:
            md = ctypes.string_at(v.contextMetadata, v.contextMetadataSize)
            info.context_metadata_hex = md.hex()
            if v.backendId == _HTP_BACKEND_ID and len(md) >= ctypes.sizeof(S.QnnHtpSystemContext_ContextBlobInfo_t):
                cb = S.QnnHtpSystemContext_ContextBlobInfo_t.from_buffer_copy(md)
                if cb.version == S.QNN_SYSTEM_CONTEXT_HTP_CONTEXT_INFO_BLOB_VERSION_V1:
                    info.dsp_arch = cb.contextBinaryContextBlobInfoV1.dspArch
                    info.htp_arch = f"v{info.dsp_arch}"
    if info.soc_model is not None:
        soc = by_soc_model(info.soc_model)
        info.soc_name = soc.name if soc else None
    vtcm = [g.htp.vtcm_mb for g in info.graphs if g.htp and g.htp.vtcm_mb is not None]
    info.vtcm_mb = max(vtcm) if vtcm else None
    return info


def _error_name(rc: int) -> str:
    code = S.error_code(rc)
    return f"{S.SYSTEM_CONTEXT_ERRORS.get(code, 'error')} ({code})"


def _read_address(addr: int, size: int, sha: str) -> ContextBinaryInfo:
    """Ask the library about `size` bytes at address `addr` and copy out its answer.

    The caller keeps the memory alive; only the integer address travels here, so an exception's
    traceback never pins the caller's buffer (a mapped file can still be closed).
    """
    s = _system()
    impl = s.iface.impl
    with _LOCK:
        handle = ctypes.c_void_p()
        rc = impl.systemContextCreate(ctypes.byref(handle))
        if rc != S.QNN_SUCCESS:
            raise ToolchainError(f"libQnnSystem could not create a system context: {_error_name(rc)}",
                                 "reinstall onnxruntime-qnn (make setup) or fix QNN_SDK_ROOT")
        try:
            info_p = ctypes.POINTER(S.QnnSystemContext_BinaryInfo_t)()
            if impl.systemContextGetMetaData:
                call = "QnnSystemContext_getMetadata"
                rc = impl.systemContextGetMetaData(handle, addr, size, ctypes.byref(info_p))
            else:
                call = "QnnSystemContext_getBinaryInfo"
                info_size = ctypes.c_uint64(0)
                rc = impl.systemContextGetBinaryInfo(handle, addr, size, ctypes.byref(info_p),
                                                     ctypes.byref(info_size))
            if rc != S.QNN_SUCCESS or not info_p:
                raise InputError(
                    f"not a QNN context binary this QAIRT can read: libQnnSystem ({s.provider} "
                    f"{s.api_version}) answered {_error_name(rc)}", _NOT_A_BINARY_FIX)
            info = _decode(info_p.contents, size, sha)
            info.reader = f"{call} ({s.provider} {s.api_version})"
            return info
        finally:
            impl.systemContextFree(handle)


def read_context_binary(source: BinarySource) -> ContextBinaryInfo:
    """What a QNN context binary holds, as libQnnSystem.so reads it.

    `source` is a path or the binary's bytes. Raises InputError for anything that is not a
    context binary (with the library's own verdict), ToolchainError if the library is missing.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if not data:
            raise InputError("the context binary is empty (0 bytes)", _NOT_A_BINARY_FIX)
        # c_char_p points into the bytes object itself (no copy); `data` outlives the call.
        addr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
        return _read_address(addr, len(data), hashlib.sha256(data).hexdigest())

    path = Path(source)
    if not path.exists():
        raise InputError(f"no such file: {path}", "check the path of the context binary")
    if path.is_dir():
        raise InputError(f"{path} is a folder, not a context binary", _NOT_A_BINARY_FIX)
    size = path.stat().st_size
    if size == 0:
        raise InputError(f"{path} is empty (0 bytes), not a context binary", _NOT_A_BINARY_FIX)
    with open(path, "rb") as f:
        # Copy-on-write map: the library parses in place; a multi-GB binary is not read into RAM.
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        sha = hashlib.sha256(mm).hexdigest()
        buf = (ctypes.c_char * size).from_buffer(mm)
        try:
            info = _read_address(ctypes.addressof(buf), size, sha)
        except InputError as e:
            if path.suffix.lower() == ".onnx":
                raise InputError(f"{path} is an ONNX model, not a QNN context binary",
                                 "use extract_from_epcontext() for an EPContext model") from None
            raise InputError(f"{path}: {e.problem}", e.fix) from None
        finally:
            del buf
        info.path = str(path)
        return info
    finally:
        mm.close()


# ------------------------------------------------------------------------------------------------
# EPContext models (ONNX Runtime)
# ------------------------------------------------------------------------------------------------
@dataclass
class EpContextNode:
    name: str
    source: str | None
    embed_mode: int
    main_context: int
    partition_name: str | None
    ep_sdk_version: str | None
    cache_path: str | None            # embed mode 0: the file the attribute names, resolved
    embedded_size: int | None         # embed mode 1: bytes held in the attribute


def _epcontext_nodes(onnx_path: Path):
    import onnx
    if not onnx_path.is_file():
        raise InputError(f"no such file: {onnx_path}", "check the path of the EPContext model")
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and friends
        raise InputError(f"{onnx_path} is not a readable ONNX model: {e}",
                         "pass the *_ctx.onnx model ONNX Runtime wrote with ep.context_enable=1") from None
    out = []
    for node in model.graph.node:
        if node.op_type != "EPContext":
            continue
        attrs = {a.name: a for a in node.attribute}
        def get(name, default=None):
            return onnx.helper.get_attribute_value(attrs[name]) if name in attrs else default
        def text(name):
            v = get(name)
            return v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v
        embed = int(get("embed_mode", 1))
        raw = get("ep_cache_context", b"")
        meta = EpContextNode(name=node.name, source=text("source"), embed_mode=embed,
                             main_context=int(get("main_context", 1)), partition_name=text("partition_name"),
                             ep_sdk_version=text("ep_sdk_version"), cache_path=None, embedded_size=None)
        if embed == 0:
            rel = raw.decode("utf-8", errors="replace")
            target = (onnx_path.parent / rel).resolve()
            if Path(rel).is_absolute() or onnx_path.parent.resolve() not in (target, *target.parents):
                raise InputError(f"EPContext node {node.name!r} names {rel!r}, outside the model's folder",
                                 "keep the context binary next to the EPContext model (a relative name)")
            meta.cache_path = str(target)
        else:
            meta.embedded_size = len(raw)
        out.append((meta, raw))
    return out


def find_epcontext_nodes(onnx_path: str | os.PathLike) -> list[EpContextNode]:
    """The EPContext nodes of an ONNX model and where their binaries are."""
    return [meta for meta, _ in _epcontext_nodes(Path(onnx_path))]


def extract_from_epcontext(onnx_path: str | os.PathLike) -> ContextBinaryInfo:
    """Read the QNN context binary an EPContext model references.

    Embed mode 0: the node's `ep_cache_context` is a file name relative to the model; embed mode 1:
    it holds the binary itself. Several nodes may share one binary (weight sharing); a model whose
    nodes name different binaries is refused (read each with read_context_binary).
    """
    onnx_path = Path(onnx_path)
    nodes = [(m, raw) for m, raw in _epcontext_nodes(onnx_path) if m.main_context]
    if not nodes:
        raise InputError(f"{onnx_path} has no EPContext node holding a context",
                         "compile the model with ep.context_enable=1 and pass the *_ctx.onnx it writes")
    keys = {m.cache_path if m.embed_mode == 0 else hashlib.sha256(raw).hexdigest() for m, raw in nodes}
    if len(keys) > 1:
        raise InputError(f"{onnx_path} references {len(keys)} different context binaries",
                         "read them one by one: find_epcontext_nodes() then read_context_binary()")
    meta, raw = nodes[0]
    if meta.embed_mode == 0:
        if not Path(meta.cache_path).is_file():
            raise InputError(f"{onnx_path} references {meta.cache_path}, which does not exist",
                             "keep the *_ctx_qnn.bin next to the EPContext model it belongs to")
        info = read_context_binary(meta.cache_path)
    else:
        if not raw:
            raise InputError(f"EPContext node {meta.name!r} in {onnx_path} holds no binary", None)
        info = read_context_binary(raw)
    info.referenced_by = [m.name for m, _ in nodes]
    return info
