"""`--override` on the ONNX path: a node given 16-bit activations inside an 8-bit graph.

ONNX Runtime's quantizer converts a tensor between types only where an override asks it to. Given
16 bits on a Conv's output alone, the 8-bit Mul after it read one 16-bit and one 8-bit input, a
node the QNN EP cannot build as one quantized op: it ran in float with its DequantizeLinear and
QuantizeLinear as separate HTP ops (ppocr_det, 8a8w with its Convs at 16a8w: 2.2 G simulator cycles
against 0.12 G for 8a8w). The overrides now convert both ways, so every op reads one type.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelexport
from modelexport.quant import onnx_overrides


def _conv_mul_conv(path):
    rng = np.random.default_rng(0)
    arr = lambda a, n: numpy_helper.from_array(a.astype(np.float32), n)  # noqa: E731
    inits = [arr(rng.standard_normal((8, 3, 3, 3)) * 0.3, "w1"), arr(rng.standard_normal(8) * 0.1, "b1"),
             arr(np.array(1.7), "k"), arr(rng.standard_normal((8, 8, 1, 1)) * 0.3, "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="stem.conv", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c1", "k"], ["m"], name="stem.scale"),
             helper.make_node("Conv", ["m", "w2"], ["c2"], name="head.conv"),
             helper.make_node("Relu", ["c2"], ["y"], name="head.relu")]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], inits),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def _mixed_ops(qdq_path) -> list[str]:
    """Ops (other than Q/DQ) whose inputs come from DequantizeLinears of different types (a Conv's weight and
    bias aside)."""
    q = onnx.load(str(qdq_path))
    prod = {o: n for n in q.graph.node for o in n.output}
    inits = {t.name: t for t in q.graph.initializer}
    mixed = []
    for n in q.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            continue
        ins = n.input[:1] if n.op_type in onnx_overrides._OWN_PARAMS else n.input   # not weights, bias
        dqs = [prod[t] for t in ins if t in prod and prod[t].op_type == "DequantizeLinear"]
        types = {inits[d.input[2]].data_type for d in dqs if len(d.input) > 2 and d.input[2] in inits}
        if len(types) > 1:
            mixed.append(n.name)
    return mixed


@pytest.mark.parametrize("converted", [True, False])
def test_a_16_bit_override_inside_an_8_bit_graph_converts_both_ways(tmp_path, monkeypatch, converted):
    if not converted:
        monkeypatch.setattr(onnx_overrides, "_convert_outputs", lambda *a: None)
    _conv_mul_conv(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="8a8w",
                            calibration=calib, overrides=["stem\\.conv=16a8w"], use_cache=False)
    mixed = _mixed_ops(next((tmp_path / "b").rglob("model.qdq.onnx")))
    if converted:
        assert mixed == []
        assert b.manifest.numerics["passed"], b.manifest.numerics["outputs"]
    else:
        assert mixed == ["stem.scale"]


def test_a_promoted_prelu_takes_its_slope_at_its_own_width(tmp_path):
    """A PRelu promoted to 16 bits read its slope at the default 8 bits: mixed inputs, a float op."""
    rng = np.random.default_rng(0)
    arr = lambda a, n: numpy_helper.from_array(a.astype(np.float32), n)  # noqa: E731
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("PRelu", ["c", "slope"], ["p"], name="act"),
             helper.make_node("Conv", ["p", "w2"], ["y"], name="head")]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
                                            [arr(rng.standard_normal((8, 3, 3, 3)) * 0.3, "w"),
                                             arr(rng.uniform(0.1, 0.3, (8, 1, 1)), "slope"),
                                             arr(rng.standard_normal((8, 8, 1, 1)) * 0.3, "w2")]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    calib = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="8a8w",
                            calibration=calib, overrides=["^act$=16a8w"], use_cache=False)
    assert _mixed_ops(next((tmp_path / "b").rglob("model.qdq.onnx"))) == []
    assert b.manifest.numerics["passed"], b.manifest.numerics["outputs"]


def test_a_promoted_layer_norm_keeps_its_scale_and_bias_types(tmp_path):
    """A LayerNorm promoted to 16 bits keeps its scale at the weight width and its bias int32, as the
    quantizer types them in a 16a8w graph: given 16-bit scale and bias, the HTP ran it in float."""
    rng = np.random.default_rng(0)
    arr = lambda a, n: numpy_helper.from_array(a.astype(np.float32), n)  # noqa: E731
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="proj"),
             helper.make_node("LayerNormalization", ["a", "g", "b"], ["n"], name="norm", axis=-1),
             helper.make_node("MatMul", ["n", "w2"], ["y"], name="out")]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 32])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32])],
                                            [arr(rng.standard_normal((32, 32)) * 0.2, "w1"), arr(rng.uniform(0.5, 1.5, 32), "g"),
                                             arr(rng.standard_normal(32) * 0.1, "b"), arr(rng.standard_normal((32, 32)) * 0.2, "w2")]),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "m.onnx"))
    calib = [{"x": rng.standard_normal((1, 16, 32)).astype(np.float32)} for _ in range(4)]
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="8a8w",
                            calibration=calib, overrides=["^norm$=16a8w"], use_cache=False)
    q = onnx.load(str(next((tmp_path / "b").rglob("model.qdq.onnx"))))
    prod = {o: n for n in q.graph.node for o in n.output}
    inits = {t.name: t.data_type for t in q.graph.initializer}
    norm = next(n for n in q.graph.node if n.op_type == "LayerNormalization")
    types = [inits[prod[t].input[2] if len(prod[t].input) > 2 else prod[t].input[0]] for t in norm.input]
    assert types == [TensorProto.UINT16, TensorProto.UINT8, TensorProto.INT32]
    assert b.manifest.numerics["passed"], b.manifest.numerics["outputs"]


def test_the_quantized_model_cache_is_keyed_by_the_code(tmp_path, monkeypatch):
    """A QDQ model cached by other code (an upgrade, an edit of the quantizer) is not reused: the
    mixed-precision fix above was first measured on the entry the code before it had left."""
    from modelexport.backends.ort_qnn import compile as onnx_compile
    monkeypatch.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path / "cache"))
    _conv_mul_conv(tmp_path / "m.onnx")
    rng = np.random.default_rng(3)
    calib = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(2)]

    def quantize_hit(out: str) -> bool:
        b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / out, target="SM8650", precision="8a8w",
                                calibration=calib)
        return b.manifest.parts[0].cache_hit["quantize"]
    monkeypatch.setattr(onnx_compile, "code_fingerprint", lambda: "code A")
    assert quantize_hit("a") is False
    assert quantize_hit("b") is True                       # same code: the entry is reused
    monkeypatch.setattr(onnx_compile, "code_fingerprint", lambda: "code B")
    assert quantize_hit("c") is False


def test_an_fp16_island_inside_an_8_bit_graph_runs_on_the_htp(tmp_path):
    """`--override REGEX=fp16`: the matched nodes stay float between a DequantizeLinear and a
    QuantizeLinear and the HTP runs them in float16. outlier_channels' scale spans 10^4: at 8 bits the
    small channels vanish; with the scale and the mix as an fp16 island they come back, and no node
    goes to the CPU."""
    from onnx_models import outlier_channels
    outlier_channels(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)]
    plain = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "plain", target="SM8650", precision="8a8w",
                                calibration=calib, use_cache=False)
    island = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "island", target="SM8650",
                                 precision="8a8w", calibration=calib, overrides=["outlier=fp16"], use_cache=False)
    q = onnx.load(str(next((tmp_path / "island").rglob("model.qdq.onnx"))))
    float_ops = {n.name: n.op_type for n in q.graph.node if "outlier" in n.name}
    assert float_ops == {"/outlier/scale/Mul": "Mul", "/outlier/mix/Conv": "Conv"}      # left float, no Q/DQ of their own
    assert not any(t.name.startswith("w2") and t.data_type != TensorProto.FLOAT for t in q.graph.initializer)
    pl = next(iter(island.manifest.placement[island.manifest.parts[0].name].values()))
    assert pl["cpu_fallbacks"] == []
    db = lambda b: min(o["sqnr_db"] for o in b.manifest.numerics["outputs"])  # noqa: E731
    assert db(plain) < 15 < 30 < db(island), (db(plain), db(island))
    assert island.manifest.parts[0].quantization["fp16_nodes"] == 2
