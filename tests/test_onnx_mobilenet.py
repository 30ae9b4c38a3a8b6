"""The real MobileNetV2 (ImageNet weights) through the whole ONNX path: 8a8w for SM8650."""
from __future__ import annotations

import json

import pytest

from conftest import run_cli


@pytest.fixture(scope="module")
def mnv2(tmp_path_factory):
    from modelexport.zoo.imagenet import save_sample_photos
    from modelexport.zoo.mobilenet_v2 import export_onnx
    d = tmp_path_factory.mktemp("mnv2")
    model = export_onnx(d / "mobilenet_v2.onnx")
    calib = d / "calib"
    images = save_sample_photos(calib)
    out = d / "bundle"
    proc = run_cli("compile", str(model), "-o", str(out), "--target", "SM8650", "--precision", "8a8w",
                   "--calibration", str(calib), "--json", check=True,
                   # module-scoped: conftest's per-test cache variable is not set yet; use the same folder
                   env={"MODELEXPORT_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "modelexport-cache")})
    return {"dir": d, "model": model, "calib": calib, "images": images, "bundle": out, "result": json.loads(proc.stdout)}


def test_every_compute_node_on_htp(mnv2):
    placement = mnv2["result"]["placement"]["mobilenet_v2"]["SM8650"]
    assert placement["cpu_fallbacks"] == [] and placement["htp_nodes"] > 150
    assert mnv2["result"]["htp_arch"] == {"SM8650": 75}
    g = mnv2["result"]["graphs"][0]
    assert g["inputs"][0]["dtype"] == "uint8" and g["inputs"][0]["encoding"]["scale"] > 0


def test_report_shows_per_node_placement(mnv2):
    from modelexport.contract import open_bundle
    nodes = open_bundle(mnv2["bundle"]).manifest.placement["nodes"]
    htp = [n for n in nodes if n["backend"] == "HTP" and n["op_type"] not in ("QuantizeLinear", "DequantizeLinear")]
    assert htp and not [n for n in nodes if n["backend"] == "CPU"]
    assert any(n["module_path"] and n["module_path"].startswith("features.") for n in htp)
    html = (mnv2["bundle"] / "report.html").read_text()
    assert f"{len(htp)}/{len(htp)} compute nodes on HTP" in html and "data:image/svg+xml;base64," in html


def test_audit_8a8w_reports_module_paths_and_no_fallback(mnv2, cli_here):
    proc = cli_here("audit", str(mnv2["model"]), "--target", "sm8650", "--precision", "8a8w", "--strict", "--json", check=True)
    rep = json.loads(proc.stdout)
    assert rep["ok"] and rep["totals"]["by_backend"].get("CPU", 0) == 0
    convs = [n for n in rep["nodes"] if n["op_type"] == "Conv"]
    assert len(convs) == 52 and all(n["backend"] == "HTP" for n in convs)
    assert any(n["module_path"] == "features.3.conv.0.0" for n in convs)
    assert rep["totals"]["htp_mac_share"] == 1.0 and rep["totals"]["total_macs"] > 290e6


def test_top1_matches_float_on_real_photos(mnv2):
    import onnxruntime as ort

    import modelexport
    ref = ort.InferenceSession(str(mnv2["model"]), providers=["CPUExecutionProvider"])
    for name, x in mnv2["images"].items():
        want = int(ref.run(None, {"image": x})[0].argmax())
        got = modelexport.run(mnv2["bundle"], {"image": x}).outputs["logits"]
        assert int(got.argmax()) == want, name
    assert want == 967  # coffee.png → espresso


def test_verify_passes_and_cache_is_reused(mnv2, cli_here, tmp_path):
    proc = cli_here("verify", str(mnv2["bundle"]), "--json", "--report", str(tmp_path / "verify.json"), check=True)
    rep = json.loads(proc.stdout)
    out = rep["graphs"][0]["outputs"][0]
    assert rep["passed"] and out["sqnr_db"] > 15 and out["argmax_agreement"] == 1.0
    assert json.loads((tmp_path / "verify.json").read_text())["passed"]
    again = cli_here("compile", str(mnv2["model"]), "-o", str(tmp_path / "again"), "--target", "SM8650", "--precision", "8a8w",
                     "--calibration", str(mnv2["calib"]), "--json", check=True)
    res = json.loads(again.stdout)
    assert res["cache"]["bundle_memo"] is True   # the same inputs: the whole bundle is copied
    sha = {f["path"]: f["sha256"] for f in mnv2["result"]["files"]}
    assert all(sha[f["path"]] == f["sha256"] for f in res["files"])
    # The same bytes at another path miss the memo (the manifest names the source) but hit both stage caches.
    moved = tmp_path / "elsewhere" / "mobilenet_v2.onnx"
    moved.parent.mkdir()
    moved.write_bytes(mnv2["model"].read_bytes())
    res = json.loads(cli_here("compile", str(moved), "-o", str(tmp_path / "moved"), "--target", "SM8650", "--precision", "8a8w",
                              "--calibration", str(mnv2["calib"]), "--json", check=True).stdout)
    assert "bundle_memo" not in res["cache"] and res["cache"]["misses"] == 0 and res["cache"]["hits"] == 2
    assert all(sha[f["path"]] == f["sha256"] for f in res["files"] if f["path"].endswith(".bin"))


def test_inspect_binary_epcontext_and_bundle(mnv2, cli_here):
    ctx_dir = mnv2["bundle"] / "mobilenet_v2" / "SM8650"
    import modelexport
    for path, kind in ((ctx_dir / "mobilenet_v2_ctx_qnn.bin", "context-binary"),
                       (ctx_dir / "mobilenet_v2_ctx.onnx", "epcontext-onnx")):
        info = modelexport.inspect(path)
        assert info["kind"] == kind
        b = info["binary"]
        assert b["soc_name"] == "SM8650" and b["htp_arch"] == "v75" and b["build_id"].startswith("v2.51")
        assert b["graphs"][0]["inputs"][0]["quantization"]["scale"] > 0
    info = json.loads(cli_here("inspect", str(mnv2["bundle"]), "--json", check=True).stdout)
    assert info["kind"] == "bundle" and info["integrity"]["ok"]


def test_seed_002_spelling(mnv2, cli_here):
    (mnv2["calib"] / "list.txt").write_text("chelsea.npy\ncoffee.npy\n")
    out = mnv2["dir"] / "model_ctx.bin"
    cli_here("compile-qnn", str(mnv2["model"]), str(out), "--quantize", "--calibration-data", str(mnv2["calib"] / "list.txt"),
             "--act-bitwidth", "8", "--weights-bitwidth", "8", "--format", "context-binary", "--backend", "HTP",
             "--device", "Snapdragon 8 Gen 3", check=True)
    import modelexport
    assert modelexport.inspect(out)["binary"]["soc_name"] == "SM8650"
    assert (mnv2["dir"] / "model_ctx.bundle" / "manifest.json").is_file()
