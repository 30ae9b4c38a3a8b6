"""`wide-kernel-as-pieces`: at 16-bit weights a Conv kernel wider than 8 taps is a sum of Convs of at
most 8 taps: the same numbers on the CPU for every stride, dilation, group and padding, and on the HTP
at 16a16w the precision the QDQ model has (bench/results/htp_wide_kernel.json)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelexport
from modelexport.passes.onnx import RepairContext, apply_repairs
from test_tf_exports import _without

C = 8


def conv_model(kernel: list[int], size: list[int], group=1, strides=None, dilations=None, pads=None, bias=True,
               out: list[int] | None = None):
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((C, C // group, *kernel)).astype(np.float32), "w")]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b"))
    attrs = {"group": group, "kernel_shape": kernel, **({"strides": strides} if strides else {}),
             **({"dilations": dilations} if dilations else {}), **({"pads": pads} if pads else {})}
    node = helper.make_node("Conv", ["x", "w", *(["b"] if bias else [])], ["y"], name="node_Conv_0", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, C, *size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _run(m, x):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("kernel,size,kw", [
    ([16], [50], {"pads": [8, 7]}),
    ([10], [400], {"strides": [5]}),                                 # wav2vec2's first Conv
    ([40], [120], {"group": 4, "pads": [20, 19]}),
    ([9], [60], {"dilations": [2], "pads": [8, 8], "strides": [2]}),
    ([9, 9], [20, 20], {"pads": [4, 4, 4, 4], "bias": False}),
    ([3, 11], [12, 30], {"strides": [1, 2], "pads": [1, 5, 1, 5], "group": 2}),
])
def test_the_pieces_compute_the_same_on_the_cpu(kernel, size, kw):
    m = conv_model(kernel, size, **kw)
    x = np.random.default_rng(1).standard_normal((1, C, *size)).astype(np.float32)
    ref = _run(m, x)
    done = {r["name"]: r for r in apply_repairs(m, RepairContext(quantized=True, activation_bits=16, weight_bits=16))}
    assert done["wide-kernel-as-pieces"]["count"] == 1
    assert all(max(n.attribute[[a.name for a in n.attribute].index("kernel_shape")].ints) <= 8
               for n in m.graph.node if n.op_type == "Conv")
    out = _run(m, x)
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kernel,bits", [([16], 0), ([16], 8), ([8], 16), ([64], 16), ([256], 16)])
def test_only_at_16_bit_weights_and_9_to_63_taps(kernel, bits):
    """From 64 taps the HTP is exact again (84 dB): those Convs stay whole, as do 8-bit ones."""
    m = conv_model(kernel, [300])
    assert not any(r["name"] == "wide-kernel-as-pieces"
                   for r in apply_repairs(m, RepairContext(quantized=bits > 0, activation_bits=16, weight_bits=bits)))


@pytest.mark.parametrize("repaired", [False, True])
def test_a_wide_kernel_holds_at_16a16w_in_pieces(tmp_path, monkeypatch, repaired):
    if not repaired:
        _without(monkeypatch, "wide-kernel-as-pieces")
    onnx.save(conv_model([16], [100], pads=[8, 7], out=[1, C, 100]), str(tmp_path / "m.onnx"))
    calib = [{"x": np.random.default_rng(i).standard_normal((1, C, 100)).astype(np.float32)} for i in range(4)]
    b = modelexport.compile(str(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650", precision="16a16w",
                            calibration=calib, use_cache=False)
    db = b.manifest.numerics["outputs"][0]["sqnr_db"]
    assert (db >= 55) if repaired else (db < 45), b.manifest.numerics["outputs"]


def test_a_conv_whose_pieces_would_be_too_large_stays_whole(monkeypatch):
    """Each piece's output is a tensor calibration records: beyond MAX_PIECE_VALUES in all the Conv is
    left whole (basic-pitch's constant-Q front end took calibration past 10 minutes in pieces)."""
    from modelexport.passes.onnx import wide_kernel
    monkeypatch.setattr(wide_kernel, "MAX_PIECE_VALUES", 2 * C * 50 - 1)      # [16] on 50 samples: 2 pieces of C x 50
    m = conv_model([16], [50], pads=[8, 7])
    assert not any(r["name"] == "wide-kernel-as-pieces"
                   for r in apply_repairs(m, RepairContext(quantized=True, activation_bits=16, weight_bits=16)))

