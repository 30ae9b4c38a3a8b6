"""Our one-pass MinMax ranges are ONNX Runtime's own (its `MinMaxCalibrater`), tensor for tensor, on a
tiny static decoder graph calibrated with real-looking inputs; and quantizing with them gives the
same QDQ model as ONNX Runtime's `quantize()` calibrating by itself."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from llm_tiny import random_graph_feed, tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def decoder_graph(tmp_path_factory):
    from modelexport.llm.export.onnx_export import export_part, split_layers
    from modelexport.llm.model.static_decoder import ONNX_RMS_NORM, StaticDecoderConfig, build_static_decoder

    root = tmp_path_factory.mktemp("ranges")
    dec = build_static_decoder(tiny_llama(n_layers=2), StaticDecoderConfig(4, 32), rms_norm=ONNX_RMS_NORM)
    path = export_part(dec, split_layers(2, 1)[0], root / "float" / "dec.onnx")
    model = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(0)
    samples = [random_graph_feed(model, rng) for _ in range(3)]
    return path, samples, root


def _ort_ranges(path, samples, op_types, tmp):
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    class Reader:
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    cal = create_calibrator(Path(path), op_types, augmented_model_path=str(tmp / "aug.onnx"),
                            calibrate_method=CalibrationMethod.MinMax, use_external_data_format=True)
    cal.collect_data(Reader())
    return cal.compute_data()


def test_ranges_equal_onnxruntime_calibrator(decoder_graph):
    from modelexport.quant.minmax_ranges import minmax_ranges

    path, samples, root = decoder_graph
    ops = sorted({n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node} - {"Constant"})
    ours = minmax_ranges(path, samples, ops)
    theirs = _ort_ranges(path, samples, ops, root)
    assert sorted(ours.keys()) == sorted(theirs.keys()) and len(ours.keys()) > 50
    for name in theirs.keys():
        a, b = ours[name].range_value, theirs[name].range_value
        np.testing.assert_array_equal(np.asarray(a[0], np.float32).ravel(), np.asarray(b[0], np.float32).ravel(), err_msg=name)
        np.testing.assert_array_equal(np.asarray(a[1], np.float32).ravel(), np.asarray(b[1], np.float32).ravel(), err_msg=name)
    assert not list(path.parent.glob(".ranges-*"))          # the augmented copy is gone


def test_quantized_model_equals_onnxruntime_quantize(decoder_graph):
    from onnxruntime.quantization import QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from modelexport.quant.calibration import CalibrationSet
    from modelexport.quant.minmax_ranges import minmax_ranges, quantize_with_ranges

    path, samples, root = decoder_graph
    cal = CalibrationSet(samples, "arrays", "test")
    outs = {}
    for how in ("ours", "ort"):
        config = get_qnn_qdq_config(str(path), cal.reader(), activation_type=QuantType.QUInt16,
                                    weight_type=QuantType.QUInt8, per_channel=False)
        config.use_external_data_format = True
        out = root / how / "q.onnx"
        out.parent.mkdir()
        if how == "ours":
            quantize_with_ranges(path, out, config, minmax_ranges(path, samples, config.op_types_to_quantize))
        else:
            quantize(str(path), str(out), config)
        outs[how] = onnx.load(str(out))
    a, b = outs["ours"].graph, outs["ort"].graph
    assert [n.op_type for n in a.node] == [n.op_type for n in b.node]
    assert sum(n.op_type == "QuantizeLinear" for n in a.node) > 20
    ia = {i.name: onnx.numpy_helper.to_array(i) for i in a.initializer}
    ib = {i.name: onnx.numpy_helper.to_array(i) for i in b.initializer}
    assert ia.keys() == ib.keys()
    for k in ia:
        np.testing.assert_array_equal(ia[k], ib[k], err_msg=k)


def _quantize_llm_style(path, samples, out, fast: bool, monkeypatch):
    """The LLM recipe (16-bit activations, 4-bit per-channel MatMul weights by override, float
    residual nodes) through `quantize_with_ranges`, with or without the vectorized loops."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    from modelexport.quant.llm_graphs import FLOAT_NODES, parse_overrides, weight_overrides, DEFAULT_OVERRIDES
    from modelexport.quant import ort_fast_paths
    from modelexport.quant.calibration import CalibrationSet
    from modelexport.quant.minmax_ranges import minmax_ranges, quantize_with_ranges

    model = onnx.load(str(path), load_external_data=False)
    tq, _ = weight_overrides(model, "16a4w", list(reversed(parse_overrides(list(DEFAULT_OVERRIDES), "16a4w"))))
    float_nodes = [n.name for n in model.graph.node if FLOAT_NODES.search(n.name)]
    config = get_qnn_qdq_config(str(path), CalibrationSet(samples, "arrays", "test").reader(),
                                activation_type=QuantType.QUInt16, weight_type=QuantType.QUInt8, per_channel=True,
                                init_overrides=tq, nodes_to_exclude=float_nodes)
    config.use_external_data_format = True
    from onnxruntime.quantization import qdq_quantizer
    calls = []
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(ort_fast_paths, "_patches", list)
        original = qdq_quantizer.compute_data_quant_params
        m.setattr(qdq_quantizer, "compute_data_quant_params", lambda *a, **k: calls.append(1) or original(*a, **k))
        out.parent.mkdir(parents=True)
        quantize_with_ranges(path, out, config, minmax_ranges(path, samples, config.op_types_to_quantize))
    return onnx.load(str(out)), len(calls)


