"""Tiny ONNX models with the shapes and names tf2onnx writes, built here for the ONNX-path tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from onnx_models import _save


def shared_bias_suffix_clash(path: Path) -> Path:
    """basic-pitch's CQT front end (a tf2onnx export): two Conv1D (as Conv over [N, C, 1, T]) share
    one bias initializer `B`, and tf2onnx names the first conv's output `B` + a digit (its fused
    names: bias `conv1d_25;conv1d_25`, output `conv1d_25;conv1d_252`); that output goes Neg →
    Transpose(0, 2, 3, 1) → Reshape, as the CQT's imaginary part does.

    ONNX Runtime's QDQ quantizer gives each further consumer of a shared bias a copy named `B` + the
    next integer suffix among the *initializers* only: here `B0`, the first conv's output. The
    activation's Q/DQ then quantizes the copy, the Neg reads a [4] constant instead of the conv,
    and the QDQ model no longer type-checks (Transpose perm {0, 2, 3, 1}, input shape {4})."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    bias = "model_1/cqt/conv1d;model_1/cqt/conv1d"
    w_re = numpy_helper.from_array((rng.standard_normal((4, 1, 1, 16)) * 0.2).astype(np.float32), "const_fold_opt__10")
    w_im = numpy_helper.from_array((rng.standard_normal((4, 1, 1, 16)) * 0.2).astype(np.float32), "const_fold_opt__11")
    b = numpy_helper.from_array((rng.standard_normal(4) * 0.1).astype(np.float32), bias)
    shape = numpy_helper.from_array(np.array([1, 7, 4], np.int64), "const_fold_opt__12")
    nodes = [helper.make_node("Conv", ["x", w_im.name, bias], [bias + "0"], name="model_1/cqt/conv1d_im",
                              kernel_shape=[1, 16], strides=[1, 8]),
             helper.make_node("Neg", [bias + "0"], ["model_1/cqt/Neg"], name="model_1/cqt/Neg"),
             helper.make_node("Transpose", ["model_1/cqt/Neg"], ["model_1/cqt/conv1d__306:0"],
                              name="model_1/cqt/conv1d__306", perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["model_1/cqt/conv1d__306:0", shape.name], ["imag"], name="model_1/cqt/Squeeze"),
             helper.make_node("Conv", ["x", w_re.name, bias], ["model_1/cqt/conv1d_re"], name="model_1/cqt/conv1d_re",
                              kernel_shape=[1, 16], strides=[1, 8]),
             helper.make_node("Transpose", ["model_1/cqt/conv1d_re"], ["model_1/cqt/conv1d__307:0"],
                              name="model_1/cqt/conv1d__307", perm=[0, 2, 3, 1]),
             helper.make_node("Reshape", ["model_1/cqt/conv1d__307:0", shape.name], ["real"], name="model_1/cqt/Squeeze_1")]
    return _save(nodes, "shared_bias_suffix_clash", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 1, 64])],
                 [helper.make_tensor_value_info("imag", TensorProto.FLOAT, [1, 7, 4]),
                  helper.make_tensor_value_info("real", TensorProto.FLOAT, [1, 7, 4])],
                 [w_re, w_im, b, shape], path)
