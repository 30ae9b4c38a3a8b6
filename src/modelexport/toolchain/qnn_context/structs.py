"""ctypes layouts of the QNN structs that describe a context binary.

Written from the public QAIRT headers (QnnCommon.h, QnnTypes.h, System/QnnSystemContext.h,
System/QnnSystemInterface.h, HTP/QnnHtpSystemContext.h; the newest public copy read was 2.43).
Class and field names are the headers' own, so each line can be checked against them;
`tests/test_qnn_context.py` compiles the same layouts with gcc and compares every offset and size.

Only what reading a binary needs is here. Unions are anonymous, as in C: `tensor.v2`,
`params.scaleOffsetEncoding`. All of this is x86_64/aarch64 LP64 (8-byte pointers).
"""
from __future__ import annotations

import ctypes
from ctypes import (POINTER, Structure, Union, c_char_p, c_float, c_int32, c_uint8, c_uint16,
                    c_uint32, c_uint64, c_void_p)

# --- QnnCommon.h ------------------------------------------------------------------------------
Qnn_ErrorHandle_t = c_uint64
QNN_SUCCESS = 0
QNN_MIN_ERROR_SYSTEM = 30000


def error_code(handle: int) -> int:
    """The 16-bit error code inside a Qnn_ErrorHandle_t (QNN_GET_ERROR_CODE)."""
    return handle & 0xFFFF


# Backend ids (QnnCommon.h comment block).
BACKEND_NAMES = {0: "NULL", 1: "REFERENCE", 2: "SAVER", 3: "CPU", 4: "GPU", 5: "DSP", 6: "HTP"}

# --- QnnTypes.h: enums -------------------------------------------------------------------------
DATA_TYPES = {
    0x0008: "INT_8", 0x0016: "INT_16", 0x0032: "INT_32", 0x0064: "INT_64",
    0x0108: "UINT_8", 0x0116: "UINT_16", 0x0132: "UINT_32", 0x0164: "UINT_64",
    0x0216: "FLOAT_16", 0x0226: "BFLOAT_16", 0x0232: "FLOAT_32", 0x0264: "FLOAT_64",
    0x0304: "SFIXED_POINT_4", 0x0308: "SFIXED_POINT_8", 0x0316: "SFIXED_POINT_16", 0x0332: "SFIXED_POINT_32",
    0x0404: "UFIXED_POINT_4", 0x0408: "UFIXED_POINT_8", 0x0416: "UFIXED_POINT_16", 0x0432: "UFIXED_POINT_32",
    0x0508: "BOOL_8", 0x0608: "STRING", 0x7FFFFFFF: "UNDEFINED",
}

TENSOR_TYPES = {
    0: "APP_WRITE", 1: "APP_READ", 2: "APP_READWRITE", 3: "NATIVE", 4: "STATIC", 5: "NULL",
    6: "UPDATEABLE_STATIC", 7: "UPDATEABLE_NATIVE", 8: "UPDATEABLE_APP_WRITE",
    9: "UPDATEABLE_APP_READ", 10: "UPDATEABLE_APP_READWRITE", 11: "OPTIONAL_APP_WRITE",
    12: "OPTIONAL_APP_READ", 13: "OPTIONAL_APP_READWRITE", 0x7FFFFFFF: "UNDEFINED",
}

DEFINITIONS = {0: "IMPL_GENERATED", 1: "DEFINED", 0x7FFFFFFF: "UNDEFINED"}

QNN_QUANTIZATION_ENCODING_SCALE_OFFSET = 0
QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET = 1
QNN_QUANTIZATION_ENCODING_BW_SCALE_OFFSET = 2
QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET = 3
QNN_QUANTIZATION_ENCODING_BLOCK = 4
QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION = 5
QNN_QUANTIZATION_ENCODING_VECTOR = 6
QNN_QUANTIZATION_ENCODING_FLOAT_BLOCK = 7
QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET_MAPPED = 8
QNN_QUANTIZATION_ENCODING_BW_BLOCK_MAPPED = 9
QNN_QUANTIZATION_ENCODING_BW_BLOCKWISE_EXPANSION_MAPPED = 10
QNN_QUANTIZATION_ENCODING_BW_FLOAT_BLOCK = 11
QNN_QUANTIZATION_ENCODING_UNDEFINED = 0x7FFFFFFF

