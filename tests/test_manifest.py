"""The manifest's typed sections: schema-1 bundles (the old `extra` layout) still open and read the same,
and a schema-2 manifest survives write → read unchanged."""
import json

import numpy as np
import pytest

from modelexport.contract import BundleWriter, open_bundle
from modelexport.contract.manifest import (SCHEMA_VERSION, CacheInfo, DecoderShape, Delegate, GenieCheck, GraphSpec,
                                           HostTwin, LlmSection, Manifest, MemoryEstimate, PartEntry, PartFiles,
                                           QairtInfo, QnnGraph, TensorSpec, Timings, WeightSharing)
from modelexport.core.errors import InputError
from modelexport.core.files import sha256_file
from modelexport.core.vocab import BundleKind, Format, GraphKind, Role

IO = [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32"}]
SPEC = {"n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "hidden_size": 64, "vocab_size": 256,
        "max_seq_len": 64}


def _schema1_model() -> dict:
    """What modelexport wrote for an ONNX bundle before schema 2 (by hand, key for key)."""
    return {
        "schema_version": 1, "kind": "model", "created_by": "modelexport",
        "source": {"path": "/m/conv.onnx", "sha256": "ab" * 32, "format": "onnx"},
        "targets": ["SM8650"], "htp_arch": {"SM8650": 75}, "precision": "8a8w", "format": "context-binary",
        "qairt_build": "v2.51.0.260929181845",
        "graphs": [{"name": "QNNExecutionProvider_QNN_1_0", "file": "conv/SM8650/conv_qnn.bin", "kind": "context-binary",
                    "inputs": IO, "outputs": [{"name": "y", "shape": [1, 8, 16, 16], "dtype": "float32"}],
                    "target": "SM8650", "htp_arch": 75,
                    "extra": {"part": "conv", "epcontext_model": "conv/SM8650/conv_ctx.onnx", "soc_model": 57,
                              "vtcm_mb": 8.0, "optimization_level": 3, "spill_fill_bytes": 0, "const_bytes": None,
                              "onnx_inputs": IO, "onnx_outputs": [{"name": "y", "shape": [1, 8, 16, 16], "dtype": "float32"}]}}],
        "files": [],
        "extra": {
            "parts": [{"name": "conv", "source": None, "sha256": "ab" * 32, "precision": "8a8w", "inputs": IO,
                       "outputs": [{"name": "y", "shape": [1, 8, 16, 16], "dtype": "float32"}], "fixed_shapes": {},
                       "quantization": {"overrides": []},
                       "files": {"float_model": "conv/model.onnx", "quantized_model": "conv/model.qdq.onnx",
                                 "verify_inputs": "conv/verify_inputs.npz"},
                       "cache_hit": {"quantize": False, "SM8650": True}}],
            "timings": {"conv.quantize_s": 1.5, "conv.SM8650.compile_s": 2.0, "total_s": 4.25},
            "cache": {"enabled": False, "root": None, "hits": 1, "misses": 1},
            "qairt": {"source": "onnxruntime-qnn wheel", "version": "2.51.0", "core_api": "2.40.0", "htp_api": "5.51.0"},
        },
    }


def _schema1_llm() -> dict:
    twin = {"epcontext_model": "SM8650/host/token_ar1_cl64_1_of_1_ctx.onnx", "context_binary": "SM8650/host/t.bin",
            "qnn_graph_name": "QNNExecutionProvider_QNN_7_1_0", "const_bytes": 900, "bytes": 1000}
    return {
        "schema_version": 1, "kind": "llm", "format": "context-binary", "targets": ["SM8650"], "precision": "16a4w",
        "graphs": [{"name": "token_ar1_cl64_1_of_1", "file": "SM8650/llama_16a4w_cl64_1_of_1.bin", "kind": "context-binary",
                    "target": "SM8650", "htp_arch": 75,
                    "extra": {"part": "token_ar1_cl64_1_of_1", "n_tokens": 1, "part_index": 1, "n_parts": 1,
                              "layers": [0, 2], "qnn_graph_name": "QNNExecutionProvider_QNN_7_1_0",
                              "epcontext_model": "SM8650/token_ar1_cl64_1_of_1_ctx.onnx", "shared": False,
                              "const_bytes": 800, "shared_weights_bytes": None, "host_twin": twin,
                              "quantized_model": "qdq/token_ar1_cl64_1_of_1.onnx",
                              "memory_estimate": {"weights_bytes": 10, "io_bytes": 2, "activation_bytes": 3,
                                                  "total_bytes": 15, "total_mb": 0.0}}}],
        "files": [{"path": "tokenizer/tokenizer.json", "size": 3, "sha256": "cd" * 32, "role": "tokenizer"}],
        "extra": {
            "parameters": 123456,
            "llm": {"architecture": "llama", "spec": SPEC, "variants": [1], "max_seq_len": 64, "n_parts": 1,
                    "parts": [[0, 2]], "split_note": None, "weight_bytes_per_token": 5000, "device_bytes": 6000,
                    "bytes_per_parameter": 0.0486, "bos_id": 1, "eos_ids": [2], "rope_theta": 10000.0,
                    "graph_naming": "{type}_ar{N}_cl{C}_{i}_of_{n}", "weight_sharing": {
                        "SM8650/1": {"file": "SM8650/llama_16a4w_cl64_1_of_1.bin", "graphs": ["QNNExecutionProvider_QNN_7_1_0"],
                                     "shared_weights_bytes": [0], "const_bytes": {"QNNExecutionProvider_QNN_7_1_0": 800},
                                     "bytes": 6000, "unshared_twins_bytes": 1000, "saved_bytes": -5000,
                                     "weights_stored_once": False, "note": "read back"}},
                    "genie": {"SM8650": {"file": "genie_config.json", "accepted": True, "status": 0, "library": "/x/libGenie.so"}},
                    "quantization": {"token_ar1_cl64_1_of_1": {"modules": {"lm_head": 8}}}, "memory_limit_mb": 2048.0},
            "timings": {"load_s": 0.5, "quantize_stage_s": 3.0, "total_s": 9.0},
            "cache": {"enabled": True, "quantize_hit": True, "compile_hits": 2, "compile_jobs": 2},
        },
    }


def test_schema1_model_manifest_reads_through_the_typed_fields():
    m = Manifest.model_validate(_schema1_model())
    assert m.schema_version == SCHEMA_VERSION == 2
    assert m.kind == BundleKind.MODEL and m.format == Format.CONTEXT_BINARY
    (p,) = m.parts
    assert m.part("conv") is p and m.part("nope") is None
    assert p.precision == "8a8w" and p.source is None and p.inputs[0].shape == [1, 3, 16, 16]
    assert p.files == PartFiles(float_model="conv/model.onnx", quantized_model="conv/model.qdq.onnx",
                                verify_inputs="conv/verify_inputs.npz")
    assert p.cache_hit == {"quantize": False, "SM8650": True} and p.quantization == {"overrides": []}
    (g,) = m.graphs
    assert g.kind == GraphKind.CONTEXT_BINARY and g.part == "conv" and g.soc_model == 57 and g.vtcm_mb == 8.0
    assert g.epcontext_model == "conv/SM8650/conv_ctx.onnx" and g.host_twin is None and g.const_bytes is None
    assert [t.name for t in g.onnx_inputs] == ["x"] and [t.name for t in g.onnx_outputs] == ["y"]
    assert m.timings.total_s == 4.25 and m.timings.model_extra["conv.SM8650.compile_s"] == 2.0
    assert m.cache == CacheInfo(enabled=False, root=None, hits=1, misses=1)
    assert m.qairt.version == "2.51.0" and m.llm is None and m.parameters is None
    # written back as schema 2: the old `extra` is gone, the None the writer recorded stays
    out = json.loads(m.to_json())
    assert "extra" not in out and "extra" not in out["graphs"][0] and out["schema_version"] == 2
    assert out["cache"] == {"enabled": False, "root": None, "hits": 1, "misses": 1}
    assert out["parts"][0]["source"] is None and out["graphs"][0]["const_bytes"] is None
    assert list(out["timings"]) == ["conv.quantize_s", "conv.SM8650.compile_s", "total_s"]   # as written
    assert Manifest.model_validate(out) == m


def test_schema1_llm_manifest_reads_through_the_typed_fields():
    m = Manifest.model_validate(_schema1_llm())
    assert m.kind == BundleKind.LLM and m.parameters == 123456
    llm = m.llm
    assert llm.spec == DecoderShape(**SPEC) and llm.variants == [1] and llm.max_seq_len == 64
    assert llm.weight_bytes_per_token == 5000 and llm.bos_id == 1 and llm.eos_ids == [2] and llm.split_note is None
    assert llm.weight_sharing["SM8650/1"].bytes == 6000 and llm.genie["SM8650"].accepted
    assert llm.quantization["token_ar1_cl64_1_of_1"]["modules"] == {"lm_head": 8}
    (g,) = m.graphs
    assert (g.part, g.n_tokens, g.part_index, g.n_parts, g.layers) == ("token_ar1_cl64_1_of_1", 1, 1, 1, [0, 2])
    assert g.host_twin.epcontext_model == "SM8650/host/token_ar1_cl64_1_of_1_ctx.onnx" and g.host_twin.const_bytes == 900
    assert g.quantized_model == "qdq/token_ar1_cl64_1_of_1.onnx" and g.memory_estimate.total_bytes == 15
    assert g.shared is False and g.shared_weights_bytes is None
    assert m.cache.quantize_hit and m.cache.compile_hits == 2 and m.timings.total_s == 9.0
    assert m.files[0].role == Role.TOKENIZER
    out = json.loads(m.to_json())
    assert out["llm"]["split_note"] is None and "root" not in out["cache"]   # set to None: kept; never set: left out
    assert Manifest.model_validate(out) == m


def test_schema1_bundle_opens_and_its_readers_find_the_files(tmp_path):
    from modelexport.backends.ort_qnn.run import select_graphs
    from modelexport.backends.ort_qnn.verify import stored_samples
    b = tmp_path / "old"
    (b / "conv").mkdir(parents=True)
    with open(b / "conv" / "verify_inputs.npz", "wb") as f:
        np.savez(f, x__0=np.ones((1, 3, 16, 16), np.float32), x__1=np.zeros((1, 3, 16, 16), np.float32))
    data = _schema1_model()
    data["files"] = [{"path": "conv/verify_inputs.npz", "size": (b / "conv" / "verify_inputs.npz").stat().st_size,
                      "sha256": sha256_file(b / "conv" / "verify_inputs.npz"), "role": "verify-inputs"}]
    (b / "manifest.json").write_text(json.dumps(data))
    bundle = open_bundle(b)
    (cg,) = select_graphs(bundle)
    assert cg.part == "conv" and cg.target == "SM8650" and cg.precision == "8a8w"
    assert cg.epcontext == b / "conv" / "SM8650" / "conv_ctx.onnx"
    samples = stored_samples(bundle, "conv")
    assert len(samples) == 2 and samples[0]["x"].sum() == 3 * 16 * 16


def test_newer_schema_is_refused_by_its_number(tmp_path):
    b = tmp_path / "future"
    b.mkdir()
    (b / "manifest.json").write_text(json.dumps({"schema_version": SCHEMA_VERSION + 1, "format": "onnx-next"}))
    with pytest.raises(InputError, match="newer"):
        open_bundle(b)


def test_round_trip_every_section(tmp_path):
    io = [TensorSpec(name="x", shape=[1, 4], dtype="float32")]
    with BundleWriter(tmp_path / "b") as w:
        w.path("p/model.onnx", role=Role.FLOAT_MODEL).write_bytes(b"float")
        w.path("p/SM8650/p.pte", role=Role.PTE).write_bytes(b"pte")
        m = w.manifest
        m.kind, m.format, m.targets, m.precision = BundleKind.MODEL, Format.PTE, ["SM8650"], "8a8w"
        m.parts.append(PartEntry(name="p", source=None, sha256="ef" * 32, precision="8a8w", inputs=io,
                                 files=PartFiles(float_model="p/model.onnx"), cache_hit={"SM8650": False},
                                 rewrites=[{"name": "r", "nodes": 1}]))
        m.graphs.append(GraphSpec(
            name="forward", file="p/SM8650/p.pte", kind=GraphKind.PTE_METHOD, target="SM8650", htp_arch=75, inputs=io,
            part="p", delegates=[Delegate(backend_id="QnnBackend", location="segment", offset=16384, size=100, alignment=16384)],
            delegate_calls={"QnnBackend": 1}, kernel_calls={},
            qnn_graphs=[QnnGraph(method="forward", graph="g", inputs=io, outputs=io, vtcm_mb=None, const_bytes=12)]))
        m.graphs.append(GraphSpec(
            name="token_ar1_cl64_1_of_1", kind=GraphKind.CONTEXT_BINARY, part="token_ar1_cl64_1_of_1", n_tokens=1,
            part_index=1, n_parts=1, layers=[0, 2], qnn_graph_name=None, shared=True, const_bytes=None,
            host_twin=HostTwin(epcontext_model="a.onnx", context_binary="a.bin", qnn_graph_name="q", const_bytes=None, bytes=3),
            quantized_model="qdq/a.onnx",
            memory_estimate=MemoryEstimate(weights_bytes=1, io_bytes=2, activation_bytes=3, total_bytes=6, total_mb=0.0)))
        m.llm = LlmSection(architecture="llama", spec=DecoderShape(**SPEC), variants=[1, 4], max_seq_len=64, n_parts=1,
                           parts=[[0, 2]], split_note=None, weight_bytes_per_token=10, device_bytes=12, bos_id=None,
                           eos_ids=[2], rope_theta=1e4,
                           weight_sharing={"SM8650/1": WeightSharing(file="a.bin", graphs=["q"], shared_weights_bytes=[5],
                                                                      const_bytes={"q": None}, bytes=9, unshared_twins_bytes=10,
                                                                      saved_bytes=1, weights_stored_once=True)},
                           genie={"SM8650": GenieCheck(file="genie_config.json", accepted=True, status=0)},
                           quantization={"token_ar1_cl64_1_of_1": {"modules": {"lm_head": 8}}}, memory_limit_mb=0.5)
        m.parameters = 42
        m.timings = Timings.model_validate({"p.SM8650": {"lower_s": 1.0}, "p.prepare": {"export_s": 0.5}, "total_s": 2.0})
        m.cache = CacheInfo(enabled=True, root=None, hits=0, misses=1)
        m.qairt = QairtInfo(source="wheel", build="v2.51", pairing="executorch ↔ QAIRT")
        m.dlc_note = "a note"
        written = m
    read = open_bundle(tmp_path / "b").manifest
    assert read == written
    assert json.loads(read.to_json()) == json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert {f.path: f.role for f in read.files} == {"p/model.onnx": Role.FLOAT_MODEL, "p/SM8650/p.pte": Role.PTE,
                                                    "report.html": Role.REPORT}


def test_vocabularies_refuse_unknown_words(tmp_path):
    with pytest.raises(ValueError):
        BundleWriter(tmp_path / "b").path("x.bin", role="cpu-pte")
    bad = _schema1_model() | {"format": "onnx"}
    with pytest.raises(ValueError):
        Manifest.model_validate(bad)
