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
