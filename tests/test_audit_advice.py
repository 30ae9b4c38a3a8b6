"""Advice that leads somewhere, on the real QNN EP: a weight-only quantized model at fp16
(per-channel DequantizeLinear the EP will not run alone); verify on random samples of a detector.
(`audit --log` kept on failure: test_audit_locate.py.)"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from conftest import assert_clean_error


def weight_only_quantized(path: Path) -> Path:
    """Conv whose weight is int8 per channel behind a DequantizeLinear; activations float."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    w = np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32)
    scale = (np.abs(w).reshape(8, -1).max(1) / 127).astype(np.float32)
    wq = np.clip(np.round(w / scale[:, None, None, None]), -127, 127).astype(np.int8)
    inits = [nh.from_array(wq, "w_q"), nh.from_array(scale, "w_scale"), nh.from_array(np.zeros(8, np.int8), "w_zp")]
    nodes = [h.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w"], name="w_DequantizeLinear", axis=0),
             h.make_node("Conv", ["x", "w"], ["a"], name="conv", pads=[1, 1, 1, 1]),
             h.make_node("Relu", ["a"], ["y"], name="relu")]
    g = h.make_graph(nodes, "wq", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 16, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 16, 16])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_standalone_per_channel_dq_is_taken_back_to_float(tmp_path):
    """A weight shipped int8 behind a per-channel DequantizeLinear: the QNN EP refused the standalone DQ
    at fp16 (it ran on the CPU); the `dequantize` repair folds it into a float weight, so every node is
    on the HTP at fp16 and at 8a8w."""
    import modelexport
    model = weight_only_quantized(tmp_path / "wq.onnx")
    rep = modelexport.audit(model, precision="fp16")
    assert rep.ok and not rep.fallbacks
    assert modelexport.audit(model, precision="8a8w").ok


def test_verify_warns_when_random_samples_give_a_nearly_constant_output(tmp_path, cli_here):
    """A detector whose scores are ~0 on noise (sigmoid of a large negative bias), fp16: verify says why
    the number means little and leads to --input. (It failed at 0 dB while the HTP's fp16 Sigmoid
    returned such scores as 0; the output-sigmoid repair computes them through Exp: it passes.)"""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    w = nh.from_array((np.random.default_rng(0).standard_normal((4, 3, 3, 3)) * 0.1).astype(np.float32), "w")
    b = nh.from_array(np.full(4, -9.0, np.float32), "b")
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             h.make_node("Sigmoid", ["c"], ["y"], name="score")]
    g = h.make_graph(nodes, "det", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 16, 16])], [w, b])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "det.onnx"))
    cli_here("compile", str(tmp_path / "det.onnx"), "-p", "fp16", "-o", str(tmp_path / "out"), check=True)
    proc = cli_here("verify", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    assert "nearly constant on these random inputs" in out and "verify on real data with --input FILE" in out
