"""The HTP's 16-bit Log needs an output range of at least 4 (quant/log_range.py).

x in [1, 2] → Log in [0, 0.69]: quantized at 16 bits over that range, the simulator returned all
zeros (0.0 dB against the QDQ model on the CPU) while 8-bit and fp16 Logs were right. With the
output's range widened to LOG_MIN_SPAN the compile verifies."""
from __future__ import annotations

import numpy as np
import onnx

import modelexport
from modelexport.quant.log_range import LOG_MIN_SPAN
from onnx_models import log1p_of_small


def test_a_16_bit_log_of_a_narrow_range_is_computed(tmp_path):
    rng = np.random.default_rng(0)
    cal = [{"x": rng.uniform(0.0, 1.0, (1, 4, 32, 32)).astype(np.float32)} for _ in range(4)]
    b = modelexport.compile(str(log1p_of_small(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="16a8w", calibration=cal, use_cache=False)
    assert b.manifest.parts[0].quantization["log_ranges_widened"] == ["y"]
    qdq = onnx.load(str(b.file(b.manifest.parts[0].files.quantized_model)))
    q = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0].startswith("y"))
    scale = onnx.numpy_helper.to_array(next(t for t in qdq.graph.initializer if t.name == q.input[1]))
    assert float(scale) * 65535 >= LOG_MIN_SPAN * 0.999
    assert b.manifest.numerics["passed"] and b.manifest.numerics["outputs"][0]["sqnr_db"] > 60, b.manifest.numerics


def test_an_8_bit_log_keeps_its_calibrated_range(tmp_path):
    rng = np.random.default_rng(0)
    cal = [{"x": rng.uniform(0.0, 1.0, (1, 4, 32, 32)).astype(np.float32)} for _ in range(4)]
    b = modelexport.compile(str(log1p_of_small(tmp_path / "m.onnx")), output=tmp_path / "b", target="SM8650",
                            precision="8a8w", calibration=cal, use_cache=False)
    assert "log_ranges_widened" not in b.manifest.parts[0].quantization
