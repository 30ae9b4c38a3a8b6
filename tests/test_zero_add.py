"""`add-zero` (passes/onnx/zero_add.py): Add(x, 0) and Sub(x, 0) go before quantization. With a
ReLU after it, the quantizer folds the ReLU into the Add's output encoding and the HTP, dropping the
Add, keeps x's encoding: a GroupNorm or BatchNorm with a zero shift followed by a ReLU (every model
with fresh weights; BiT-50's blocks) computes garbage at every quantized precision."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelexport
from modelexport.passes.onnx import RepairContext
from modelexport.passes.onnx.zero_add import drop_zero_adds
from onnx_models import _save

C, H = 16, 8


def _scaled_shift_relu(path, shift: np.ndarray, op: str = "Add", zero_first: bool = False, out_shape=None):
    gamma = np.random.default_rng(0).uniform(0.5, 1.5, (C, 1, 1)).astype(np.float32)
    ins = ["shift", "m"] if zero_first else ["m", "shift"]
    nodes = [helper.make_node("Mul", ["x", "gamma"], ["m"], name="scale"),
             helper.make_node(op, ins, ["a"], name="shift_node"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    return str(_save(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, H, H])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape or [1, C, H, H])],
                     [numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(shift, "shift")], path))


def _repaired(path) -> tuple[onnx.ModelProto, dict | None]:
    m = onnx.load(path)
    return m, drop_zero_adds(m, RepairContext(quantized=True))


@pytest.mark.parametrize("op,zero_first", [("Add", False), ("Add", True), ("Sub", False)])
def test_an_added_zero_goes_and_the_model_computes_the_same(tmp_path, op, zero_first):
    path = _scaled_shift_relu(tmp_path / "m.onnx", np.zeros((C, 1, 1), np.float32), op, zero_first)
    m, record = _repaired(path)
    assert record == {"nodes": ["shift_node"], "count": 1}
    assert [n.op_type for n in m.graph.node] == ["Mul", "Relu"]
    x = {"x": np.random.default_rng(1).standard_normal((1, C, H, H)).astype(np.float32)}
    ref, got = (ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, x)[0]  # noqa: TID251
                for p in (path, m.SerializeToString()))
    np.testing.assert_array_equal(got, ref)


_KEPT = {  # case → (shift, op, zero first, output shape)
    "zero minus x": (np.zeros((C, 1, 1), np.float32), "Sub", True, None),
    "widening zeros": (np.zeros((2, C, 1, 1), np.float32), "Add", False, [2, C, H, H]),
    "a nonzero shift": (np.full((C, 1, 1), 1e-6, np.float32), "Add", False, None),
}


@pytest.mark.parametrize("case", list(_KEPT) + ["integer zeros"])
def test_what_is_not_an_identity_stays(tmp_path, case):
    shift, op, zero_first, out_shape = _KEPT.get(case, _KEPT["a nonzero shift"])
    m = onnx.load(_scaled_shift_relu(tmp_path / "m.onnx", shift, op, zero_first, out_shape))
    if case == "integer zeros":   # not a float constant: nothing the quantizer would see
        m.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.zeros((C, 1, 1), np.int64), "shift"))
    assert drop_zero_adds(m, RepairContext(quantized=True)) is None
    assert len(m.graph.node) == 3


@pytest.mark.parametrize("repaired", [False, True])
def test_a_zero_shift_before_a_relu_holds_on_the_htp(tmp_path, monkeypatch, repaired):
    """Measured at 8a8w: −8 dB with the Add, about 37 dB without it."""
    if not repaired:
        import modelexport.passes.onnx as repairs
        every = repairs.all_repairs
        monkeypatch.setattr(repairs, "all_repairs", lambda: [r for r in every() if r.name != "add-zero"])
    rng = np.random.default_rng(2)
    calib = [{"x": rng.standard_normal((1, C, H, H)).astype(np.float32)} for _ in range(4)]
    b = modelexport.compile(_scaled_shift_relu(tmp_path / "m.onnx", np.zeros((C, 1, 1), np.float32)),
                            output=tmp_path / "b", target="SM8650", precision="8a8w", calibration=calib, use_cache=False)
    worst = min(o["sqnr_db"] for o in b.manifest.numerics["outputs"])
    assert b.manifest.numerics["passed"] is repaired, worst
    assert (worst >= 30) if repaired else (worst < 10), worst
