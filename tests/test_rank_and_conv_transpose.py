"""Two repairs found on gtcrn's speech enhancer, whose five nodes ran on the CPU at every precision:
`rank-above-5-out` (a rank-6 unfold read only by Reshapes is not made) and
`dilated-conv-transpose-as-conv` (QNN's TransposeConv2d takes dilation 1 only; at stride 1 a
ConvTranspose is a Conv). Each: the same values on the CPU, and every node on the HTP."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import modelexport
from modelexport.passes.onnx import RepairContext
from modelexport.passes.onnx.dilated_conv_transpose import dilated_conv_transpose_as_conv
from modelexport.passes.onnx.wide_rank import rank_above_5_out
from onnx_models import _save, repaired_same_on_the_cpu


def unfold(path) -> str:
    """gtcrn's subband unfold: a Gather of [3, 129] indices on axis 4 (rank 6 out), squeezed by a Reshape;
    then a Reshape up to rank 6 and one back down."""
    idx = (np.arange(129)[None, :] + np.arange(3)[:, None]).astype(np.int64)
    nodes = [helper.make_node("Gather", ["x", "idx"], ["g"], axis=4, name="unfold"),
             helper.make_node("Reshape", ["g", "s3"], ["r3"], name="squeeze"),
             helper.make_node("Relu", ["r3"], ["a"], name="act"),
             helper.make_node("Reshape", ["a", "s6"], ["r6"], name="up"),
             helper.make_node("Reshape", ["r6", "s4"], ["y"], name="down")]
    inits = [numpy_helper.from_array(idx, "idx"), numpy_helper.from_array(np.array([3, 3, 129], np.int64), "s3"),
             numpy_helper.from_array(np.array([1, 3, 1, 3, 1, 129], np.int64), "s6"),
             numpy_helper.from_array(np.array([1, 9, 1, 129], np.int64), "s4")]
    return str(_save(nodes, "unfold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 1, 1, 131])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 9, 1, 129])], inits, path))


def conv_transpose(path, c_in=16, c_out=16, group=16, dil=(5, 1), pads=(10, 1, 10, 1), shape=(20, 33)) -> str:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((c_in, c_out // group, 3, 3)).astype(np.float32) * 0.3
    b = rng.standard_normal(c_out).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="deconv", group=group, dilations=list(dil),
                            kernel_shape=[3, 3], pads=list(pads), strides=[1, 1])
    out = [shape[i] + dil[i] * 2 - pads[i] - pads[i + 2] for i in range(2)]
    return str(_save([node], "ct", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c_in, *shape])],
                     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c_out, *out])],
                     [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], path))


def test_a_rank_6_unfold_read_by_reshapes_is_not_made(tmp_path):
    record = repaired_same_on_the_cpu(unfold(tmp_path / "m.onnx"), rank_above_5_out, (1, 3, 1, 1, 131))
    assert record == {"nodes": ["unfold", "up"], "count": 2}


@pytest.mark.parametrize("case", [dict(), dict(c_in=4, c_out=6, group=2, dil=(2, 3), pads=(1, 0, 2, 3)),
                                  dict(c_in=3, c_out=5, group=1, dil=(1, 2), pads=(0, 0, 0, 0))])
def test_a_dilated_conv_transpose_of_stride_1_is_the_conv_it_equals(tmp_path, case):
    path = conv_transpose(tmp_path / "m.onnx", **case)
    record = repaired_same_on_the_cpu(path, dilated_conv_transpose_as_conv, (1, case.get("c_in", 16), 20, 33))
    assert record["count"] == 1


def test_a_strided_or_undilated_conv_transpose_stays(tmp_path):
    for kw in (dict(dil=(1, 1), pads=(1, 1, 1, 1)),):
        m = onnx.load(conv_transpose(tmp_path / "m.onnx", **kw))
        assert dilated_conv_transpose_as_conv(m, RepairContext()) is None
    m = onnx.load(conv_transpose(tmp_path / "m.onnx"))
    m.graph.node[0].attribute[-1].CopyFrom(helper.make_attribute("strides", [2, 1]))
    assert dilated_conv_transpose_as_conv(m, RepairContext()) is None


@pytest.mark.parametrize("repaired", [False, True])
@pytest.mark.parametrize("model,repair", [(unfold, "rank-above-5-out"), (conv_transpose, "dilated-conv-transpose-as-conv")])
def test_every_node_runs_on_the_htp(tmp_path, monkeypatch, model, repair, repaired):
    if not repaired:
        import modelexport.passes.onnx as repairs
        every = repairs.all_repairs
        monkeypatch.setattr(repairs, "all_repairs", lambda: [r for r in every() if r.name != repair])
    rep = modelexport.audit(model(tmp_path / "m.onnx"), target="SM8650", precision="fp16")
    cpu = [n.name for n in rep.nodes if n.backend == "CPU"]
    assert (not cpu) if repaired else cpu, cpu