QUANTIZATION_ENCODINGS = {
    0: "SCALE_OFFSET", 1: "AXIS_SCALE_OFFSET", 2: "BW_SCALE_OFFSET", 3: "BW_AXIS_SCALE_OFFSET",
    4: "BLOCK", 5: "BLOCKWISE_EXPANSION", 6: "VECTOR", 7: "FLOAT_BLOCK",
    8: "BW_AXIS_SCALE_OFFSET_MAPPED", 9: "BW_BLOCK_MAPPED", 10: "BW_BLOCKWISE_EXPANSION_MAPPED",
    11: "BW_FLOAT_BLOCK", 0x7FFFFFFF: "UNDEFINED",
}

ENCODING_MAPPINGS = {0: "STANDARD_SYMMETRIC", 1: "ASYMMETRIC_PLUS_ONE",
                     2: "LINEAR_SYMMETRIC_EXCLUDE_ZERO", 0x7FFFFFFF: "UNDEFINED"}

BLOCK_SCALE_STORAGE = {0: 8, 1: 16}  # Qnn_BlockwiseExpansionBlockScaleStorageType_t -> bits

QNN_TENSOR_VERSION_1 = 1
QNN_TENSOR_VERSION_2 = 2


# --- QnnTypes.h: versions ----------------------------------------------------------------------
class Qnn_Version_t(Structure):
    _fields_ = [("major", c_uint32), ("minor", c_uint32), ("patch", c_uint32)]

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


class Qnn_ApiVersion_t(Structure):
    _fields_ = [("coreApiVersion", Qnn_Version_t), ("backendApiVersion", Qnn_Version_t)]


# --- QnnTypes.h: quantization encodings --------------------------------------------------------
class Qnn_ScaleOffset_t(Structure):
    """float_value = (quantized_value + offset) * scale, so offset = -zero_point."""
    _fields_ = [("scale", c_float), ("offset", c_int32)]


class Qnn_BwScaleOffset_t(Structure):
    _fields_ = [("bitwidth", c_uint32), ("scale", c_float), ("offset", c_int32)]


class Qnn_AxisScaleOffset_t(Structure):
    _fields_ = [("axis", c_int32), ("numScaleOffsets", c_uint32),
                ("scaleOffset", POINTER(Qnn_ScaleOffset_t))]


class Qnn_BwAxisScaleOffset_t(Structure):
    _fields_ = [("bitwidth", c_uint32), ("axis", c_int32), ("numElements", c_uint32),
                ("scales", POINTER(c_float)), ("offsets", POINTER(c_int32))]


class Qnn_BwAxisScaleOffsetMapped_t(Structure):
    _fields_ = [("bitwidth", c_uint32), ("axis", c_int32), ("mapping", c_uint32),
                ("numElements", c_uint32), ("scales", POINTER(c_float)), ("offsets", POINTER(c_int32))]


class Qnn_BlockEncoding_t(Structure):
    _fields_ = [("blockSize", POINTER(c_uint32)), ("scaleOffset", POINTER(Qnn_ScaleOffset_t))]


class Qnn_BwBlockMapped_t(Structure):
    _fields_ = [("bitwidth", c_uint32), ("mapping", c_uint32), ("blockSize", POINTER(c_uint32)),
                ("scaleOffset", POINTER(Qnn_ScaleOffset_t))]


class _BlockScales(Union):
    _fields_ = [("blocksScale8", POINTER(c_uint8)), ("blocksScale16", POINTER(c_uint16))]


class Qnn_BlockwiseExpansion_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("axis", c_int32), ("scaleOffsets", POINTER(Qnn_ScaleOffset_t)),
                ("numBlocksPerAxis", c_uint32), ("blockScaleBitwidth", c_uint32),
                ("blockScaleStorageType", c_uint32), ("u", _BlockScales)]


class Qnn_BwBlockwiseExpansionMapped_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("bitwidth", c_uint32), ("mapping", c_uint32), ("axis", c_int32),
                ("scaleOffsets", POINTER(Qnn_ScaleOffset_t)), ("numBlocksPerAxis", c_uint32),
                ("blockScaleBitwidth", c_uint32), ("blockScaleStorageType", c_uint32),
                ("u", _BlockScales)]


class Qnn_VectorEncoding_t(Structure):
    _fields_ = [("bwAxisScaleOffset", Qnn_BwAxisScaleOffset_t), ("rowsPerBlock", c_uint32),
                ("columnsPerBlock", c_uint32), ("vectorDimension", c_uint8),
                ("vectorStride", c_uint8), ("indexBitwidth", c_uint8)]


class Qnn_FloatScaleOffset_t(Structure):
    _fields_ = [("scale", c_float), ("offset", c_float)]


