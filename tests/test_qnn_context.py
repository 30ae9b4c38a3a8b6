"""Reading QNN context binaries through the real libQnnSystem.so.

The binaries are made here by ONNX Runtime's real QNN EP from tiny models built by the test; the
struct layouts are checked against gcc compiling the same structs typed in C from the public
QAIRT headers (QnnTypes.h, QnnDevice.h, System/QnnSystemContext.h, System/QnnSystemInterface.h,
HTP/QnnHtpSystemContext.h).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from modelexport.core.errors import InputError
from modelexport.toolchain.qnn_context import extract_from_epcontext, find_epcontext_nodes, read_context_binary
from modelexport.toolchain.qnn_context import structs as S
from modelexport.toolchain.qnn_context.decode import decode_htp_graph_blob, decode_quantization

TARGETS = {57: ("SM8650", 75), 69: ("SM8750", 79)}

# ------------------------------------------------------------------------------------------------
# Layout: the structs typed in C from the public headers; gcc says where every field is.
# ------------------------------------------------------------------------------------------------
C_STRUCTS = r"""
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef uint64_t Qnn_ErrorHandle_t;
typedef void* Qnn_MemHandle_t;
typedef enum { QNN_DATATYPE_INT_8 = 0x0008, QNN_DATATYPE_UNDEFINED = 0x7FFFFFFF } Qnn_DataType_t;
typedef enum { QNN_TENSOR_TYPE_APP_WRITE = 0, QNN_TENSOR_TYPE_UNDEFINED = 0x7FFFFFFF } Qnn_TensorType_t;
typedef enum { QNN_DEFINITION_IMPL_GENERATED = 0, QNN_DEFINITION_UNDEFINED = 0x7FFFFFFF } Qnn_Definition_t;
typedef enum { QNN_QUANTIZATION_ENCODING_SCALE_OFFSET = 0,
               QNN_QUANTIZATION_ENCODING_UNDEFINED = 0x7FFFFFFF } Qnn_QuantizationEncoding_t;
typedef enum { QNN_QUANTIZATION_ENCODING_MAPPING_STANDARD_SYMMETRIC = 0,
               QNN_QUANTIZATION_ENCODING_MAPPING_UNDEFINED = 0x7FFFFFFF } Qnn_QuantizationEncodingMapping_t;
typedef enum { QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_8 = 0,
               QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_UNDEFINED = 0x7FFFFFFF
} Qnn_BlockwiseExpansionBlockScaleStorageType_t;
typedef enum { QNN_TENSORMEMTYPE_RAW = 0, QNN_TENSORMEMTYPE_UNDEFINED = 0x7FFFFFFF } Qnn_TensorMemType_t;
typedef enum { QNN_SPARSE_LAYOUT_HYBRID_COO = 0, QNN_SPARSE_LAYOUT_UNDEFINED = 0x7FFFFFFF } Qnn_SparseLayoutType_t;
typedef enum { QNN_TENSOR_VERSION_1 = 1, QNN_TENSOR_VERSION_UNDEFINED = 0x7FFFFFFF } Qnn_TensorVersion_t;
typedef uint32_t Qnn_TensorDataFormat_t;

typedef struct { uint32_t major; uint32_t minor; uint32_t patch; } Qnn_Version_t;
typedef struct { Qnn_Version_t coreApiVersion; Qnn_Version_t backendApiVersion; } Qnn_ApiVersion_t;

typedef struct { float scale; int32_t offset; } Qnn_ScaleOffset_t;
typedef struct { uint32_t bitwidth; float scale; int32_t offset; } Qnn_BwScaleOffset_t;
typedef struct { int32_t axis; uint32_t numScaleOffsets; Qnn_ScaleOffset_t* scaleOffset; } Qnn_AxisScaleOffset_t;
typedef struct { uint32_t bitwidth; int32_t axis; uint32_t numElements; float* scales; int32_t* offsets;
} Qnn_BwAxisScaleOffset_t;
typedef struct { uint32_t bitwidth; int32_t axis; Qnn_QuantizationEncodingMapping_t mapping;
                 uint32_t numElements; float* scales; int32_t* offsets; } Qnn_BwAxisScaleOffsetMapped_t;
