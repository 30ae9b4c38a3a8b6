"""`computed-weights`: a weight-normalised Conv as torch exports it (its weight g * v / ||v|| computed in
the graph, too large for onnxscript's folder) compiles quantized: the weight is computed once and
stored. Without it the QNN EP refused the Conv after its NHWC layout pass at 16a16w and the whole graph
failed (wav2vec2-base's positional Conv)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelexport
from modelexport.core.errors import ToolchainError
from modelexport.passes.onnx import RepairContext, apply_repairs
from test_tf_exports import _without

C, K, GROUPS, T = 64, 16, 4, 100


def weight_normed_conv():
    rng = np.random.default_rng(0)
    v = rng.standard_normal((C, C // GROUPS, K)).astype(np.float32)          # 16,384 values: above the folder's limit
    g = rng.uniform(0.5, 2, (C, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("ReduceL2", ["v"], ["norm"], axes=[1, 2], keepdims=1, name="node_linalg_vector_norm"),
             helper.make_node("Div", ["g", "norm"], ["gain"], name="node_div"),
             helper.make_node("Mul", ["v", "gain"], ["w"], name="node_mul"),
             helper.make_node("Conv", ["x", "w"], ["c"], group=GROUPS, kernel_shape=[K], pads=[8, 7], name="node_Conv_0"),
             helper.make_node("Relu", ["c"], ["y"], name="node_Relu_1")]
    graph = helper.make_graph(nodes, "wn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, T])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, T])],
                              [numpy_helper.from_array(v, "v"), numpy_helper.from_array(g, "g")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _run(m, x):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_the_weight_is_computed_once_with_the_same_outputs():
    m = weight_normed_conv()
    x = np.random.default_rng(1).standard_normal((1, C, T)).astype(np.float32)
    ref = _run(m, x)
    done = {r["name"]: r for r in apply_repairs(m, RepairContext(quantized=True, activation_bits=16))}
    assert done["computed-weights"]["weights"] == 1 and done["computed-weights"]["nodes"] == ["node_Conv_0"]
    assert [n.op_type for n in m.graph.node] == ["Conv", "Relu"]
    assert {t.name for t in m.graph.initializer} == {"w"}
    np.testing.assert_allclose(_run(m, x), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("repaired", [False, True])
def test_a_weight_normed_conv_compiles_at_16a16w(tmp_path, monkeypatch, repaired):
    if not repaired:
        _without(monkeypatch, "computed-weights")
    onnx.save(weight_normed_conv(), str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(2)
    calib = [{"x": rng.standard_normal((1, C, T)).astype(np.float32)} for _ in range(4)]
    compile_it = lambda: modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650",  # noqa: E731
                                             precision="16a16w", calibration=calib, use_cache=False)
    if not repaired:
        with pytest.raises(ToolchainError, match="node_Conv_0"):
            compile_it()
        return
    b = compile_it()
    assert b.manifest.numerics["passed"] and b.manifest.numerics["outputs"][0]["sqnr_db"] >= 40, b.manifest.numerics
