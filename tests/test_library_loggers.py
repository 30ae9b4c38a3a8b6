"""Library chatter the CLI quiets: only the messages named, and only their own loggers."""
from __future__ import annotations

import io
import logging

from modelexport.toolchain.library_loggers import quiet_library_loggers

ROPE_LOGGER = "transformers.modeling_rope_utils"


def _rope_warnings(rope_parameters: dict) -> str:
    from transformers import AutoConfig
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger = logging.getLogger(ROPE_LOGGER)
    logger.addHandler(handler)
    try:
        AutoConfig.for_model("qwen2", rope_parameters=rope_parameters)
    finally:
        logger.removeHandler(handler)
    return buf.getvalue()


def test_the_mrope_section_note_is_dropped_and_other_rope_warnings_are_not(monkeypatch):
    monkeypatch.delenv("MODELEXPORT_DEBUG", raising=False)
    mrope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    logger = logging.getLogger(ROPE_LOGGER)
    saved = list(logger.filters)
    for f in saved:
        logger.removeFilter(f)
    try:
        assert "mrope_section" in _rope_warnings(mrope)      # transformers says it unless quieted
        quiet_library_loggers()
        quiet_library_loggers()                               # twice: one filter, not two
        assert len(logger.filters) == 1
        assert _rope_warnings(mrope) == ""
        # a different warning of the same logger still reaches the user
        assert "partial_rotary_factor" in _rope_warnings({"rope_type": "proportional", "rope_theta": 10000.0})
    finally:
        for f in list(logger.filters):
            logger.removeFilter(f)
        for f in saved:
            logger.addFilter(f)


def test_library_future_warnings_are_dropped_and_ours_are_not(monkeypatch):
    """ExecuTorch's FutureWarnings about its own calls (printed in the middle of `generate`'s CPU build)."""
    import warnings
    monkeypatch.delenv("MODELEXPORT_DEBUG", raising=False)

    def raised(category, message, module):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            quiet_library_loggers()
            warnings.warn_explicit(message, category, f"/x/{module.replace('.', '/')}.py", 1, module=module)
        return [str(w.message) for w in seen]

    assert raised(FutureWarning, "_check_is_size will be removed", "executorch.extension.llm.custom_ops.custom_ops") == []
    assert raised(FutureWarning, "`isinstance(treespec, LeafSpec)` is deprecated", "copyreg") == []
    assert raised(UserWarning, "Mutation on a buffer in the model is detected.", "executorch.exir.emit._emitter") == []
    assert raised(FutureWarning, "something else", "modelexport.llm.run.generate") == ["something else"]
    assert raised(UserWarning, "another note", "executorch.exir.emit._emitter") == ["another note"]


def test_the_constant_folders_split_note_is_dropped(monkeypatch):
    """onnxscript's folder (the `fold-constants` repair) says it leaves a constant Split unfolded."""
    import onnx
    from onnx import TensorProto, helper
    from onnxscript import optimizer
    import onnx_ir as ir
    monkeypatch.delenv("MODELEXPORT_DEBUG", raising=False)
    name = "onnxscript.optimizer._constant_folding"
    c = helper.make_tensor("c", TensorProto.FLOAT, [4], [1, 2, 3, 4])
    nodes = [helper.make_node("Split", ["c"], ["a", "b"], axis=0, num_outputs=2),
             helper.make_node("Add", ["x", "a"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    logger = logging.getLogger(name)
    saved = list(logger.filters)
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    logger.addHandler(handler)
    try:
        for f in saved:
            logger.removeFilter(f)
        optimizer.fold_constants(ir.serde.deserialize_model(model))
        assert "Skipping constant folding for op Split" in buf.getvalue()     # said unless quieted
        buf.seek(0)
        buf.truncate(0)
        quiet_library_loggers()
        optimizer.fold_constants(ir.serde.deserialize_model(model))
        logger.warning("Evaluation failed: something")                       # its other warnings still show
        assert buf.getvalue().strip() == "Evaluation failed: something"
    finally:
        logger.removeHandler(handler)
        for f in list(logger.filters):
            logger.removeFilter(f)
        for f in saved:
            logger.addFilter(f)
