"""Models that ship already quantized in forms real PyPI models have (tests/prequantized_models.py),
compiled on the HTP simulator: each was refused, ran on the CPU or fed the calibration out-of-range
ids before its fix, and compiles from its float equivalent after it."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import modelexport
from modelexport.passes.onnx import RepairContext, apply_repairs
from modelexport.passes.onnx.dequantize import MAX_LSTM_STEPS, dequantize
from prequantized_models import (FEATURES, STEPS, composed_opsets, dynamic_quantized_conv, dynamic_quantized_lstm,
                                 float_lstm, int8_table_gather, scaled_int8_table)

TARGET = "SM8650"


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _cpu(model, feeds):
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def _compile(path, tmp_path, precision):
    return modelexport.compile(str(path), output=tmp_path / f"b_{precision}", target=TARGET, precision=precision,
                               calibration="random", use_cache=False)


def _repair(b, name: str) -> dict:
    return next(r for r in b.manifest.parts[0].repairs if r["name"] == name)


def _cpu_fallbacks(b) -> list:
    return b.manifest.placement[b.manifest.parts[0].name][TARGET]["cpu_fallbacks"]


@pytest.mark.parametrize("directions, per_channel", [(1, False), (2, False), (2, True)])
def test_dynamic_quantize_lstm_becomes_the_float_lstm_it_was_made_from(tmp_path, directions, per_channel):
    """DynamicQuantizeLSTM's W [D, in, 4H] / R [D, H, 4H] int8 (scales per direction or per channel)
    → ONNX LSTM with W [D, 4H, in] / R [D, 4H, H] float: on the CPU it agrees with the float LSTM the
    quantized one was made from, closer than the shipped contrib op does."""
    q = dynamic_quantized_lstm(tmp_path / "q.onnx", directions, per_channel)
    ref = float_lstm(tmp_path / "f.onnx", directions)
    m = onnx.load(str(q))
    rec = apply_repairs(m, RepairContext())[0]
    assert rec["name"] == "dequantize" and rec["dynamic_lstms"] == 1 and "left_quantized" not in rec
    assert [n.op_type for n in m.graph.node] == ["LSTM"]
    x = {"x": np.random.default_rng(2).standard_normal((STEPS, 1, FEATURES)).astype(np.float32)}
    want, shipped, got = _cpu(ref, x), _cpu(q, x), _cpu(m, x)
    for w, s, g in zip(want, shipped, got):
        assert _cos(w, g) > 0.9995 and _cos(w, g) >= _cos(w, s) - 1e-4, (_cos(w, g), _cos(w, s))


@pytest.mark.parametrize("precision", ["fp16", "8a8w"])
def test_dynamic_quantize_lstm_runs_on_the_htp(tmp_path, precision):
    """Before: the contrib op has no QNN op and the whole LSTM stayed on the CPU. As an ONNX LSTM the
    HTP runs it (no CPU fallback) and the compile passes its own check."""
    b = _compile(dynamic_quantized_lstm(tmp_path / "m.onnx"), tmp_path, precision)
    assert _repair(b, "dequantize")["dynamic_lstms"] == 1
    assert _cpu_fallbacks(b) == []
    assert b.manifest.numerics["passed"], b.manifest.numerics


def test_a_long_int8_lstm_stays_as_shipped_on_the_cpu_and_audit_says_why(tmp_path):
    """QNN unrolls an LSTM into one cell per step: over MAX_LSTM_STEPS steps (both directions counted)
    the compile took minutes on real models, so the int8 LSTM stays on the CPU as shipped; the record
    says so, and audit's fix for it is about the LSTM, not "give static shapes" (every shape is fixed)."""
    path = dynamic_quantized_lstm(tmp_path / "m.onnx", directions=2, steps=MAX_LSTM_STEPS // 2 + 1)
    m = onnx.load(str(path))
    rec = dequantize(m, RepairContext())
    assert rec["lstms_kept_int8"] == 1 and rec["lstm_steps"] == MAX_LSTM_STEPS + 2 and "compiled from" not in rec["note"]
    assert [n.op_type for n in m.graph.node] == ["DynamicQuantizeLSTM"]
    report = modelexport.audit(str(path), target=TARGET, precision="fp16")
    (row,) = [n for n in report.nodes if n.backend == "CPU"]
    assert row.op_type == "DynamicQuantizeLSTM" and "time steps" in row.fix and "static shapes" not in row.fix


def test_conv_integer_with_its_int32_bias_compiles_at_8a8w(tmp_path):
    """onnx.quantize's ConvInteger (ddddocr's CNN): before, calibration failed on the quantizer's own
    `'x_scale'`; folded to Conv with the float bias it compiles and passes."""
    path = dynamic_quantized_conv(tmp_path / "m.onnx")
    m = onnx.load(str(path))
    apply_repairs(m, RepairContext())
    assert [n.op_type for n in m.graph.node] == ["Conv", "Sigmoid", "Mul"]
    x = {"x": np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    assert _cos(_cpu(path, x)[0], _cpu(m, x)[0]) > 0.9999
    b = _compile(path, tmp_path, "8a8w")
    assert _repair(b, "dequantize")["dynamic_convs"] == 1
    assert b.manifest.numerics["passed"], b.manifest.numerics


def test_opset_imports_merged_by_compose_are_one_per_domain(tmp_path):
    """('', 17) and ('com.microsoft', 1) listed twice (onnx.compose; text2tashkeel's ensemble): the
    quantizer refused it (`Failed to find proper ai.onnx domain`); one entry per domain compiles."""
    b = _compile(composed_opsets(tmp_path / "m.onnx"), tmp_path, "8a8w")
    rec = _repair(b, "opset-imports")
    assert rec["domains"] == ["ai.onnx", "com.microsoft"] and rec["kept"] == {"ai.onnx": 17, "com.microsoft": 1}
    assert b.manifest.numerics["passed"], b.manifest.numerics


def test_int8_embedding_read_through_gather_then_dequantize_is_a_float_table(tmp_path):
    """Gather(uint8 table) → DequantizeLinear, and a Transpose of the uint8 rows → DequantizeLinear
    (text2tashkeel): the table is dequantized once, the reads are float, exactly the same numbers, and
    the Gather runs on the HTP."""
    path = int8_table_gather(tmp_path / "m.onnx")
    m = onnx.load(str(path))
    rec = apply_repairs(m, RepairContext())[0]
    assert rec["tables_dequantized"] == 1 and not any(n.op_type == "DequantizeLinear" for n in m.graph.node)
    ids = {"ids": np.random.default_rng(2).integers(0, 54, (1, 32)).astype(np.int64)}
    np.testing.assert_allclose(_cpu(m, ids)[0], _cpu(path, ids)[0], rtol=1e-5, atol=1e-5)
    b = _compile(path, tmp_path, "8a8w")
    assert _repair(b, "dequantize")["tables_dequantized"] == 1
    assert _cpu_fallbacks(b) == []                  # before: the uint8 Gather and its DQs ran on the CPU
    assert b.manifest.numerics["passed"], b.manifest.numerics


def test_token_ids_stay_inside_a_table_that_ships_int8(tmp_path):
    """int8 table → Cast → Mul(scale) → Gather (minilm_l6_int8's word embeddings): the table's size
    is read through the chain, so random ids stay below 54 (before: 0..99, out of bounds)."""
    from modelexport.frontends.onnx_index_inputs import index_limits
    path = scaled_int8_table(tmp_path / "m.onnx")
    assert index_limits(onnx.load(str(path))) == {"ids": 54}
    b = _compile(path, tmp_path, "8a8w")
    assert b.manifest.numerics["outputs"] and b.manifest.numerics["passed"], b.manifest.numerics


def test_dequantize_reports_only_what_it_folded(tmp_path):
    """The loader runs the repairs twice and loads the model again when the second round reports
    anything; `dequantize` reported a quantizer it could not fold on every round, and the extra load
    refused ddddocr and text2tashkeel (`Field 'shape' of 'type' is required but missing`)."""
    from onnx import TensorProto, helper
    m = helper.make_model(helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="x_QuantizeLinear")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("q", TensorProto.UINT8, [1, 4]), helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("z", TensorProto.UINT8, [])]), opset_imports=[helper.make_opsetid("", 17)])
    assert dequantize(m, RepairContext()) is None
    q = onnx.load(str(dynamic_quantized_conv(tmp_path / "m.onnx")))
    assert dequantize(q, RepairContext())["dynamic_convs"] == 1
    assert dequantize(q, RepairContext()) is None
