"""Per-channel affine ops the HTP computes wrongly when quantized, written as Mul + Add:

- its quantized BatchNorm miscomputes channels whose folded offset is large (WakeHuBERT's BatchNorm
  over log-mel features: its last channel came back all zeros at 16a8w): every BatchNormalization no
  Conv absorbs (passes/onnx/batch_norm.py);
- a depthwise Conv with a 1x1 kernel is wrong in every channel at 16-bit activations
  (passes/onnx/depthwise_1x1.py)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelexport
from test_tf_exports import _without

C, W = 8, 32
OFFSETS = np.linspace(0, 2.5, C).astype(np.float32)


def _one_node(path, node, params: dict) -> str:
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, W])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, W])],
                          [numpy_helper.from_array(v, k) for k, v in params.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(path))
    return str(path)


def batch_norm_with_offsets(path) -> str:
    """γ = 1, σ² = 1, μ = 0 and β from 0 to 2.5: the channel with β = 2.5 is the one the HTP gets wrong."""
    one = np.ones(C, np.float32)
    params = {"gamma": one, "beta": OFFSETS, "mean": np.zeros(C, np.float32), "var": one - 1e-5}
    return _one_node(path, helper.make_node("BatchNormalization", ["x", *params], ["y"], name="norm"), params)


def depthwise_1x1(path) -> str:
    """A per-channel scale from 0.5 to 1.5 and the same offsets as a bias."""
    w = np.random.default_rng(0).uniform(0.5, 1.5, (C, 1, 1)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="affine", group=C, kernel_shape=[1])
    return _one_node(path, node, {"w": w, "b": OFFSETS})


@pytest.mark.parametrize("repaired", [False, True])
@pytest.mark.parametrize(("make", "repair", "node", "broken_below"), [
    (batch_norm_with_offsets, "batch-norm-as-mul-add", "norm", 20),        # one channel wrong
    (depthwise_1x1, "depthwise-1x1-as-mul-add", "affine", 10),            # every channel wrong
])
def test_a_per_channel_affine_holds_at_16a8w_as_mul_add(tmp_path, monkeypatch, repaired, make, repair, node, broken_below):
    if not repaired:
        _without(monkeypatch, repair)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "calib.npz", x=(rng.standard_normal((4, 1, C, W)) * 2 + 3).astype(np.float32))
    b = modelexport.compile(make(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650",
                            precision="16a8w", calibration=str(tmp_path / "calib.npz"), use_cache=False)
    db = b.manifest.numerics["outputs"][0]["sqnr_db"]
    if repaired:
        assert db >= 40, b.manifest.numerics
        assert next(r for r in b.manifest.parts[0].repairs if r["name"] == repair)["nodes"] == [node]
    else:
        assert db < broken_below, b.manifest.numerics
