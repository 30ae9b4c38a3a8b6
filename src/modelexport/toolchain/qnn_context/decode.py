"""A QNN context binary's description, as libQnnSystem.so hands it back, copied into plain data.

The structs are `QnnSystemContext_BinaryInfo_t` and what it points to (structs.py); reader.py asks
the library for them and calls `decode_binary_info` before the library's memory is freed.

HTP specifics come from the backend's own records, laid out as in HTP/QnnHtpSystemContext.h:
`contextMetadata` holds `QnnHtpSystemContext_ContextBlobInfo_t` (the DSP arch), and each graph's
`graphBlobInfo` holds a `QnnHtpSystemContext_GraphBlobInfo_t` (V1: spill-fill, VTCM) that QAIRT
2.5x follows with a `QnnHtpSystemContext_GraphBlobInfoV2_t` record (I/O, op-data, const and
shared-weights sizes). A record is decoded only when its version tag is known and it fits in the
blob; anything left over is reported as `unparsed_bytes`, never guessed at.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.errors import InputError
from ...core.targets import by_soc_model
from . import structs as S  # noqa: N812 (the headers' names read as S.Qnn_...)

# Byte sizes of the HTP records inside a graph blob (checked against gcc in the tests).
_HTP_GRAPH_BLOB_V1_SIZE = ctypes.sizeof(S.QnnHtpSystemContext_GraphBlobInfo_t)
_HTP_GRAPH_BLOB_V2_SIZE = ctypes.sizeof(S.QnnHtpSystemContext_GraphBlobInfoV2_t)
_HTP_BACKEND_ID = 6


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
# Decoding
# ------------------------------------------------------------------------------------------------
def _s(p: bytes | None) -> str | None:
    return None if p is None else p.decode("utf-8", errors="replace")


def _array(ptr, n: int) -> list:
    return [ptr[i] for i in range(n)] if n and ptr else []


def _num_blocks(shape: list[int], block: list[int]) -> int:
    return math.prod(math.ceil(d / b) for d, b in zip(shape, block) if b) if block else 0


def decode_quantization(q: S.Qnn_QuantizeParams_t, shape: list[int]) -> QuantInfo | None:  # noqa: C901, PLR0915
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


def decode_binary_info(bi: S.QnnSystemContext_BinaryInfo_t, size: int, sha: str) -> ContextBinaryInfo:
    """The library's answer about one binary of `size` bytes and this sha256, as data."""
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