typedef struct { uint32_t* blockSize; Qnn_ScaleOffset_t* scaleOffset; } Qnn_BlockEncoding_t;
typedef struct { uint32_t bitwidth; Qnn_QuantizationEncodingMapping_t mapping; uint32_t* blockSize;
                 Qnn_ScaleOffset_t* scaleOffset; } Qnn_BwBlockMapped_t;
typedef struct { int32_t axis; Qnn_ScaleOffset_t* scaleOffsets; uint32_t numBlocksPerAxis;
                 uint32_t blockScaleBitwidth; Qnn_BlockwiseExpansionBlockScaleStorageType_t blockScaleStorageType;
                 union { uint8_t* blocksScale8; uint16_t* blocksScale16; }; } Qnn_BlockwiseExpansion_t;
typedef struct { uint32_t bitwidth; Qnn_QuantizationEncodingMapping_t mapping; int32_t axis;
                 Qnn_ScaleOffset_t* scaleOffsets; uint32_t numBlocksPerAxis; uint32_t blockScaleBitwidth;
                 Qnn_BlockwiseExpansionBlockScaleStorageType_t blockScaleStorageType;
                 union { uint8_t* blocksScale8; uint16_t* blocksScale16; }; } Qnn_BwBlockwiseExpansionMapped_t;
typedef struct { Qnn_BwAxisScaleOffset_t bwAxisScaleOffset; uint32_t rowsPerBlock; uint32_t columnsPerBlock;
                 uint8_t vectorDimension; uint8_t vectorStride; uint8_t indexBitwidth; } Qnn_VectorEncoding_t;
typedef struct { float scale; float offset; } Qnn_FloatScaleOffset_t;
typedef struct { uint32_t* blockSize; Qnn_FloatScaleOffset_t* floatScaleOffset; } Qnn_FloatBlockEncoding_t;
typedef struct { uint32_t bitwidth; uint32_t* blockSize; Qnn_FloatScaleOffset_t* floatScaleOffset;
} Qnn_BwFloatBlockEncoding_t;

typedef struct {
  Qnn_Definition_t encodingDefinition;
  Qnn_QuantizationEncoding_t quantizationEncoding;
  union {
    Qnn_ScaleOffset_t scaleOffsetEncoding;
    Qnn_AxisScaleOffset_t axisScaleOffsetEncoding;
    Qnn_BwScaleOffset_t bwScaleOffsetEncoding;
    Qnn_BwAxisScaleOffset_t bwAxisScaleOffsetEncoding;
    Qnn_BlockEncoding_t blockEncoding;
    Qnn_BlockwiseExpansion_t* blockwiseExpansion;
    Qnn_VectorEncoding_t* vectorEncoding;
    Qnn_FloatBlockEncoding_t floatBlockEncoding;
    Qnn_BwAxisScaleOffsetMapped_t* bwAxisScaleOffsetMappedEncoding;
    Qnn_BwBlockMapped_t* bwBlockMappedEncoding;
    Qnn_BwBlockwiseExpansionMapped_t* bwBlockwiseExpansionMappedEncoding;
    Qnn_BwFloatBlockEncoding_t bwFloatBlockEncoding;
  };
} Qnn_QuantizeParams_t;

typedef struct { void* data; uint32_t dataSize; } Qnn_ClientBuffer_t;
typedef struct { void* getTensorData; void* freeTensorData; } Qnn_TensorRetrieveRaw_t;

typedef struct {
  uint32_t id; const char* name; Qnn_TensorType_t type; Qnn_TensorDataFormat_t dataFormat;
  Qnn_DataType_t dataType; Qnn_QuantizeParams_t quantizeParams; uint32_t rank; uint32_t* dimensions;
  Qnn_TensorMemType_t memType;
  union { Qnn_ClientBuffer_t clientBuf; Qnn_MemHandle_t memHandle; };
} Qnn_TensorV1_t;

