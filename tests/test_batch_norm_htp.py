"""The HTP's quantized BatchNorm miscomputes channels whose folded offset is large (WakeHuBERT's
BatchNorm over log-mel features: its last channel came back all zeros at 16a8w). A quantized
compile writes every BatchNormalization no Conv absorbs as Mul + Add (passes/onnx/batch_norm.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelexport
from test_tf_exports import _without

C, W = 8, 32


def batch_norm_with_offsets(path) -> str:
    """x [1, 8, 32] → BatchNormalization with γ = 1, σ² = 1, μ = 0 and β from 0 to 2.5: the channel
    with β = 2.5 is the one the HTP gets wrong."""
    one = np.ones(C, np.float32)
    params = {"gamma": one, "beta": np.linspace(0, 2.5, C).astype(np.float32), "mean": np.zeros(C, np.float32),
              "var": one - 1e-5}
    node = helper.make_node("BatchNormalization", ["x", *params], ["y"], name="norm")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, W])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, W])],
                          [numpy_helper.from_array(v, k) for k, v in params.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(path))
    return str(path)


@pytest.mark.parametrize("repaired", [False, True])
def test_a_batch_norm_with_a_large_offset_holds_at_16a8w_as_mul_add(tmp_path, monkeypatch, repaired):
    if not repaired:
        _without(monkeypatch, "batch-norm-as-mul-add")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=(rng.standard_normal((4, 1, C, W)) * 2 + 3).astype(np.float32))
    b = modelexport.compile(batch_norm_with_offsets(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650",
                            precision="16a8w", calibration=str(tmp_path / "calib.npz"), use_cache=False)
    db = b.manifest.numerics["outputs"][0]["sqnr_db"]
    if repaired:
        assert db >= 40, b.manifest.numerics
        rec = next(r for r in b.manifest.parts[0].repairs if r["name"] == "batch-norm-as-mul-add")
        assert rec["nodes"] == ["norm"]
    else:
        assert db < 20, b.manifest.numerics          # the HTP's own BatchNorm: one channel wrong


def depthwise_1x1(path) -> str:
    """x [1, 8, 32] → a depthwise Conv with a 1x1 kernel (a per-channel scale) and a bias."""
    rng = np.random.default_rng(0)
    w = rng.uniform(0.5, 1.5, (C, 1, 1)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="affine", group=C, kernel_shape=[1])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, W])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, W])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.linspace(0, 2.5, C).astype(np.float32), "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(path))
    return str(path)


@pytest.mark.parametrize("repaired", [False, True])
def test_a_depthwise_1x1_conv_holds_at_16a8w_as_mul_add(tmp_path, monkeypatch, repaired):
    if not repaired:
        _without(monkeypatch, "depthwise-1x1-as-mul-add")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=(rng.standard_normal((4, 1, C, W)) * 2 + 3).astype(np.float32))
    b = modelexport.compile(depthwise_1x1(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650",
                            precision="16a8w", calibration=str(tmp_path / "calib.npz"), use_cache=False)
    db = b.manifest.numerics["outputs"][0]["sqnr_db"]
    if repaired:
        assert db >= 40, b.manifest.numerics
        rec = next(r for r in b.manifest.parts[0].repairs if r["name"] == "depthwise-1x1-as-mul-add")
        assert rec["nodes"] == ["affine"]
    else:
        assert db < 10, b.manifest.numerics          # the HTP's own depthwise 1x1 Conv: every channel wrong
