"""`verify --per-layer`: float vs fake-quant layer by layer, the first bad layer, the suggested
`--override`, and — on the real MobileNetV2 at 16a4w — that applying it raises the SQNR."""
from __future__ import annotations

import json

import pytest

from conftest import assert_clean_error, run_cli
from onnx_models import conv_relu


def _cache_env(tmp_path_factory):
    return {"MODELEXPORT_CACHE_DIR": str(tmp_path_factory.getbasetemp() / "modelexport-cache")}


def test_small_model_per_layer_recorded_in_manifest_and_report(tmp_path, cli, cli_here):
    model = conv_relu(tmp_path / "conv.onnx")
    b = tmp_path / "b"
    cli("compile", str(model), "-o", str(b), "--precision", "8a8w", "--calibration", "random", check=True)
    proc = cli("verify", str(b), "--per-layer", "--threshold-db", "10", "--json", check=True)
    rep = json.loads(proc.stdout)
    layers = rep["per_layer"][0]["layers"]
    # the quantizer folds the Relu into the Conv's output quantization: the Conv's float output has no twin
    assert [x["name"] for x in layers] == ["block.act"]
    assert all(x["sqnr_db"] > 10 for x in layers) and rep["per_layer"][0]["first_bad_layer"] is None
    m = json.loads((b / "manifest.json").read_text())
    num = m["numerics"]
    assert [x["name"] for x in num["per_layer"]] == ["block.act"] and num["per_layer_threshold_db"] == 10
    assert num["outputs"][0]["name"] == "y" and num["outputs"][0]["sqnr_db"] > 10
    html = (b / "report.html").read_text()
    assert "SQNR per layer" in html
    assert cli_here("inspect", str(b)).returncode == 0          # report.html re-sealed in the manifest
    # a threshold above every layer names the first one and suggests an override for it
    proc = cli_here("verify", str(b), "--per-layer", "--threshold-db", "199", "--json", "--min-sqnr", "0", check=True)
    pl = json.loads(proc.stdout)["per_layer"][0]
    assert pl["first_bad_layer"] == "block.act" and pl["suggested_override"] == "--override 'block\\.act=16a8w'"


def test_fp16_bundle_and_bad_override_are_clean_errors(tmp_path, cli_here):
    model = conv_relu(tmp_path / "conv.onnx")
    b = tmp_path / "b16"
    cli_here("compile", str(model), "-o", str(b), "--precision", "fp16", check=True)
    assert_clean_error(cli_here("verify", str(b), "--per-layer"), "no quantized model")
    assert_clean_error(cli_here("compile", str(model), "-o", str(tmp_path / "x"), "--calibration", "random",
                                "--override", "nothing\\.here=16a8w"), "matches no node")
    assert_clean_error(cli_here("compile", str(model), "-o", str(tmp_path / "x"), "--precision", "fp16",
                                "--override", "block=16a8w"), "needs a quantized --precision")
    assert_clean_error(cli_here("compile", str(model), "-o", str(tmp_path / "x"), "--calibration", "random",
                                "--override", "block(=16a8w"), "regular expression")
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def mnv2_16a4w(tmp_path_factory):
    from modelexport.zoo.imagenet import save_sample_photos
    from modelexport.zoo.mobilenet_v2 import export_onnx
    d = tmp_path_factory.mktemp("mnv2pl")
    model = export_onnx(d / "mobilenet_v2.onnx")
    calib = d / "calib"
    save_sample_photos(calib)
    out = d / "b4"
    run_cli("compile", str(model), "-o", str(out), "--precision", "16a4w", "--calibration", str(calib), check=True,
            env=_cache_env(tmp_path_factory))
    return {"model": model, "calib": calib, "bundle": out, "dir": d}


