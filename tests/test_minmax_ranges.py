"""Our one-pass MinMax ranges are ONNX Runtime's own (its `MinMaxCalibrater`), tensor for tensor, on a
tiny static decoder graph calibrated with real-looking inputs; and quantizing with them gives the
same QDQ model as ONNX Runtime's `quantize()` calibrating by itself."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from llm_tiny import tiny_llama  # noqa: E402


@pytest.fixture(scope="module")
def decoder_graph(tmp_path_factory):
    from modelexport.llm.export.onnx_export import export_part, split_layers
    from modelexport.llm.static_decoder import ONNX_RMS_NORM, StaticDecoderConfig, build_static_decoder

    root = tmp_path_factory.mktemp("ranges")
    dec = build_static_decoder(tiny_llama(n_layers=2), StaticDecoderConfig(4, 32), rms_norm=ONNX_RMS_NORM)
    path = export_part(dec, split_layers(2, 1)[0], root / "float" / "dec.onnx")
    model = onnx.load(str(path), load_external_data=False)
    rng = np.random.default_rng(0)
    samples = []
    for _ in range(3):
        feed = {}
        for i in model.graph.input:
            shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
            if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
                feed[i.name] = rng.standard_normal(shape).astype(np.float32)
            else:
                feed[i.name] = rng.integers(0, 8, size=shape).astype(np.int64 if i.type.tensor_type.elem_type == 7 else np.int32)
        if "attention_mask" in feed:
            feed["attention_mask"] = np.where(rng.random(feed["attention_mask"].shape) < 0.5, 0.0, -1e4).astype(np.float32)
        samples.append(feed)
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
