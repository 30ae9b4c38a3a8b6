"""The seeds' own spellings (issue 21), typed as written, on the real QNN EP: compile-qnn's OUTPUT suffix
picks the format, `modelexport.qnn.QNNCompiler` returns artifact paths and its calls do not collide."""
from __future__ import annotations

import json
import os
import zipfile

import pytest
from conftest import assert_clean_error
from onnx_models import conv_relu


@pytest.fixture
def model(tmp_path):
    return conv_relu(tmp_path / "model.onnx")


def test_dlc_suffix_chooses_dlc(tmp_path, cli, cli_here, model):
    """The one `compile-qnn` run in a child process (the console entry); the rest call its entry function."""
    out = tmp_path / "model.dlc"
    proc = cli("compile-qnn", str(model), str(out))
    assert proc.returncode == 0, proc.stderr
    assert "format dlc (from the output's suffix .dlc)" in proc.stderr
    assert zipfile.is_zipfile(out)              # a real DLC is a zip container (QNN IR, libQnnIr.so)
    m = json.loads((tmp_path / "model.bundle" / "manifest.json").read_text())
    assert m["format"] == "dlc" and "libQnnIr.so" in m["dlc_note"]
    res = json.loads(cli_here("compile-qnn", str(model), str(tmp_path / "m.bin"), "--json", check=True).stdout)
    assert res["format_chosen"]["format"] == "context-binary" and (tmp_path / "m.bin").stat().st_size > 0


@pytest.mark.parametrize("args, needle", [
    (("x.dlc", "--format", "context-binary"), "names the dlc format"),
    (("x.bin", "--format", "dlc"), "names the context-binary format"),
    (("model.cpp",), "*.dlc"),
    (("x.bin", "--device", "SM8650", "--device", "SM8750"), "one target"),
])
def test_output_suffix_mistakes(tmp_path, cli_here, model, args, needle):
    out, *rest = args
    proc = cli_here("compile-qnn", str(model), str(tmp_path / out), *rest)
    assert proc.returncode == 2
    assert_clean_error(proc, needle, "fix:")
    assert not any(p.name.endswith(".bundle") for p in tmp_path.iterdir())


