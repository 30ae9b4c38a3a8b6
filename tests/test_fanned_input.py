"""A graph input read by several data-movement ops (DTLN's packed LSTM state [1, 2, 128, 2], sliced
into each LSTM's h and c): ONNX Runtime moves each reader's quantization up to the input, the QNN EP
takes one of them into the graph and leaves the others on the CPU. quant/onnx_qdq.quantize_fanned_inputs
gives the input one quantization of its own."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelexport
import modelexport.quant.onnx_qdq as onnx_qdq


def sliced_state(path) -> str:
    """state [1, 4, 8] → Slice channels 0:2 and 2:4 → Squeeze-free MatMuls with their own weights."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(np.array(v, np.int64), k) for k, v in
             (("s0", [0]), ("e0", [2]), ("s1", [2]), ("e1", [4]), ("ax", [1]))]
    inits += [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), f"w{i}") for i in (0, 1)]
    nodes = [helper.make_node("Slice", ["state", "s0", "e0", "ax"], ["h"]),
             helper.make_node("Slice", ["state", "s1", "e1", "ax"], ["c"]),
             helper.make_node("MatMul", ["h", "w0"], ["y0"]), helper.make_node("MatMul", ["c", "w1"], ["y1"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 4, 8])],
                          [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 2, 8]) for y in ("y0", "y1")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, str(path))
    return str(path)


@pytest.mark.parametrize("fixed", [False, True])
def test_a_sliced_state_input_is_quantized_once_on_the_htp(tmp_path, monkeypatch, fixed):
    if not fixed:
        monkeypatch.setattr(onnx_qdq, "quantize_fanned_inputs", lambda config, src: None)
    rng = np.random.default_rng(1)
    state = rng.standard_normal((4, 1, 4, 8)).astype(np.float32)
    state[:, :, 2:] *= 10                            # h and c have ranges of their own
    np.savez(tmp_path / "calib.npz", state=state)
    b = modelexport.compile(sliced_state(tmp_path / "m.onnx"), output=tmp_path / "b", target="SM8650",
                            precision="8a8w", calibration=str(tmp_path / "calib.npz"), use_cache=False)
    cpu = b.manifest.placement["m"]["SM8650"]["cpu_fallbacks"]
    if fixed:
        assert cpu == [] and b.manifest.numerics["passed"], (cpu, b.manifest.numerics)
    else:
        assert [n["op_type"] for n in cpu] == ["QuantizeLinear"], cpu