def test_vectorized_quantizer_loops_give_the_same_llm_model(decoder_graph, monkeypatch):
    path, samples, root = decoder_graph
    assert onnx.load(str(path), load_external_data=False).opset_import[0].version == 21   # converted at export
    fast, fast_calls = _quantize_llm_style(path, samples, root / "fast" / "q.onnx", True, monkeypatch)
    slow, slow_calls = _quantize_llm_style(path, samples, root / "slow" / "q.onnx", False, monkeypatch)
    assert slow_calls > 500 and fast_calls < 20          # the per-channel loop was really replaced
    assert [(n.op_type, list(n.input), list(n.output)) for n in fast.graph.node] == \
           [(n.op_type, list(n.input), list(n.output)) for n in slow.graph.node]
    fa = {i.name: i for i in fast.graph.initializer}
    sa = {i.name: i for i in slow.graph.initializer}
    assert fa.keys() == sa.keys()
    int4 = [k for k, v in fa.items() if v.data_type == onnx.TensorProto.INT4]
    assert len(int4) >= 14                                   # 7 MatMuls per layer, 2 layers, 4-bit per channel
    for k in fa:
        assert fa[k].data_type == sa[k].data_type, k
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(fa[k]), onnx.numpy_helper.to_array(sa[k]), err_msg=k)


@pytest.mark.parametrize("qtype,symmetric,reduce_range,dtype,min_range", [
    ("INT4", True, False, np.float32, None), ("INT4", True, False, np.float32, 1e-4), ("INT8", True, False, np.float32, None),
    ("UINT8", False, False, np.float32, 0.5), ("INT8", True, True, np.float32, None), ("UINT16", False, False, np.float16, None),
    ("INT4", False, False, np.float32, None)])
def test_channel_params_equal_onnxruntime_per_channel_loop(qtype, symmetric, reduce_range, dtype, min_range):
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import compute_data_quant_params

    from modelexport.quant.ort_fast_paths import channel_quant_params

    rng = np.random.default_rng(1)
    w = rng.standard_normal((24, 9)).astype(dtype) * rng.uniform(0.001, 3, 9).astype(dtype)
    w[:, 2] = 0                      # an all-zero channel: ORT's degenerate scale 1, zero point 0
    w[:, 5] = np.abs(w[:, 5])        # one-sided channels
    w[:, 6] = -np.abs(w[:, 6])
    w[:, 7] = 1e-42 if dtype == np.float32 else 0   # below float32's tiny
    qt = getattr(TensorProto, qtype)
    zp, scale = channel_quant_params(w, 1, qt, symmetric, reduce_range, min_range)
    for c in range(w.shape[1]):
        z, s = compute_data_quant_params(w.take(c, 1).ravel(), qt, symmetric, reduce_range=reduce_range,
                                         min_real_range=min_range)
        assert zp[c] == z and zp.dtype == z.dtype, (c, zp[c], z)
        assert scale[c] == s and scale.dtype == s.dtype, (c, scale[c], s)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 64])
def test_4bit_packing_equals_onnxruntime(n):
    from onnxruntime.quantization.quant_utils import pack_bytes_to_4bit as theirs

    from modelexport.quant.ort_fast_paths import pack_bytes_to_4bit as ours

    src = np.random.default_rng(n).integers(-8, 8, n).astype(np.int8).tobytes()
    assert ours(src) == theirs(src)


