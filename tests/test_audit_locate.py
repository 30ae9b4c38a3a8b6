"""The audit names the node that makes QNN refuse a whole graph, on the real QNN EP.

The case is real behaviour: a Resize whose `roi` is an empty Constant, quantized 8a8w, gets a
Q/DQ pair on the empty tensor and QNN refuses to compose the graph (error 7004). The repair
`drop-empty-optional-inputs` removes a roi Constant that feeds the Resize directly; here it passes
through an Identity first (as exporters write it). The `fold-constants` repair now folds that
Identity for users; these tests turn it (and `constants-as-initializers`) off to keep a graph QNN
refuses. The EP's log names the DequantizeLinear; bisection over prefixes of the QDQ graph (the path taken when the log names no
node) ends at the node carrying the Q/DQ pair (the Identity) or the Resize it feeds.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import assert_clean_error


def resize_empty_roi(path: Path) -> Path:
    """Conv → Sigmoid → Resize(roi = Identity(empty Constant)) → Conv, opset 13."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((2, 4, 3, 3)) * 0.3).astype(np.float32), "w2")
    const = lambda name, arr: helper.make_node("Constant", [], [name], name=f"{name}_const",  # noqa: E731
                                               value=numpy_helper.from_array(arr))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
             const("roi", np.zeros((0,), np.float32)), const("scales", np.array([1, 1, 2, 2], np.float32)),
             helper.make_node("Identity", ["roi"], ["roi_id"], name="roi_identity"),
             helper.make_node("Resize", ["s", "roi_id", "scales"], ["u"], name="resize", mode="nearest"),
             helper.make_node("Conv", ["u", "w2"], ["y"], name="head", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "resize_roi", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 32, 32])], [w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


@pytest.fixture(autouse=True)
def _unfolded(monkeypatch):
    import modelexport.passes.onnx as repairs
    every = repairs.all_repairs
    monkeypatch.setattr(repairs, "all_repairs",
                        lambda: [r for r in every() if r.name not in ("fold-constants", "constants-as-initializers")])


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return resize_empty_roi(tmp_path_factory.mktemp("locate") / "resize_roi.onnx")


def test_audit_names_the_node_qnn_refuses(model):
    import modelexport
    rep = modelexport.audit(model, precision="8a8w")
    assert rep.refused and not rep.ok
    [b] = rep.blockers
    assert b.name.endswith("_DequantizeLinear") and b.details["located_by"] == "log"
    assert "7004" in b.reason and "`roi` is an empty constant" in b.reason and "Resize `resize`" in b.reason
    assert "--precision fp16" in b.fix and "16a8w" not in b.fix
    # The fix leads somewhere: at fp16 every node runs on the HTP.
    assert modelexport.audit(model, precision="fp16").ok


def test_bisection_finds_the_op_when_the_log_names_none(model, tmp_path):
    """The locator's second way, run as the audit runs it: a child process bisecting the QDQ graph."""
    from modelexport.frontends.onnx_model import load_onnx
    from modelexport.quant import ONNX_PRECISIONS, get_precision
    from modelexport.quant.calibration import CalibrationSet, random_samples
    from modelexport.quant.onnx_qdq import quantize_onnx
    qdq = tmp_path / "qdq.onnx"
    calib = CalibrationSet(random_samples(load_onnx(model).inputs, 2), "random", "random", representative=False)
    quantize_onnx(model, qdq, get_precision("8a8w", ONNX_PRECISIONS), calib)
    log = tmp_path / "ep.log"
    with open(log, "wb") as err:
        out = subprocess.run([sys.executable, "-m", "modelexport.backends.ort_qnn.audit_probe", str(qdq),
                              json.dumps({"provider_options": {"soc_model": "57"}, "locate": str(log)})],
                             stdout=subprocess.PIPE, stderr=err, cwd=tmp_path, timeout=600).stdout.decode()
    result = json.loads(out.rpartition("@@RESULT@@")[2])
    assert result["ok"], result
    b = result["blocker"]
    assert b["node"] in ("resize", "roi_identity") and b["how"] == "bisect"
    assert "7004" in b["error"]


def test_cli_refused_graph_is_one_message_and_the_log_is_kept(model, tmp_path, cli_here):
    log = tmp_path / "audit.log"
    proc = cli_here("audit", str(model), "-p", "8a8w", "--log", str(log))
    assert_clean_error(proc, "_DequantizeLinear", "empty constant", "fix: compile at --precision fp16")
    assert log.is_file() and "error code: 7004" in log.read_text()


def test_log_parser_blames_the_node_being_built(tmp_path):
    """A compose error line naming no node: the node the builder was adding just before it."""
    from modelexport.toolchain.ort_qnn_log import blockers_from_log
    text = ("2026 [V:onnxruntime:, base_op_builder.cc:40 AddToModelBuilder] QNN node builder is trying to add node. "
            "Onnx node name: [a] onnx node type: [Conv].\n"
            "2026 [V:onnxruntime:, base_op_builder.cc:40 AddToModelBuilder] QNN node builder is trying to add node. "
            "Onnx node name: [b] onnx node type: [Resize].\n"
            "\x1b[1;31m2026 [E:onnxruntime:, qnn_model_wrapper.cc:1 X] Something went wrong error code: 1\x1b[m\n")
    [b] = blockers_from_log(text)
    assert b.node == "b" and "Something went wrong" in b.error


def test_with_fold_constants_the_same_graph_runs_whole_on_the_htp(model, monkeypatch):
    """For users the Identity is folded, the empty roi dropped, and nothing is refused at 8a8w."""
    import modelexport
    monkeypatch.undo()                          # fold-constants back on
    rep = modelexport.audit(model, precision="8a8w")
    assert rep.ok and not rep.refused, rep.blockers