typedef struct { uint32_t numSpecifiedElements; uint32_t numSparseDimensions; } Qnn_SparseLayoutHybridCoo_t;
typedef struct { Qnn_SparseLayoutType_t type; union { Qnn_SparseLayoutHybridCoo_t hybridCoo; }; } Qnn_SparseParams_t;

typedef struct {
  uint32_t id; const char* name; Qnn_TensorType_t type; Qnn_TensorDataFormat_t dataFormat;
  Qnn_DataType_t dataType; Qnn_QuantizeParams_t quantizeParams; uint32_t rank; uint32_t* dimensions;
  Qnn_TensorMemType_t memType;
  union { Qnn_ClientBuffer_t clientBuf; Qnn_MemHandle_t memHandle; Qnn_TensorRetrieveRaw_t* retrieveRaw; };
  uint8_t* isDynamicDimensions; Qnn_SparseParams_t sparseParams; uint8_t isProduced;
} Qnn_TensorV2_t;

typedef struct { Qnn_TensorVersion_t version; union { Qnn_TensorV1_t v1; Qnn_TensorV2_t v2; }; } Qnn_Tensor_t;

/* QnnDevice.h */
typedef struct { uint32_t coreId; uint32_t coreType; void* coreInfoExtension; } QnnDevice_CoreInfoV1_t;
typedef struct { uint32_t version; union { QnnDevice_CoreInfoV1_t v1; }; } QnnDevice_CoreInfo_t;
typedef struct { uint32_t deviceId; uint32_t deviceType; uint32_t numCores; QnnDevice_CoreInfo_t* cores;
                 void* deviceInfoExtension; } QnnDevice_HardwareDeviceInfoV1_t;
typedef struct { uint32_t version; union { QnnDevice_HardwareDeviceInfoV1_t v1; }; } QnnDevice_HardwareDeviceInfo_t;
typedef struct { uint32_t numHwDevices; QnnDevice_HardwareDeviceInfo_t* hwDevices; } QnnDevice_PlatformInfoV1_t;
typedef struct { uint32_t version; union { QnnDevice_PlatformInfoV1_t v1; }; } QnnDevice_PlatformInfo_t;

/* System/QnnSystemContext.h */
typedef struct { const char* graphName; uint32_t numGraphInputs; Qnn_Tensor_t* graphInputs;
                 uint32_t numGraphOutputs; Qnn_Tensor_t* graphOutputs; } QnnSystemContext_GraphInfoV1_t;
typedef struct { const char* graphName; uint32_t numGraphInputs; Qnn_Tensor_t* graphInputs;
                 uint32_t numGraphOutputs; Qnn_Tensor_t* graphOutputs;
                 uint32_t numUpdateableTensors; Qnn_Tensor_t* updateableTensors; } QnnSystemContext_GraphInfoV2_t;
typedef struct { const char* graphName; uint32_t numGraphInputs; Qnn_Tensor_t* graphInputs;
                 uint32_t numGraphOutputs; Qnn_Tensor_t* graphOutputs;
                 uint32_t numUpdateableTensors; Qnn_Tensor_t* updateableTensors;
                 uint32_t graphBlobInfoSize; void* graphBlobInfo; uint32_t startOpIndex; uint32_t endOpIndex;
} QnnSystemContext_GraphInfoV3_t;
typedef struct { uint32_t version; union { QnnSystemContext_GraphInfoV1_t graphInfoV1;
  QnnSystemContext_GraphInfoV2_t graphInfoV2; QnnSystemContext_GraphInfoV3_t graphInfoV3; }; } QnnSystemContext_GraphInfo_t;

