"""The QNN graph names the QNN EP writes, predicted from the model path, and the paths that make
graphs sort in part order (what Genie orders a split decoder's parts by)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_qnn_context import _compile, _toy  # noqa: E402

from modelexport.toolchain.qnn_context import read_context_binary
from modelexport.toolchain.qnn_graph_order import in_part_order, ordered_model_path, qnn_graph_name


def test_graphs_named_in_part_order_by_their_paths(tmp_path):
    """One model compiled by the real QNN EP from three ordered paths: the names read back are the
    ones predicted from the paths (the EP is the oracle of the hash) and sort as parts 1, 2, 3."""
    _toy(tmp_path / "toy.onnx")
    names = []
    for i in (3, 1, 2):                       # compile order does not matter
        path = ordered_model_path(tmp_path / "toy.onnx", i, 3, tmp_path / "links")
        out = tmp_path / f"part{i}"
        out.mkdir()
        _compile(str(path), out / "toy_ctx.onnx", 57, fp16=True)
        (graph,) = read_context_binary(next(out.glob("*.bin"))).graphs
        assert graph.name == qnn_graph_name(path)
        names.append((i, graph.name))
    in_order = [n for _, n in sorted(names)]
    assert in_part_order(in_order) and not in_part_order(in_order[::-1])
