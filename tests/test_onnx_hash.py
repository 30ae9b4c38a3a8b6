"""Cache keys of ONNX models hash their external weights too: the tiny LLM and the tiny VLM's text
model export embedder graphs whose .onnx files are byte for byte the same (same shapes, weights in
`<name>.data`), and keyed on the .onnx alone the second compile took the first one's context binary
(the VLM's simulator logits came out at -3 dB in the suite, where it runs after the LLM tests)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from modelexport.core.files import sha256_file, sha256_onnx


def _save(path, table):
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["rows"])], "embed",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 2])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [1, 2, 4])],
        [numpy_helper.from_array(table, "table")])
    onnx.save(helper.make_model(graph), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".data", size_threshold=0)


def test_two_models_differing_only_in_external_weights_hash_apart(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a, b = tmp_path / "a" / "embed.onnx", tmp_path / "b" / "embed.onnx"
    _save(a, np.zeros((8, 4), np.float32))
    _save(b, np.ones((8, 4), np.float32))
    assert sha256_file(a) == sha256_file(b)           # the graph files alone are the same
    assert sha256_onnx(a) != sha256_onnx(b)
    assert sha256_onnx(a) == sha256_onnx(a)