class Qnn_FloatBlockEncoding_t(Structure):
    _fields_ = [("blockSize", POINTER(c_uint32)), ("floatScaleOffset", POINTER(Qnn_FloatScaleOffset_t))]


class Qnn_BwFloatBlockEncoding_t(Structure):
    _fields_ = [("bitwidth", c_uint32), ("blockSize", POINTER(c_uint32)),
                ("floatScaleOffset", POINTER(Qnn_FloatScaleOffset_t))]


class _QuantizeEncodings(Union):
    _fields_ = [
        ("scaleOffsetEncoding", Qnn_ScaleOffset_t),
        ("axisScaleOffsetEncoding", Qnn_AxisScaleOffset_t),
        ("bwScaleOffsetEncoding", Qnn_BwScaleOffset_t),
        ("bwAxisScaleOffsetEncoding", Qnn_BwAxisScaleOffset_t),
        ("blockEncoding", Qnn_BlockEncoding_t),
        ("blockwiseExpansion", POINTER(Qnn_BlockwiseExpansion_t)),
        ("vectorEncoding", POINTER(Qnn_VectorEncoding_t)),
        ("floatBlockEncoding", Qnn_FloatBlockEncoding_t),
        ("bwAxisScaleOffsetMappedEncoding", POINTER(Qnn_BwAxisScaleOffsetMapped_t)),
        ("bwBlockMappedEncoding", POINTER(Qnn_BwBlockMapped_t)),
        ("bwBlockwiseExpansionMappedEncoding", POINTER(Qnn_BwBlockwiseExpansionMapped_t)),
        ("bwFloatBlockEncoding", Qnn_BwFloatBlockEncoding_t),
    ]


class Qnn_QuantizeParams_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("encodingDefinition", c_uint32), ("quantizationEncoding", c_uint32),
                ("u", _QuantizeEncodings)]


# --- QnnTypes.h: tensors -----------------------------------------------------------------------
class Qnn_ClientBuffer_t(Structure):
    _fields_ = [("data", c_void_p), ("dataSize", c_uint32)]


class Qnn_TensorRetrieveRaw_t(Structure):
    _fields_ = [("getTensorData", c_void_p), ("freeTensorData", c_void_p)]


class _TensorMemV1(Union):
    _fields_ = [("clientBuf", Qnn_ClientBuffer_t), ("memHandle", c_void_p)]


class _TensorMemV2(Union):
    _fields_ = [("clientBuf", Qnn_ClientBuffer_t), ("memHandle", c_void_p),
                ("retrieveRaw", POINTER(Qnn_TensorRetrieveRaw_t))]


class Qnn_TensorV1_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("id", c_uint32), ("name", c_char_p), ("type", c_uint32), ("dataFormat", c_uint32),
                ("dataType", c_uint32), ("quantizeParams", Qnn_QuantizeParams_t), ("rank", c_uint32),
                ("dimensions", POINTER(c_uint32)), ("memType", c_uint32), ("u", _TensorMemV1)]


class Qnn_SparseLayoutHybridCoo_t(Structure):
    _fields_ = [("numSpecifiedElements", c_uint32), ("numSparseDimensions", c_uint32)]


class _SparseLayouts(Union):
    _fields_ = [("hybridCoo", Qnn_SparseLayoutHybridCoo_t)]


class Qnn_SparseParams_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("type", c_uint32), ("u", _SparseLayouts)]


class Qnn_TensorV2_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("id", c_uint32), ("name", c_char_p), ("type", c_uint32), ("dataFormat", c_uint32),
                ("dataType", c_uint32), ("quantizeParams", Qnn_QuantizeParams_t), ("rank", c_uint32),
                ("dimensions", POINTER(c_uint32)), ("memType", c_uint32), ("u", _TensorMemV2),
                ("isDynamicDimensions", POINTER(c_uint8)), ("sparseParams", Qnn_SparseParams_t),
                ("isProduced", c_uint8)]


class _TensorVersions(Union):
    _fields_ = [("v1", Qnn_TensorV1_t), ("v2", Qnn_TensorV2_t)]


class Qnn_Tensor_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", c_uint32), ("u", _TensorVersions)]


# --- System/QnnSystemContext.h -----------------------------------------------------------------
class QnnSystemContext_GraphInfoV1_t(Structure):
    _fields_ = [("graphName", c_char_p), ("numGraphInputs", c_uint32),
                ("graphInputs", POINTER(Qnn_Tensor_t)), ("numGraphOutputs", c_uint32),
                ("graphOutputs", POINTER(Qnn_Tensor_t))]