typedef struct {
  uint32_t backendId; const char* buildId; Qnn_Version_t coreApiVersion; Qnn_Version_t backendApiVersion;
  const char* socVersion; Qnn_Version_t hwInfoBlobVersion; Qnn_Version_t contextBlobVersion;
  uint32_t hwInfoBlobSize; void* hwInfoBlob; uint64_t contextBlobSize;
  uint32_t numContextTensors; Qnn_Tensor_t* contextTensors; uint32_t numGraphs; QnnSystemContext_GraphInfo_t* graphs;
} QnnSystemContext_BinaryInfoV1_t;
typedef struct {
  uint32_t backendId; const char* buildId; Qnn_Version_t coreApiVersion; Qnn_Version_t backendApiVersion;
  const char* socVersion; Qnn_Version_t hwInfoBlobVersion; Qnn_Version_t contextBlobVersion;
  uint32_t hwInfoBlobSize; void* hwInfoBlob; uint64_t contextBlobSize;
  uint32_t numContextTensors; Qnn_Tensor_t* contextTensors; uint32_t numGraphs; QnnSystemContext_GraphInfo_t* graphs;
  QnnDevice_PlatformInfo_t* platformInfo;
} QnnSystemContext_BinaryInfoV2_t;
typedef struct {
  uint32_t backendId; const char* buildId; Qnn_Version_t coreApiVersion; Qnn_Version_t backendApiVersion;
  const char* socVersion; Qnn_Version_t contextBlobVersion; uint64_t contextBlobSize;
  uint32_t numContextTensors; Qnn_Tensor_t* contextTensors; uint32_t numGraphs; QnnSystemContext_GraphInfo_t* graphs;
  QnnDevice_PlatformInfo_t* platformInfo; uint32_t contextMetadataSize; void* contextMetadata; uint32_t socModel;
} QnnSystemContext_BinaryInfoV3_t;
typedef struct { uint32_t version; union { QnnSystemContext_BinaryInfoV1_t contextBinaryInfoV1;
  QnnSystemContext_BinaryInfoV2_t contextBinaryInfoV2; QnnSystemContext_BinaryInfoV3_t contextBinaryInfoV3; };
} QnnSystemContext_BinaryInfo_t;

/* System/QnnSystemInterface.h */
typedef Qnn_ErrorHandle_t (*CreateFn)(void**);
typedef Qnn_ErrorHandle_t (*GetBinaryInfoFn)(void*, void*, uint64_t, const QnnSystemContext_BinaryInfo_t**, uint64_t*);
typedef Qnn_ErrorHandle_t (*GetMetaDataFn)(void*, const void*, uint64_t, const QnnSystemContext_BinaryInfo_t**);
typedef Qnn_ErrorHandle_t (*FreeFn)(void*);
typedef struct {
  CreateFn systemContextCreate; GetBinaryInfoFn systemContextGetBinaryInfo;
  GetMetaDataFn systemContextGetMetaData; FreeFn systemContextFree;
  void* systemTensorGetMemoryFootprint; void* systemLogCreate; void* systemLogSetLogLevel; void* systemLogFree;
  void* systemDlcCreateFromFile; void* systemDlcCreateFromBinary; void* systemDlcComposeGraphs;
  void* systemDlcGetOpMappings; void* systemDlcFree; void* systemProfileCreateSerializationTarget;
  void* systemProfileSerializeEventData; void* systemProfileFreeSerializationTarget;
} QnnSystemInterface_ImplementationV1_t;
typedef struct { uint32_t backendId; const char* providerName; Qnn_Version_t systemApiVersion;
                 union { QnnSystemInterface_ImplementationV1_t impl; }; } QnnSystemInterface_t;

/* HTP/QnnHtpSystemContext.h */
typedef struct { uint64_t spillFillBufferSize; uint32_t vtcmSize; uint32_t optimizationLevel; uint8_t htpDlbc;
                 uint64_t numHvxThreads; } QnnHtpSystemContext_GraphBlobInfoV1_t;
typedef struct { uint32_t version; union { QnnHtpSystemContext_GraphBlobInfoV1_t contextBinaryGraphBlobInfoV1; };
} QnnHtpSystemContext_GraphBlobInfo_t;
typedef struct { uint32_t version; uint64_t nativeKChannelSize; uint64_t nativeVChannelSize; uint32_t isSafeShareIO;
                 uint64_t ioTensorSize; uint64_t opDataSize; uint64_t constSize; uint64_t ddrTensorSize;
                 uint64_t sharedWeightsSize; } QnnHtpSystemContext_GraphBlobInfoV2_t;