def _edit_a_graph(fast: bool) -> list:
    """Input replacements between the edits the quantizer makes elsewhere: a direct input edit, a node
    removed, a node appended, the node list rebuilt."""
    from onnx import helper
    from onnxruntime.quantization.onnx_model import ONNXModel

    from modelexport.quant.ort_fast_paths import fast_quantizer
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"), helper.make_node("Add", ["x", "x"], ["b"], name="b"),
             helper.make_node("Relu", ["b"], ["c"], name="c"), helper.make_node("Mul", ["a", "x"], ["d"], name="d")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("d", onnx.TensorProto.FLOAT, [1])])
    with fast_quantizer() if fast else contextlib.nullcontext():
        m = ONNXModel(helper.make_model(graph))
        g = m.model.graph
        m.replace_input_of_all_nodes("x", "x1")
        ONNXModel.replace_node_input(g.node[2], "b", "x1")      # a node gains x1 behind the index's back
        m.replace_input_of_all_nodes("x1", "x2")
        m.remove_node(g.node[0])
        m.add_node(helper.make_node("Neg", ["x2"], ["e"], name="e"))
        m.replace_input_of_all_nodes("x2", "x3")
        kept = list(g.node)
        g.ClearField("node")
        g.node.extend(kept[::-1])
        m.replace_input_of_all_nodes("x3", "x4")
        m.replace_input_of_all_nodes("a", "a1")
    return [(n.name, list(n.input)) for n in m.model.graph.node]


def test_consumer_index_follows_the_graph_through_other_edits():
    assert _edit_a_graph(fast=True) == _edit_a_graph(fast=False)
    assert ("c", ["x4"]) in _edit_a_graph(fast=True)


def _all_tensors(model) -> dict:
    from modelexport.quant.chunk_join import node_tensors
    out = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        for j, t in enumerate(node_tensors([node])):
            out[f"{node.name}#{j}"] = onnx.numpy_helper.to_array(t)
    return out


def test_lpbq_rewrite_on_file_equals_the_rewrite_in_memory(decoder_graph, monkeypatch):
    """`to_block_weights` reads one float weight at a time and copies the graph's other tensors file
    to file (tensors in node attributes too, which the quantizer stores outside the graph): the
    result is the in-memory rewrite of the fully loaded graph, tensor for tensor."""
    from modelexport.quant.block_weights import rewrite_block_weights, to_block_weights
    from modelexport.quant.chunk_join import external_entry, node_tensors

    path, samples, root = decoder_graph
    q = root / "lpbq" / "q.onnx"
    _quantize_llm_style(path, samples, q, True, monkeypatch)
    bare = onnx.load(str(q), load_external_data=False)
    assert any(external_entry(t) for t in node_tensors(bare.graph.node))   # the case the copy must handle
    inits = {i.name: i for i in bare.graph.initializer}
    producers = {o: n for n in bare.graph.node for o in n.output}
    four_bit = {n.name for n in bare.graph.node if n.op_type == "MatMul" and n.input[1] in producers
                and inits.get(producers[n.input[1]].input[0]) is not None
                and inits[producers[n.input[1]].input[0]].data_type == onnx.TensorProto.INT4}
    assert len(four_bit) >= 10
    float_model = onnx.load(str(path))
    fi = {i.name: onnx.numpy_helper.to_array(i) for i in float_model.graph.initializer}
    weights = {n.name: fi[n.input[1]] for n in float_model.graph.node if n.name in four_bit}
    reference = onnx.load(str(q))
    assert rewrite_block_weights(reference, weights, 16) == len(four_bit)
    assert to_block_weights(q, path, four_bit, 16) == len(four_bit)
    rewritten = onnx.load(str(q))
    assert [(n.op_type, list(n.input), list(n.output)) for n in rewritten.graph.node] == \
        [(n.op_type, list(n.input), list(n.output)) for n in reference.graph.node]
    a, b = _all_tensors(reference), _all_tensors(rewritten)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert sorted(p.name for p in q.parent.iterdir()) == ["q.onnx", "q.onnx.data"]


@pytest.mark.parametrize("axis", [0, 1])
def test_quantizing_a_weight_by_rows_equals_quantizing_it_at_once(axis):
    from modelexport.quant.ort_fast_paths import _quantize_rows
    rng = np.random.default_rng(axis)
    w = rng.standard_normal((37, 11)).astype(np.float32)
    shape = [1, 1]
    shape[axis] = w.shape[axis]
    scale = (rng.random(w.shape[axis]) * 0.02 + 0.001).astype(np.float32).reshape(shape)
    zero = rng.integers(0, 255, w.shape[axis]).astype(np.uint8).reshape(shape)
    once = np.clip((w / scale).round() + zero, 0, 255).astype(np.uint8)
    for step in (1, 5, 37):
        np.testing.assert_array_equal(_quantize_rows(w, scale, zero, 0, 255, np.uint8, step), once)


def test_the_qnn_quantization_helpers_come_without_torch():
    """A quantization worker imports ONNX Runtime's QNN helpers, not torch (quant/ort_qnn.py)."""
    import subprocess
    code = ("import sys; from modelexport.quant.ort_qnn import qnn_quantization; q = qnn_quantization(); "
            "assert callable(q.get_qnn_qdq_config) and callable(q.qnn_preprocess_model); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr
