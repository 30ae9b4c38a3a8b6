"""MACs of ONNX nodes: 1-D convolutions, weights held by Constant nodes, a body inside an If."""
from __future__ import annotations

import numpy as np


def _conv1d_in_if():
    """An If on an input whose branches are 1-D convolutions (a sample-rate switch)."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    rng = np.random.default_rng(0)

    def branch(name, k):
        w = nh.from_array(rng.standard_normal((8, 4, k)).astype(np.float32), f"w_{name}")
        n = h.make_node("Conv", ["x", f"w_{name}"], [f"y_{name}"], name=f"conv_{name}", pads=[k // 2, k // 2])
        return h.make_graph([n], name, [], [h.make_tensor_value_info(f"y_{name}", T.FLOAT, [1, 8, 64])], [w])
    node = h.make_node("If", ["flag"], ["y"], name="rate_switch", then_branch=branch("a", 3), else_branch=branch("b", 5))
    g = h.make_graph([node], "ifm", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 64]),
                                     h.make_tensor_value_info("flag", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 64])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _conv1d_constant_weight():
    """A 1-D convolution whose weight is computed from Constant nodes (weight norm), no value_info."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh
    v = nh.from_array(np.ones((8, 4, 3), np.float32))
    nodes = [h.make_node("Constant", [], ["v"], value=v),
             h.make_node("Constant", [], ["s"], value=nh.from_array(np.full((8, 1, 1), 0.5, np.float32))),
             h.make_node("Mul", ["v", "s"], ["w"], name="weight_norm"),
             h.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1]),
             h.make_node("Relu", ["c"], ["y"], name="relu")]
    g = h.make_graph(nodes, "wn", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 64])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8, 64])])
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def test_conv1d_macs_are_counted():
    from modelexport.frontends.onnx_graph import node_macs
    assert node_macs(_conv1d_constant_weight())["conv"] == 8 * 64 * 4 * 3


def test_a_body_inside_an_if_counts_its_costliest_branch():
    from modelexport.frontends.onnx_graph import node_macs
    assert node_macs(_conv1d_in_if())["rate_switch"] == 8 * 64 * 4 * 5


def test_the_htp_share_of_macs_counts_only_placed_nodes():
    """A MatMul folded into a Gemm by the optimizer keeps its MACs on its row, but computes nothing where it
    was: the share is HTP over HTP + CPU (trueocr's order model read "6.82M on HTP, 0 on CPU (12.8% on HTP)")."""
    from modelexport.auditing.report import AuditReport, NodeAudit
    nodes = [NodeAudit("a", "MatMul", "HTP", macs=100), NodeAudit("b", "MatMul", "folded", macs=700),
             NodeAudit("c", "Conv", "CPU", macs=100)]
    tot = AuditReport("m", "SM8650", 75, "fp16", "onnxruntime-qnn", nodes).totals()
    assert tot["htp_mac_share"] == 0.5 and tot["total_macs"] == 900
    only_folded = AuditReport("m", "SM8650", 75, "fp16", "onnxruntime-qnn", nodes[1:2]).totals()
    assert only_folded["htp_mac_share"] is None
