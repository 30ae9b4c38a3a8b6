"""A GroupNorm as exporters write it (Reshape → InstanceNormalization → Reshape → Mul → Add: torch's
dynamo exporter, every diffusion UNet) compiles at 16a16w: the HTP's InstanceNorm takes only an
unsigned scale, and ONNX Runtime's quantizer gives it int16 at 16-bit weights
(quant/onnx_qdq.unsigned_norm_scales). Found on adaptive-terrain-diffusion's consistency UNet."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelexport
from modelexport.core.errors import ToolchainError
from modelexport.quant import onnx_qdq
from onnx_models import _save

C, G, H = 64, 32, 8


def group_norm(path) -> str:
    rng = np.random.default_rng(0)
    params = {"groups": np.array([1, G, -1], np.int64), "back": np.array([1, C, H, H], np.int64),
              "ones": np.ones(G, np.float32), "zeros": np.zeros(G, np.float32),
              "gamma": rng.uniform(0.5, 1.5, (C, 1, 1)).astype(np.float32),
              "beta": rng.standard_normal((C, 1, 1)).astype(np.float32)}
    nodes = [helper.make_node("Reshape", ["x", "groups"], ["g"], name="node_Reshape_0"),
             helper.make_node("InstanceNormalization", ["g", "ones", "zeros"], ["n"], name="node_InstanceNormalization_1"),
             helper.make_node("Reshape", ["n", "back"], ["r"], name="node_Reshape_2"),
             helper.make_node("Mul", ["r", "gamma"], ["m"], name="node_Mul_3"),
             helper.make_node("Add", ["m", "beta"], ["y"], name="node_Add_4")]
    return str(_save(nodes, "gn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, H])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, H, H])],
                     [numpy_helper.from_array(v, k) for k, v in params.items()], path))


@pytest.mark.parametrize("fixed", [False, True])
def test_a_group_norm_compiles_at_16a16w_with_an_unsigned_scale(tmp_path, monkeypatch, fixed):
    if not fixed:
        monkeypatch.setattr(onnx_qdq, "unsigned_norm_scales", lambda *a: None)
    rng = np.random.default_rng(1)
    calib = [{"x": (rng.standard_normal((1, C, H, H)) * 3 + 1).astype(np.float32)} for _ in range(4)]
    compile_it = lambda **kw: modelexport.compile(group_norm(tmp_path / "m.onnx"), output=tmp_path / "b",  # noqa: E731
                                                  target="SM8650", precision="16a16w", calibration=calib,
                                                  use_cache=False, force=True, **kw)
    if not fixed:   # the refusal's fix is an fp16 island for that node, and it compiles
        with pytest.raises(ToolchainError, match="InstanceNormalization") as e:
            compile_it()
        island = "^node_InstanceNormalization_1$=fp16"
        assert f"--override '{island}'" in e.value.fix
        b = compile_it(overrides=[island])
        assert b.manifest.numerics["passed"], b.manifest.numerics["outputs"]
        return
    b = compile_it()
    assert b.manifest.numerics["passed"], b.manifest.numerics["outputs"]
    assert b.manifest.numerics["outputs"][0]["sqnr_db"] >= 40, b.manifest.numerics["outputs"]