def test_mobilenet_16a4w_per_layer_finds_the_collapse_and_the_override_fixes_it(mnv2_16a4w, tmp_path_factory, cli_here):
    before = cli_here("verify", str(mnv2_16a4w["bundle"]), "--per-layer", "--json",
                      env=_cache_env(tmp_path_factory))
    assert before.returncode == 5                       # 16a4w MobileNetV2 collapses below its 5 dB pass mark
    rep = json.loads(before.stdout)
    pl = rep["per_layer"][0]
    assert pl["threshold_db"] == 5.0 and len(pl["layers"]) > 60
    assert pl["layers"][0]["name"] == "features.0.2" and pl["layers"][-1]["name"] == "classifier.1"
    assert pl["first_bad_layer"].startswith("features.")
    assert pl["suggested_override"] == "--override 'features\\.1\\.conv=16a8w'"
    out_before = rep["graphs"][0]["outputs"][0]["sqnr_db"]
    first_bad_before = next(x["sqnr_db"] for x in pl["layers"] if x["name"] == pl["first_bad_layer"])
    num = json.loads((mnv2_16a4w["bundle"] / "manifest.json").read_text())["numerics"]
    assert num["first_bad_layer"] == pl["first_bad_layer"] and num["suggested_override"] == pl["suggested_override"]
    # apply the suggestion
    fixed = mnv2_16a4w["dir"] / "b4_fixed"
    spec = pl["suggested_override"].split("'")[1]
    res = json.loads(cli_here("compile", str(mnv2_16a4w["model"]), "-o", str(fixed), "--precision", "16a4w",
                              "--calibration", str(mnv2_16a4w["calib"]), "--override", spec, "--json", check=True,
                              env=_cache_env(tmp_path_factory)).stdout)
    assert res["placement"]["mobilenet_v2"]["SM8650"]["cpu_fallbacks"] == []
    m = json.loads((fixed / "manifest.json").read_text())
    ov = m["parts"][0]["quantization"]["overrides"]
    assert ov[0]["regex"] == spec.rpartition("=")[0] and ov[0]["nodes"] >= 3 and ov[0]["precision"] == "16a8w"
    after = cli_here("verify", str(fixed), "--per-layer", "--json", "--min-sqnr", "0",
                     env=_cache_env(tmp_path_factory))
    assert after.returncode == 0, after.stderr
    rep2 = json.loads(after.stdout)
    at = {x["name"]: x["sqnr_db"] for x in rep2["per_layer"][0]["layers"]}
    out_after = rep2["graphs"][0]["outputs"][0]["sqnr_db"]
    # measured: first bad layer features.2.conv.2 4.4 → 10.5 dB; compiled logits 1.8 → 4.3 dB
    assert at[pl["first_bad_layer"]] > first_bad_before + 3.0
    assert out_after > out_before + 1.0


def test_per_layer_holds_a_bounded_share_of_the_values_and_finds_the_same(tmp_path, monkeypatch):
    """The layers' values go through in passes of at most VALUES_BUDGET_BYTES (a 512x416 fingerprint
    model's 1,300 layers over 3 samples were 27 GB at once, and the compile's own check was killed
    for memory): one layer a pass gives the same numbers as all at once."""
    import numpy as np

    import modelexport
    from modelexport.quant import per_layer as pl
    from onnx_models import conv_relu
    b = modelexport.compile(str(conv_relu(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="8a8w", calibration="random", use_cache=False)
    files = b.manifest.parts[0].files
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 3, 16, 16)).astype(np.float32)} for i in range(3)]
    run = lambda: pl.per_layer(b.file(files.float_model), b.file(files.quantized_model), samples, 30.0)  # noqa: E731
    whole = run()
    monkeypatch.setattr(pl, "VALUES_BUDGET_BYTES", 1)
    calls = []
    real = pl.outputs_session
    monkeypatch.setattr(pl, "outputs_session", lambda m, t: calls.append(len(t)) or real(m, t))
    apart = run()
    assert calls and set(calls) == {1} and len(calls) == 2 * len(whole.layers)
    assert [(x.name, x.sqnr_db) for x in apart.layers] == [(x.name, x.sqnr_db) for x in whole.layers]
    assert pl.passes([3, 3, 3, 9, 1], budget=6) == [[0, 1], [2], [3], [4]]