def test_qnn_compiler_seed_calls_in_order(tmp_path, model, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from modelexport.core.errors import InputError, OutputExistsError
    from modelexport.qnn import QNNCompiler
    compiler = QNNCompiler(backend="HTP")
    dlc_path = compiler.compile("model.onnx", output_format="dlc")
    quantized_dlc = compiler.compile("model.onnx", output_format="dlc", quantization={
        "enabled": True, "calibration_data": "random", "act_bitwidth": 8, "weights_bitwidth": 8, "per_channel": True})
    context = compiler.compile("model.onnx", output_format="context-binary", target_device="snapdragon_8_gen3")
    assert isinstance(dlc_path, str) and dlc_path.endswith(".dlc") and zipfile.is_zipfile(dlc_path)
    assert quantized_dlc.endswith(".dlc") and os.path.dirname(dlc_path) != os.path.dirname(quantized_dlc)
    assert context.endswith(".bin") and os.path.getsize(context) > 0
    assert compiler.last_bundle.manifest.targets == ["SM8650"]
    roots = {p.split(os.sep)[0] for p in (dlc_path, quantized_dlc, context)}
    assert roots == {"model_dlc_fp16_bundle", "model_dlc_8a8w_bundle", "model_context_binary_fp16_SM8650_bundle"}
    assert compiler.compile_onnx_to_dlc("model.onnx", "seed.dlc") == "seed.dlc" and zipfile.is_zipfile("seed.dlc")
    with pytest.raises(OutputExistsError, match="exists"):
        compiler.compile("model.onnx", output_format="dlc")
    with pytest.raises(InputError, match="unknown key"):
        compiler.compile("model.onnx", quantization={"act_bits": 8})


def test_default_output_names_what_was_chosen():
    from modelexport.contract.default_output import default_output
    assert str(default_output("a/model.onnx")) == "model_bundle"
    assert str(default_output("model.onnx", "context-binary", "8a8w", ["8gen3"])) == "model_context_binary_8a8w_SM8650_bundle"


def test_vtcm_sizes_parse_once():
    from modelexport.core.arguments import size_in_bytes
    from modelexport.core.errors import InputError, TargetError, UnsupportedError
    from modelexport.toolchain.htp_options import vtcm_whole_mb
    assert size_in_bytes("--vtcm-size", "524288", "B") == 524288
    assert size_in_bytes("--vtcm-mb", "0.5", "MB") == 524288 == size_in_bytes("--vtcm-mb", "512KB", "MB")
    assert vtcm_whole_mb("1048576B", ["SM8650"]) == 1 and vtcm_whole_mb(2, ["SM8650"]) == 2
    assert vtcm_whole_mb(None, ["SM8650"]) is None
    for bad in ("nan", "inf", "-1", "0", "2XB", "1.5B"):
        with pytest.raises(InputError):
            vtcm_whole_mb(bad, ["SM8650"])
    with pytest.raises(TargetError, match="SM8350's VTCM"):
        vtcm_whole_mb("8MB", ["SM8650", "SM8350"])
    with pytest.raises(UnsupportedError, match="whole MB"):
        vtcm_whole_mb("524288B", ["SM8650"])


def test_seed_vtcm_size_in_bytes(tmp_path, cli_here, model):
    import modelexport
    out = tmp_path / "v.bin"
    cli_here("compile-qnn", str(model), str(out), "--vtcm_size", "1048576", check=True)
    assert modelexport.inspect(out)["binary"]["vtcm_mb"] == 1.0      # read back from the binary
    half = cli_here("compile-qnn", str(model), str(tmp_path / "h.bin"), "--vtcm_size", "524288")
    assert half.returncode == 6
    assert_clean_error(half, "not a whole MB", "1MB (1048576 bytes)")


def test_inspect_qnn_schema(tmp_path, cli_here, model):
    out = tmp_path / "q.bin"
    cli_here("compile-qnn", str(model), str(out), "--quantize", "--calibration-data", "random", check=True)
    ours = json.loads(cli_here("inspect", str(out), "--json", check=True).stdout)["binary"]
    for target in (out, tmp_path / "q.bundle"):
        proc = cli_here("inspect", str(target), "--json", "--schema", "qnn", check=True)
        qnn = json.loads(proc.stdout)
        info = qnn["info"]
        assert info["buildId"] == ours["build_id"] and info["socModel"] == 57
        assert info["contextMetadata"]["info"]["dspArch"] == 75 and info["numGraphs"] == 1
        g = info["graphs"][0]
        seed_path = g["graphOutputs"][0]                      # seed 003: .info.graphs[0].graphOutputs[0]
        assert seed_path == g["info"]["graphOutputs"][0]      # the utility's: .info.graphs[0].info.graphOutputs[0]
        t = seed_path["info"]
        assert t["dimensions"] == ours["graphs"][0]["outputs"][0]["shape"] == [1, 8, 16, 16] and t["rank"] == 4
        assert t["dataType"] == "QNN_DATATYPE_UFIXED_POINT_8" and t["type"] == "QNN_TENSOR_TYPE_APP_READ"
        assert t["quantizeParams"]["scaleOffset"]["scale"] == ours["graphs"][0]["outputs"][0]["quantization"]["scale"]
        assert g["info"]["graphBlobInfo"]["info"]["vtcmSize"] == ours["graphs"][0]["htp"]["vtcm_bytes"]
    assert_clean_error(cli_here("inspect", str(model), "--schema", "qnn"), "holds no QNN context binary", "fix:")
    assert_clean_error(cli_here("inspect", str(out), "--schema", "xml"), "unknown --schema")
