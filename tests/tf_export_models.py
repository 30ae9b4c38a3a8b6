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


def keras_conv_relu_batchnorm(path: Path, seed: int = 0) -> Path:
    """openwakeword's speech embedding head as tf2onnx writes Keras' Conv2D → ReLU → BatchNormalization:
    an NHWC input with one channel, zero Pad, Reshape to NCHW, Conv, Relu, then the BatchNorm that
    no Conv absorbs (its scale and shift in the model's ranges), then LeakyRelu."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    c = 24
    scale, shift = rng.uniform(0.6, 3.5, c), rng.uniform(-2.1, 3.2, c)      # the real model's ranges
    mean, var = rng.uniform(0.16, 0.69, c), rng.uniform(0.07, 1.29, c)
    gamma, beta = scale * np.sqrt(var + 1e-3), shift + mean * scale
    t = [numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 2, 0], np.int64), "pad_const__6"),
         numpy_helper.from_array(np.array([1, 1, 76, 34], np.int64), "new_shape__315"),
         numpy_helper.from_array((rng.standard_normal((c, 1, 3, 3)) * 0.57).astype(np.float32), "Conv2D/ReadVariableOp:0"),
         *(numpy_helper.from_array(a.astype(np.float32), n) for a, n in ((gamma, "bn/gamma"), (beta, "bn/beta"),
                                                                          (mean, "bn/mean"), (var, "bn/var")))]
    nodes = [helper.make_node("Pad", ["input_1", "pad_const__6"], ["pad"], name="model/zero_padding2d/Pad"),
             helper.make_node("Reshape", ["pad", "new_shape__315"], ["nchw"], name="model/conv2d/Conv2D__7"),
             helper.make_node("Conv", ["nchw", "Conv2D/ReadVariableOp:0"], ["conv"], name="model/conv2d/Conv2D",
                              kernel_shape=[3, 3]),
             helper.make_node("Relu", ["conv"], ["relu"], name="model/conv2d/Relu"),
             helper.make_node("BatchNormalization", ["relu", "bn/gamma", "bn/beta", "bn/mean", "bn/var"], ["bn"],
                              name="model/batch_normalization/FusedBatchNormV3", epsilon=1e-3),
             helper.make_node("LeakyRelu", ["bn"], ["y"], name="model/leaky_re_lu/LeakyRelu", alpha=0.2)]
    return _save(nodes, "keras_conv_relu_batchnorm",
                 [helper.make_tensor_value_info("input_1", TensorProto.FLOAT, [1, 76, 32, 1])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 74, 32])], t, path)