typedef struct { uint32_t dspArch; } QnnHtpSystemContext_ContextBlobInfoV1_t;
typedef struct { uint32_t version; union { QnnHtpSystemContext_ContextBlobInfoV1_t contextBinaryContextBlobInfoV1; };
} QnnHtpSystemContext_ContextBlobInfo_t;
typedef struct { uint32_t graphListIndex; uint64_t spillFillBufferSize; } QnnHtpSystemContext_HwBlobInfoV1_t;
typedef struct { uint32_t version; union { QnnHtpSystemContext_HwBlobInfoV1_t contextBinaryHwInfoBlobV1_t; };
} QnnHtpSystemContext_HwBlobInfo_t;

#define SIZE(T) printf(#T " __size__ %zu\n", sizeof(T));
#define OFF(T, f) printf(#T " " #f " %zu\n", offsetof(T, f));
int main(void) {
%BODY%
  return 0;
}
"""


def test_ctypes_layouts_match_gcc(tmp_path):
    gcc = shutil.which("gcc")
    assert gcc, "gcc is needed to check the QNN struct layouts (apt-get install gcc)"
    body = []
    for struct in S.ALL_STRUCTS:
        body.append(f"  SIZE({struct.__name__})")
        body += [f"  OFF({struct.__name__}, {f})" for f in S.field_offsets(struct)]
    src = tmp_path / "layout.c"
    src.write_text(C_STRUCTS.replace("%BODY%", "\n".join(body)))
    exe = tmp_path / "layout"
    subprocess.run([gcc, "-std=c11", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True,
                   capture_output=True, text=True)
    c_layout = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.splitlines():
        struct, field, value = line.split()
        c_layout[(struct, field)] = int(value)
    py_layout = {}
    for struct in S.ALL_STRUCTS:
        py_layout[(struct.__name__, "__size__")] = ctypes.sizeof(struct)
        py_layout.update({(struct.__name__, f): o for f, o in S.field_offsets(struct).items()})
    mismatches = {k: (py_layout[k], c_layout.get(k)) for k in py_layout if py_layout[k] != c_layout.get(k)}
    assert not mismatches, f"ctypes vs gcc (offset or size): {mismatches}"
    assert len(c_layout) == len(py_layout) > 200
    # The sizes the reader steps by, spelled out.
    assert c_layout[("Qnn_Tensor_t", "__size__")] == 144
    assert c_layout[("QnnSystemContext_GraphInfo_t", "__size__")] == 88
    assert c_layout[("QnnHtpSystemContext_GraphBlobInfo_t", "__size__")] == 40
    assert c_layout[("QnnHtpSystemContext_GraphBlobInfoV2_t", "__size__")] == 72


# ------------------------------------------------------------------------------------------------
# Real binaries from ONNX Runtime's QNN EP
# ------------------------------------------------------------------------------------------------
def _toy(path: Path, seq: int = 4) -> None:
    """x[1,seq,16] @ w[16,8] + x2[1,seq,8] -> relu = y; sigmoid(x @ w) = z."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "x2"], ["a"]),
         helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Sigmoid", ["m"], ["z"])], "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, 16]),
         helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, seq, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, 8]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, seq, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, str(path))