class QnnSystemContext_GraphInfoV2_t(Structure):
    _fields_ = QnnSystemContext_GraphInfoV1_t._fields_ + [
        ("numUpdateableTensors", c_uint32), ("updateableTensors", POINTER(Qnn_Tensor_t))]


class QnnSystemContext_GraphInfoV3_t(Structure):
    _fields_ = QnnSystemContext_GraphInfoV2_t._fields_ + [
        ("graphBlobInfoSize", c_uint32), ("graphBlobInfo", c_void_p),
        ("startOpIndex", c_uint32), ("endOpIndex", c_uint32)]


class _GraphInfoVersions(Union):
    _fields_ = [("graphInfoV1", QnnSystemContext_GraphInfoV1_t),
                ("graphInfoV2", QnnSystemContext_GraphInfoV2_t),
                ("graphInfoV3", QnnSystemContext_GraphInfoV3_t)]


class QnnSystemContext_GraphInfo_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", c_uint32), ("u", _GraphInfoVersions)]


# --- QnnDevice.h: the platform info a V2/V3 binary info points at ------------------------------
class QnnDevice_CoreInfoV1_t(Structure):
    _fields_ = [("coreId", c_uint32), ("coreType", c_uint32), ("coreInfoExtension", c_void_p)]


class _CoreInfoVersions(Union):
    _fields_ = [("v1", QnnDevice_CoreInfoV1_t)]


class QnnDevice_CoreInfo_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", c_uint32), ("u", _CoreInfoVersions)]


class QnnDevice_HardwareDeviceInfoV1_t(Structure):
    _fields_ = [("deviceId", c_uint32), ("deviceType", c_uint32), ("numCores", c_uint32),
                ("cores", POINTER(QnnDevice_CoreInfo_t)), ("deviceInfoExtension", c_void_p)]


class _HardwareDeviceInfoVersions(Union):
    _fields_ = [("v1", QnnDevice_HardwareDeviceInfoV1_t)]


class QnnDevice_HardwareDeviceInfo_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", c_uint32), ("u", _HardwareDeviceInfoVersions)]


class QnnDevice_PlatformInfoV1_t(Structure):
    _fields_ = [("numHwDevices", c_uint32), ("hwDevices", POINTER(QnnDevice_HardwareDeviceInfo_t))]


class _PlatformInfoVersions(Union):
    _fields_ = [("v1", QnnDevice_PlatformInfoV1_t)]


class QnnDevice_PlatformInfo_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", c_uint32), ("u", _PlatformInfoVersions)]


_BINARY_INFO_HEAD = [
    ("backendId", c_uint32), ("buildId", c_char_p), ("coreApiVersion", Qnn_Version_t),
    ("backendApiVersion", Qnn_Version_t), ("socVersion", c_char_p)]
_BINARY_INFO_GRAPHS = [
    ("numContextTensors", c_uint32), ("contextTensors", POINTER(Qnn_Tensor_t)),
    ("numGraphs", c_uint32), ("graphs", POINTER(QnnSystemContext_GraphInfo_t))]


class QnnSystemContext_BinaryInfoV1_t(Structure):
    _fields_ = _BINARY_INFO_HEAD + [
        ("hwInfoBlobVersion", Qnn_Version_t), ("contextBlobVersion", Qnn_Version_t),
        ("hwInfoBlobSize", c_uint32), ("hwInfoBlob", c_void_p), ("contextBlobSize", c_uint64),
    ] + _BINARY_INFO_GRAPHS


class QnnSystemContext_BinaryInfoV2_t(Structure):
    _fields_ = QnnSystemContext_BinaryInfoV1_t._fields_ + [
        ("platformInfo", POINTER(QnnDevice_PlatformInfo_t))]


class QnnSystemContext_BinaryInfoV3_t(Structure):
    _fields_ = _BINARY_INFO_HEAD + [
        ("contextBlobVersion", Qnn_Version_t), ("contextBlobSize", c_uint64),
    ] + _BINARY_INFO_GRAPHS + [
        ("platformInfo", POINTER(QnnDevice_PlatformInfo_t)), ("contextMetadataSize", c_uint32),
        ("contextMetadata", c_void_p),
        ("socModel", c_uint32)]


class _BinaryInfoVersions(Union):
    _fields_ = [("contextBinaryInfoV1", QnnSystemContext_BinaryInfoV1_t),
                ("contextBinaryInfoV2", QnnSystemContext_BinaryInfoV2_t),
                ("contextBinaryInfoV3", QnnSystemContext_BinaryInfoV3_t)]


