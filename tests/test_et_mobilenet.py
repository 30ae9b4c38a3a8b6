"""The real MobileNetV2 (ImageNet weights) through the ExecuTorch path: 8a8w for SM8650, fully
delegated to QNN, top-1 on the sample photos equal to the float model's, SQNR recorded.

The one real-model ExecuTorch compile of `make test` (a few minutes on 2 cores): everything else
of the .pte path is tested on tiny models (test_et_compile.py, test_et_audit.py)."""
from __future__ import annotations

import pytest

from et_models import MOBILENET_V2, write


@pytest.mark.slow
def test_mobilenet_v2_8a8w_sm8650_cold_compile_is_fully_delegated_with_float_top1(tmp_path, monkeypatch):
    import torch

    import modelexport
    from modelexport.zoo.imagenet import save_sample_photos
    from modelexport.zoo.mobilenet_v2 import mobilenet_v2
    spec = write(tmp_path, "mnv2", MOBILENET_V2)
    calib = tmp_path / "calib"
    images = save_sample_photos(calib)
    monkeypatch.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path / "cold-cache"))   # a cold compile, never a cache hit
    bundle = modelexport.compile(spec, output=tmp_path / "bundle", target="SM8650", precision="8a8w",
                                 calibration=str(calib))
    m = bundle.manifest
    assert m.cache.hits == 0 and m.cache.misses == 1

    # fully delegated, as the library reports it: every node placed on QNN, one delegate call, no CPU kernel
    summary = m.placement["summary"]
    assert summary["by_runtime"] == {"QNN": summary["nodes"]} and summary["nodes"] > 100
    assert all(n["backend"] == "HTP" for n in m.placement["nodes"])
    assert {n["op_type"] for n in m.placement["nodes"]} >= {"aten.convolution.default", "aten.hardtanh.default"}
    assert m.targets == ["SM8650"] and m.htp_arch == {"SM8650": 75} and m.precision == "8a8w"
    (g,) = m.graphs
    assert g.delegate_calls == {"QnnBackend": 1} and g.kernel_calls == {}
    pte = modelexport.inspect(next(bundle.path.rglob("*.pte")))["pte"]
    assert pte["methods"][0]["delegate_calls"] == {"QnnBackend": 1} and pte["methods"][0]["kernel_calls"] == {}

    # top-1 of the compiled model on the HTP simulator equals the float model's, photo by photo:
    # measured at compile time on every photo and recorded in the manifest with the SQNR
    num = m.numerics
    assert num["passed"] and num["inputs"] == "folder" and num["samples"] == len(images)
    out = num["outputs"][0]
    assert 15 < out["sqnr_db"] < 999 and out["argmax_agreement"] == 1.0
    # and through `modelexport.run` on the bundle (one photo: each run loads the .pte on the simulator)
    with torch.no_grad():
        want = int(mobilenet_v2()(torch.from_numpy(images["coffee"])).argmax())
    assert want == 967  # coffee.png → espresso
    got = modelexport.run(bundle.path, {"x": images["coffee"]}).outputs["output_0"]
    assert int(got.argmax()) == want
