"""A node the QNN EP refuses (Det: no QNN op), multiple targets, and the HTP knobs — small models."""
from __future__ import annotations

import json

from conftest import assert_clean_error
from onnx_models import conv_det, conv_relu


def test_det_falls_back_with_reason_and_strict_fails(tmp_path, cli):
    model = conv_det(tmp_path / "conv_det.onnx")
    strict = cli("audit", str(model), "--target", "SM8650", "--strict", "--json")
    assert strict.returncode == 3
    assert_clean_error(strict, "--strict", "Det")
    rep = json.loads(strict.stdout)
    nodes = {n["name"]: n for n in rep["nodes"]}
    det = nodes["/head/det/Det"]
    assert det["backend"] == "CPU" and "not supported by QNN EP" in det["reason"] and "determinant" in det["fix"]
    assert det["module_path"] == "head.det"
    assert nodes["/features/conv/Conv"]["backend"] == "HTP" and nodes["/features/conv/Conv"]["macs"] == 4 * 8 * 8 * 27
    out = tmp_path / "bundle"
    proc = cli("compile", str(model), "-o", str(out), "--precision", "fp16", "--strict")
    assert_clean_error(proc, "fell back", "/head/det/Det")
    assert not out.exists()


def test_fallback_bundle_records_cpu_nodes(tmp_path, cli_here):
    model = conv_det(tmp_path / "conv_det.onnx")
    res = json.loads(cli_here("compile", str(model), "-o", str(tmp_path / "b"), "--precision", "fp16", "--json", check=True).stdout)
    fb = res["placement"]["conv_det"]["SM8650"]["cpu_fallbacks"]
    assert {"name": "/head/det/Det", "op_type": "Det"} in fb


def test_multi_target_binaries_differ_and_name_their_arch(tmp_path, cli_here):
    """Targets comma-separated (`-t SM8650,8elite`: code and marketing name); the repeated form is
    test_interrupt's."""
    model = conv_relu(tmp_path / "conv.onnx")
    import modelexport
    res = json.loads(cli_here("compile", str(model), "-o", str(tmp_path / "multi"), "-t", "SM8650, 8elite",
                              "--calibration", "random", "--vtcm-mb", "2", "--optimization-level", "2",
                              "--json", check=True).stdout)
    assert res["htp_arch"] == {"SM8650": 75, "SM8750": 79}
    bins = {f["path"]: f["sha256"] for f in res["files"] if f["path"].endswith(".bin")}
    assert len(bins) == 2 and len(set(bins.values())) == 2
    for g in res["graphs"]:
        info = modelexport.inspect(tmp_path / "multi" / g["file"])["binary"]
        assert info["soc_name"] == g["target"] and info["dsp_arch"] == g["htp_arch"]
        assert info["vtcm_mb"] == 2.0 and info["graphs"][0]["htp"]["optimization_level"] == 2
    m = json.loads((tmp_path / "multi" / "manifest.json").read_text())
    assert m["calibration"]["conv"]["representative"] is False
    assert m["options"]["provider_options"]["SM8750"]["vtcm_mb"] == "2"
    run = json.loads(cli_here("run", str(tmp_path / "multi"), "--target", "SM8750", "--random", "--perf-profile", "burst",
                              "-o", str(tmp_path / "outs"), "--json", check=True).stdout)
    assert run["outputs"]["y"]["shape"] == [1, 8, 16, 16] and (tmp_path / "outs" / "y.npy").is_file()


def test_pipeline_file_and_dlc(tmp_path, cli_here):
    conv_relu(tmp_path / "enc.onnx")
    conv_relu(tmp_path / "emb.onnx", channels=4)
    (tmp_path / "pipe.yaml").write_text(
        "targets: [SM8650]\nparts:\n  - {name: encoder, model: enc.onnx, precision: 8a8w, calibration: random}\n"
        "  - {name: embedder, model: emb.onnx, precision: fp16}\n")
    res = json.loads(cli_here("compile", str(tmp_path / "pipe.yaml"), "-o", str(tmp_path / "pipe"), "--json", check=True).stdout)
    assert res["precision"] == "mixed" and {g["part"] for g in res["graphs"]} == {"encoder", "embedder"}
    ver = json.loads(cli_here("verify", str(tmp_path / "pipe"), "--json", check=True).stdout)
    assert ver["passed"] and len(ver["graphs"]) == 2
    dlc = json.loads(cli_here("compile", str(tmp_path / "enc.onnx"), "-o", str(tmp_path / "dlc"), "--format", "dlc",
                              "--calibration", "random", "--json", check=True).stdout)
    assert dlc["format"] == "dlc" and any(f["path"].endswith(".dlc") and f["size"] > 0 for f in dlc["files"])


def test_strict_passes_a_model_fully_on_the_htp_at_8a8w(tmp_path, cli_here):
    """The layout transformer replaces a conv's output DequantizeLinear by a copy named
    DequantizeLinear_token_<n> (kept on the CPU as graph-output dequantization): not a fallback."""
    model = conv_relu(tmp_path / "conv.onnx")
    res = json.loads(cli_here("compile", str(model), "-o", str(tmp_path / "b"), "--precision", "8a8w",
                              "--calibration", "random", "--strict", "--json", check=True).stdout)
    where = res["placement"]["conv"]["SM8650"]
    assert where["cpu_fallbacks"] == [] and where["htp_nodes"] > 0 and where["cpu_io_quantization"] >= 1


def test_audit_lists_nodes_off_the_htp_and_folded_ones_only_with_all(tmp_path, cli_here):
    """A Conv's bias Add that ONNX Runtime folds into it is no node for the user to act on: the default
    table leaves it out (the summary counts it), --all lists it."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((1, 4, 1, 1)).astype(np.float32), "bias")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "bias"], ["a"], name="bias_add"),
             helper.make_node("Det", ["a"], ["y"], name="det")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.save(m, str(tmp_path / "m.onnx"))
    data = json.loads(cli_here("audit", str(tmp_path / "m.onnx"), "-t", "SM8650", "--json", check=True).stdout)
    backend = {n["name"]: n["backend"] for n in data["nodes"]}
    assert backend["det"] == "CPU" and backend["bias_add"] == "folded"
    table = cli_here("audit", str(tmp_path / "m.onnx"), "-t", "SM8650").stdout
    assert "det" in table and "bias_add" not in table and "folded by the optimizer" in table
    assert "bias_add" in cli_here("audit", str(tmp_path / "m.onnx"), "-t", "SM8650", "--all").stdout