class QnnSystemContext_BinaryInfo_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", c_uint32), ("u", _BinaryInfoVersions)]


SYSTEM_CONTEXT_ERRORS = {
    QNN_MIN_ERROR_SYSTEM + 0: "QNN_SYSTEM_CONTEXT_ERROR_UNSUPPORTED_FEATURE",
    QNN_MIN_ERROR_SYSTEM + 1: "QNN_SYSTEM_CONTEXT_ERROR_INVALID_HANDLE",
    QNN_MIN_ERROR_SYSTEM + 2: "QNN_SYSTEM_CONTEXT_ERROR_OPERATION_FAILED",
    QNN_MIN_ERROR_SYSTEM + 10: "QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY",
    1000: "QNN_COMMON_ERROR_NOT_SUPPORTED", 1002: "QNN_COMMON_ERROR_MEM_ALLOC",
    1004: "QNN_COMMON_ERROR_INVALID_ARGUMENT",
}

# --- System/QnnSystemInterface.h ---------------------------------------------------------------
QnnSystemContext_Handle_t = c_void_p
QnnSystemContext_CreateFn_t = ctypes.CFUNCTYPE(Qnn_ErrorHandle_t, POINTER(c_void_p))
QnnSystemContext_GetBinaryInfoFn_t = ctypes.CFUNCTYPE(
    Qnn_ErrorHandle_t, c_void_p, c_void_p, c_uint64,
    POINTER(POINTER(QnnSystemContext_BinaryInfo_t)), POINTER(c_uint64))
QnnSystemContext_GetMetaDataFn_t = ctypes.CFUNCTYPE(
    Qnn_ErrorHandle_t, c_void_p, c_void_p, c_uint64, POINTER(POINTER(QnnSystemContext_BinaryInfo_t)))
QnnSystemContext_FreeFn_t = ctypes.CFUNCTYPE(Qnn_ErrorHandle_t, c_void_p)


class QnnSystemInterface_ImplementationV1_t(Structure):
    """The function table; only the first four entries (system context) are called here.

    Later entries are typed as plain pointers: a library older than the header simply has fewer
    of them, and this module never reads past the ones it calls.
    """
    _fields_ = [
        ("systemContextCreate", QnnSystemContext_CreateFn_t),
        ("systemContextGetBinaryInfo", QnnSystemContext_GetBinaryInfoFn_t),
        ("systemContextGetMetaData", QnnSystemContext_GetMetaDataFn_t),
        ("systemContextFree", QnnSystemContext_FreeFn_t),
        ("systemTensorGetMemoryFootprint", c_void_p),
        ("systemLogCreate", c_void_p),
        ("systemLogSetLogLevel", c_void_p),
        ("systemLogFree", c_void_p),
        ("systemDlcCreateFromFile", c_void_p),
        ("systemDlcCreateFromBinary", c_void_p),
        ("systemDlcComposeGraphs", c_void_p),
        ("systemDlcGetOpMappings", c_void_p),
        ("systemDlcFree", c_void_p),
        ("systemProfileCreateSerializationTarget", c_void_p),
        ("systemProfileSerializeEventData", c_void_p),
        ("systemProfileFreeSerializationTarget", c_void_p),
    ]


class QnnSystemInterface_t(Structure):
    _fields_ = [("backendId", c_uint32), ("providerName", c_char_p),
                ("systemApiVersion", Qnn_Version_t), ("impl", QnnSystemInterface_ImplementationV1_t)]


# --- HTP/QnnHtpSystemContext.h: the backend-specific blobs ------------------------------------
QNN_SYSTEM_CONTEXT_HTP_GRAPH_INFO_BLOB_VERSION_V1 = 1
QNN_SYSTEM_CONTEXT_HTP_GRAPH_INFO_BLOB_VERSION_V2 = 2
QNN_SYSTEM_CONTEXT_HTP_CONTEXT_INFO_BLOB_VERSION_V1 = 1


class QnnHtpSystemContext_GraphBlobInfoV1_t(Structure):
    _fields_ = [("spillFillBufferSize", c_uint64), ("vtcmSize", c_uint32),
                ("optimizationLevel", c_uint32), ("htpDlbc", c_uint8), ("numHvxThreads", c_uint64)]


class _GraphBlobInfoVersions(Union):
    _fields_ = [("contextBinaryGraphBlobInfoV1", QnnHtpSystemContext_GraphBlobInfoV1_t)]