def _quantize(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    class Reader(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.it = iter([{"x": rng.standard_normal((1, 4, 16)).astype(np.float32),
                             "x2": rng.standard_normal((1, 4, 8)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.it, None)

    cfg = get_qnn_qdq_config(str(src), Reader(), activation_type=QuantType.QUInt8, weight_type=QuantType.QUInt8)
    quantize(str(src), str(dst), cfg)


def _compile(model: Path, ctx: Path, soc: int, fp16: bool, embed: int = 0, **extra: str) -> Path:
    from modelexport.toolchain.ort_qnn import SessionPlan, create_session
    opts = {"soc_model": str(soc)} | ({"enable_htp_fp16_precision": "1"} if fp16 else {})
    create_session(model, SessionPlan(provider_options=opts, config_entries={
        "ep.context_enable": "1", "ep.context_file_path": str(ctx), "ep.context_embed_mode": str(embed), **extra}))
    assert ctx.is_file()
    return ctx


def _build(d: Path) -> None:
    _toy(d / "toy.onnx")
    _toy(d / "toy_s1.onnx", seq=1)
    _quantize(d / "toy.onnx", d / "toy_qdq.onnx")
    for soc in TARGETS:
        _compile(d / "toy.onnx", d / f"f{soc}_ctx.onnx", soc, fp16=True)
        _compile(d / "toy_qdq.onnx", d / f"q{soc}_ctx.onnx", soc, fp16=False)
    _compile(d / "toy.onnx", d / "emb_ctx.onnx", 69, fp16=True, embed=1)
    _compile(d / "toy.onnx", d / "sh_ar4_ctx.onnx", 57, fp16=True, **{"ep.share_ep_contexts": "1"})
    _compile(d / "toy_s1.onnx", d / "sh_ar1_ctx.onnx", 57, fp16=True,
             **{"ep.share_ep_contexts": "1", "ep.stop_share_ep_contexts": "1"})
    (d / "done").touch()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The toy models and their binaries, built once per test run.

    Under xdist the workers share one folder of this run (the parent of their own temp folders),
    so the binaries are built once even when the tests land on different workers.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        from filelock import FileLock
        d = tmp_path_factory.getbasetemp().parent / "qnn_ctx_binaries"
        with FileLock(str(d) + ".lock"):
            if not (d / "done").exists():
                d.mkdir(exist_ok=True)
                _build(d)
    else:
        d = tmp_path_factory.mktemp("qnn_ctx")
        _build(d)
    out = {"dir": d, "embedded": d / "emb_ctx.onnx", "shared": [d / "sh_ar4_ctx.onnx", d / "sh_ar1_ctx.onnx"]}
    for soc in TARGETS:
        out[("float", soc)], out[("qdq", soc)] = d / f"f{soc}_ctx.onnx", d / f"q{soc}_ctx.onnx"
    return out


def _bin_of(ctx: Path) -> Path:
    """The raw binary ORT wrote next to an embed-mode-0 EPContext model (<stem>_qnn.bin)."""
    nodes = find_epcontext_nodes(ctx)
    assert len(nodes) == 1 and nodes[0].embed_mode == 0
    return Path(nodes[0].cache_path)


def _check_common(info, soc: int) -> None:
    name, arch = TARGETS[soc]
    assert info.build_id.startswith("v2.51.0."), info.build_id
    assert info.qairt_version == "2.51.0"
    assert (info.backend, info.backend_id) == ("HTP", 6)
    assert info.core_api_version == "2.40.0" and info.backend_api_version.startswith("5.51.")
    assert info.binary_info_version == 3
    assert (info.soc_model, info.soc_name, info.dsp_arch, info.htp_arch) == (soc, name, arch, f"v{arch}")
    assert info.vtcm_mb and info.vtcm_mb > 0
    assert len(info.graphs) == 1
    g = info.graphs[0]
    assert g.htp is not None and g.htp.record_versions == [1, 2] and g.htp.unparsed_bytes == 0
    assert g.htp.spill_fill_buffer_size == 0 and g.htp.shared_weights_size == 0 and g.htp.const_size > 0
    assert [(t.name, t.direction, t.shape, t.tensor_type) for t in g.inputs + g.outputs] == [
        ("x", "input", [1, 4, 16], "APP_WRITE"), ("x2", "input", [1, 4, 8], "APP_WRITE"),
        ("y", "output", [1, 4, 8], "APP_READ"), ("z", "output", [1, 4, 8], "APP_READ")]


@pytest.mark.parametrize("soc", sorted(TARGETS))
def test_float_fp16_binary(built, soc):
    ctx = built[("float", soc)]
    path = _bin_of(ctx)
    assert path.name == f"f{soc}_ctx_qnn.bin"
    info = read_context_binary(path)
    _check_common(info, soc)
    data = path.read_bytes()
    assert info.file_size == len(data) and info.sha256 == hashlib.sha256(data).hexdigest()
    assert info.path == str(path) and info.reader.startswith("QnnSystemContext_getMetadata")
    g = info.graphs[0]
    assert g.name == find_epcontext_nodes(ctx)[0].partition_name
    assert {t.dtype for t in g.inputs + g.outputs} == {"FLOAT_32"}
    assert all(t.quantization is None for t in g.inputs + g.outputs)
    doc = json.loads(json.dumps(info.to_dict()))
    assert doc["graphs"][0]["htp"]["vtcm_mb"] == g.htp.vtcm_mb and doc["qairt_version"] == "2.51.0"


@pytest.mark.parametrize("soc", sorted(TARGETS))
def test_qdq_uint8_binary_carries_the_models_scales(built, soc):
    import onnx
    from onnx import numpy_helper
    info = extract_from_epcontext(built[("qdq", soc)])
    _check_common(info, soc)
    qdq = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(built["dir"] / "toy_qdq.onnx")).graph.initializer}
    g = info.graphs[0]
    for t in g.inputs + g.outputs:
        assert t.dtype == "UFIXED_POINT_8"
        q = t.quantization
        assert q.encoding == "SCALE_OFFSET" and q.definition == "DEFINED"
        assert np.float32(q.scale) == qdq[f"{t.name}_scale"]
        assert q.zero_point == int(qdq[f"{t.name}_zero_point"]) == -q.offset


def test_embed_mode_1_binary_inside_the_model(built):
    import onnx
    ctx = built["embedded"]
    (node,) = find_epcontext_nodes(ctx)
    assert node.embed_mode == 1 and node.cache_path is None and node.embedded_size > 0
    info = extract_from_epcontext(ctx)
    _check_common(info, 69)
    raw = next(a.s for n in onnx.load(str(ctx)).graph.node if n.op_type == "EPContext"
               for a in n.attribute if a.name == "ep_cache_context")
    assert info.path is None and info.sha256 == hashlib.sha256(raw).hexdigest()
    assert read_context_binary(raw).to_dict() == {**info.to_dict(), "referenced_by": []}


def test_weight_shared_binary_holds_both_graphs(built):
    ar4, ar1 = built["shared"]
    bins = {n.cache_path for ctx in (ar4, ar1) for n in find_epcontext_nodes(ctx)}
    assert len(bins) == 1, bins  # one _ctx_qnn.bin, referenced by both models
    info = read_context_binary(bins.pop())
    assert len(info.graphs) == 2
    names = [find_epcontext_nodes(ctx)[0].partition_name for ctx in (ar4, ar1)]
    assert [g.name for g in info.graphs] == names
    assert [g.inputs[0].shape for g in info.graphs] == [[1, 4, 16], [1, 1, 16]]
    shared = {g.htp.shared_weights_size for g in info.graphs}
    assert len(shared) == 1 and shared.pop() > 0
    unshared = read_context_binary(_bin_of(built[("float", 57)])).graphs[0].htp
    assert all(g.htp.const_size < unshared.const_size for g in info.graphs)
    # Reading through the second model finds the same binary.
    assert extract_from_epcontext(ar1).sha256 == info.sha256


def test_not_a_context_binary_is_an_input_error(built, tmp_path):
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(InputError, match="not a QNN context binary.*MALFORMED_BINARY") as e:
        read_context_binary(garbage)
    assert "ctx_qnn.bin" in e.value.fix
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes(_bin_of(built[("float", 57)]).read_bytes()[:8192])
    with pytest.raises(InputError, match="MALFORMED_BINARY"):
        read_context_binary(truncated)
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        read_context_binary(tmp_path / "empty.bin")
    with pytest.raises(InputError, match="no such file"):
        read_context_binary(tmp_path / "missing.bin")
    with pytest.raises(InputError, match="ONNX model") as e:
        read_context_binary(built[("float", 57)])
    assert "extract_from_epcontext" in e.value.fix
    with pytest.raises(InputError, match="no EPContext node"):
        extract_from_epcontext(built["dir"] / "toy.onnx")
    with pytest.raises(InputError, match="not a readable ONNX model"):
        extract_from_epcontext(garbage)


def test_htp_graph_blob_is_decoded_only_as_far_as_it_goes(built):
    """A blob cut inside the V2 record keeps V1 and reports the rest as unparsed."""
    from modelexport.toolchain.qnn_context.decode import _HTP_GRAPH_BLOB_V1_SIZE as V1
    full = decode_htp_graph_blob(_real_blob(built))
    cut = decode_htp_graph_blob(_real_blob(built)[:V1 + 20])
    assert full.record_versions == [1, 2] and cut.record_versions == [1]
    assert cut.vtcm_bytes == full.vtcm_bytes and cut.shared_weights_size is None and cut.unparsed_bytes == 20
    assert decode_htp_graph_blob(b"\x07\x00\x00\x00" + bytes(60)).record_versions == []


def _real_blob(built) -> bytes:
    """The graph blob bytes of a real binary, fetched again through the structs (not from the file)."""
    from modelexport.toolchain.qnn_context import reader
    data = _bin_of(built[("float", 57)]).read_bytes()
    s = reader._system()
    h = ctypes.c_void_p()
    assert s.iface.impl.systemContextCreate(ctypes.byref(h)) == 0
    try:
        p = ctypes.POINTER(S.QnnSystemContext_BinaryInfo_t)()
        assert s.iface.impl.systemContextGetMetaData(h, data, len(data), ctypes.byref(p)) == 0
        g = p.contents.contextBinaryInfoV3.graphs[0].graphInfoV3
        return ctypes.string_at(g.graphBlobInfo, g.graphBlobInfoSize)
    finally:
        s.iface.impl.systemContextFree(h)


def test_per_axis_and_block_encodings_decode():
    """Graph I/O from ONNX Runtime is per-tensor; the per-axis paths are checked on structs built here."""
    scales = (ctypes.c_float * 3)(0.5, 0.25, 0.125)
    offsets = (ctypes.c_int32 * 3)(-1, -2, -3)
    q = S.Qnn_QuantizeParams_t(encodingDefinition=1,
                               quantizationEncoding=S.QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET)
    q.bwAxisScaleOffsetEncoding = S.Qnn_BwAxisScaleOffset_t(4, 0, 3, scales, offsets)
    info = decode_quantization(q, [3, 8])
    assert (info.encoding, info.axis, info.bitwidth) == ("BW_AXIS_SCALE_OFFSET", 0, 4)
    assert info.scales == [0.5, 0.25, 0.125] and info.offsets == [-1, -2, -3] and info.zero_points == [1, 2, 3]

    pairs = (S.Qnn_ScaleOffset_t * 2)((0.5, -128), (0.75, 0))
    q = S.Qnn_QuantizeParams_t(encodingDefinition=1,
                               quantizationEncoding=S.QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET)
    q.axisScaleOffsetEncoding = S.Qnn_AxisScaleOffset_t(1, 2, pairs)
    info = decode_quantization(q, [4, 2])
    assert (info.axis, info.scales, info.zero_points) == (1, [0.5, 0.75], [128, 0])

    block = (ctypes.c_uint32 * 2)(2, 4)
    q = S.Qnn_QuantizeParams_t(encodingDefinition=1, quantizationEncoding=S.QNN_QUANTIZATION_ENCODING_BLOCK)
    q.blockEncoding = S.Qnn_BlockEncoding_t(block, pairs)
    info = decode_quantization(q, [4, 4])  # ceil(4/2) * ceil(4/4) = 2 blocks
    assert (info.block_size, info.scales, info.offsets) == ([2, 4], [0.5, 0.75], [-128, 0])

    undefined = S.Qnn_QuantizeParams_t(encodingDefinition=0x7FFFFFFF, quantizationEncoding=0x7FFFFFFF)
    assert decode_quantization(undefined, [1]) is None
