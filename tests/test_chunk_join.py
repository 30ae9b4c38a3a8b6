"""Chunks of a decoder part, each quantized by ONNX Runtime as it is (no weight rewrite: 16a8w), joined
into one graph (quant/chunk_join.py): the joined graph computes what the chunks compute one after the
other, on ONNX Runtime's CPU. ONNX Runtime's quantizer stores large Constant values outside the graph
too, so the join must move those offsets as it moves the initializers'."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).parent))
from llm_tiny import random_graph_feed, tiny_llama  # noqa: E402


def _feeds(path, rng):
    return random_graph_feed(onnx.load(str(path), load_external_data=False), rng)


def test_joined_chunks_compute_the_chunks_one_after_the_other(tmp_path):
    import onnxruntime as ort

    from modelexport.llm.export.onnx_export import export_part, part_input_names, part_output_names
    from modelexport.llm.model.parts import Chunk, PartRange
    from modelexport.llm.model.static_decoder import ONNX_RMS_NORM, StaticDecoderConfig, build_static_decoder
    from modelexport.quant.calibration import CalibrationSet
    from modelexport.quant.chunk_join import external_entry, join_chunks, node_tensors
    from modelexport.quant.llm_graphs import DEFAULT_OVERRIDES, parse_overrides, quantize_decoder

    # three chunks: the middle one (no embedding, no head) lays its data file out unlike the others
    dec = build_static_decoder(tiny_llama(n_layers=3), StaticDecoderConfig(4, 32), rms_norm=ONNX_RMS_NORM)
    part = PartRange(1, 1, 0, 3)
    chunks = [Chunk(part, i + 1, 3, i, i + 1) for i in range(3)]
    rng = np.random.default_rng(0)
    quantized = []
    for c in chunks:
        fpath = export_part(dec, c, tmp_path / f"float{c.index}" / "g.onnx")
        samples = [_feeds(fpath, rng) for _ in range(3)]
        qpath = tmp_path / f"q{c.index}" / "g.onnx"
        qpath.parent.mkdir()
        quantize_decoder(fpath, qpath, "16a8w", parse_overrides(list(DEFAULT_OVERRIDES), "16a8w"),
                         CalibrationSet(samples, "arrays", "test"))
        quantized.append(qpath)
    middle = onnx.load(str(quantized[1]), load_external_data=False)
    assert any(external_entry(t) for t in node_tensors(middle.graph.node))     # the case the join must handle
    joined = join_chunks([(p, c.end_layer) for p, c in zip(quantized, chunks)], tmp_path / "joined" / "g.onnx",
                         part_input_names(part), part_output_names(part))

    def run(path, feed):
        s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [o.name for o in s.get_outputs()]
        return dict(zip(names, s.run(None, {i.name: feed[i.name] for i in s.get_inputs()})))
    feed = _feeds(joined, rng)
    whole = run(joined, feed)
    hidden, outs = None, {}
    for p in quantized:
        outs.update(run(p, feed if hidden is None else {**feed, "hidden_states": hidden}))
        hidden = outs.pop("hidden_states_out", None)
    assert whole.keys() == outs.keys()
    for name, value in whole.items():
        np.testing.assert_array_equal(value, outs[name], err_msg=name)