class QnnHtpSystemContext_GraphBlobInfo_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", c_uint32), ("u", _GraphBlobInfoVersions)]


class QnnHtpSystemContext_GraphBlobInfoV2_t(Structure):
    """Carries its own version field first (unlike V1, which sits inside the tagged union)."""
    _fields_ = [("version", c_uint32), ("nativeKChannelSize", c_uint64),
                ("nativeVChannelSize", c_uint64), ("isSafeShareIO", c_uint32),
                ("ioTensorSize", c_uint64), ("opDataSize", c_uint64), ("constSize", c_uint64),
                ("ddrTensorSize", c_uint64), ("sharedWeightsSize", c_uint64)]


class QnnHtpSystemContext_ContextBlobInfoV1_t(Structure):
    _fields_ = [("dspArch", c_uint32)]


class _ContextBlobInfoVersions(Union):
    _fields_ = [("contextBinaryContextBlobInfoV1", QnnHtpSystemContext_ContextBlobInfoV1_t)]


class QnnHtpSystemContext_ContextBlobInfo_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", c_uint32), ("u", _ContextBlobInfoVersions)]


class QnnHtpSystemContext_HwBlobInfoV1_t(Structure):
    _fields_ = [("graphListIndex", c_uint32), ("spillFillBufferSize", c_uint64)]


class _HwBlobInfoVersions(Union):
    _fields_ = [("contextBinaryHwInfoBlobV1_t", QnnHtpSystemContext_HwBlobInfoV1_t)]


class QnnHtpSystemContext_HwBlobInfo_t(Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", c_uint32), ("u", _HwBlobInfoVersions)]


# Every struct the C layout test checks, by its C name (the class name).
ALL_STRUCTS: tuple[type, ...] = (
    Qnn_Version_t, Qnn_ApiVersion_t, Qnn_ScaleOffset_t, Qnn_BwScaleOffset_t, Qnn_AxisScaleOffset_t,
    Qnn_BwAxisScaleOffset_t, Qnn_BwAxisScaleOffsetMapped_t, Qnn_BlockEncoding_t, Qnn_BwBlockMapped_t,
    Qnn_BlockwiseExpansion_t, Qnn_BwBlockwiseExpansionMapped_t, Qnn_VectorEncoding_t,
    Qnn_FloatScaleOffset_t, Qnn_FloatBlockEncoding_t, Qnn_BwFloatBlockEncoding_t,
    Qnn_QuantizeParams_t, Qnn_ClientBuffer_t, Qnn_TensorRetrieveRaw_t, Qnn_TensorV1_t,
    Qnn_SparseLayoutHybridCoo_t, Qnn_SparseParams_t, Qnn_TensorV2_t, Qnn_Tensor_t,
    QnnDevice_CoreInfoV1_t, QnnDevice_CoreInfo_t, QnnDevice_HardwareDeviceInfoV1_t,
    QnnDevice_HardwareDeviceInfo_t, QnnDevice_PlatformInfoV1_t, QnnDevice_PlatformInfo_t,
    QnnSystemContext_GraphInfoV1_t, QnnSystemContext_GraphInfoV2_t, QnnSystemContext_GraphInfoV3_t,
    QnnSystemContext_GraphInfo_t, QnnSystemContext_BinaryInfoV1_t, QnnSystemContext_BinaryInfoV2_t,
    QnnSystemContext_BinaryInfoV3_t, QnnSystemContext_BinaryInfo_t,
    QnnSystemInterface_ImplementationV1_t, QnnSystemInterface_t,
    QnnHtpSystemContext_GraphBlobInfoV1_t, QnnHtpSystemContext_GraphBlobInfo_t,
    QnnHtpSystemContext_GraphBlobInfoV2_t, QnnHtpSystemContext_ContextBlobInfoV1_t,
    QnnHtpSystemContext_ContextBlobInfo_t, QnnHtpSystemContext_HwBlobInfoV1_t,
    QnnHtpSystemContext_HwBlobInfo_t,
)


def field_offsets(struct: type) -> dict[str, int]:
    """{field: byte offset}, with anonymous unions flattened to their first-level members."""
    out: dict[str, int] = {}
    anon = set(getattr(struct, "_anonymous_", ()))
    for name, _typ in struct._fields_:
        off = getattr(struct, name).offset
        if name in anon:
            for sub, _t in _typ._fields_:
                out[sub] = off + getattr(_typ, sub).offset
        else:
            out[name] = off
    return out
