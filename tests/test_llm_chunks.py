"""A part exported and quantized in chunks of layers on the host (what keeps a 1B-4B compile's
memory at the chunk's size), joined into the part's one graph: the same QDQ graph, numerically,
as the part exported whole; compiled and checked on the HTP simulator like any other."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from llm_tiny import CALIBRATION_TEXT, tiny_tokenizer, write_tiny_llm_folder  # noqa: E402

SEQ = 64


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("llm_chunks")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache-chunks"))
        yield write_tiny_llm_folder(root, n_layers=3)


def _compile(work, out, **kw):
    import modelexport
    return modelexport.compile(str(work / "tiny_hf"), output=work / out, target="SM8650", precision="16a4w_block",
                               variants="ar1,ar4", max_seq_len=SEQ, calibration=str(work / "calib.txt"),
                               calibration_samples=3, block_size=16, **kw)


def test_a_part_in_chunks_is_the_part_exported_whole(work):
    from modelexport.backends.llm_qnn.session import open_forwards
    from modelexport.core.numerics import compare
    from modelexport.llm.static_runner import StaticRunner

    whole = _compile(work, "whole")
    chunked = _compile(work, "chunked", host_chunk_mb=0.001)     # one layer per chunk
    assert chunked.manifest.options["host_chunks"]["layers"] == [[0, 1], [1, 2], [2, 3]]
    assert whole.manifest.options["host_chunks"]["layers"] == [[0, 3]]
    assert chunked.manifest.llm.n_parts == 1 and len(chunked.manifest.graphs) == 2
    q = chunked.manifest.llm.quantization["prompt_ar4_cl64_1_of_1"]
    assert q["chunks"] == 3 and q["modules"] == whole.manifest.llm.quantization["prompt_ar4_cl64_1_of_1"]["modules"]
    ids = tiny_tokenizer().encode("The quick brown fox jumps")[:8]
    logits = {}
    for name, b in (("whole", whole), ("chunked", chunked)):
        graphs, spec, seq = open_forwards(b, "fake-quant")
        logits[name] = StaticRunner(graphs, spec, seq).feed(ids).numpy()
    np.testing.assert_allclose(logits["chunked"], logits["whole"], atol=1e-4)
    # the joined graphs on the HTP as the QNN EP reported it (only IO Q/DQ on the CPU, as whole)
    for graph, per_target in chunked.manifest.placement.items():
        cpu = per_target["SM8650"]["cpu_nodes"]
        assert all("QuantizeLinear" in n or "DequantizeLinear" in n for n in cpu), (graph, cpu)
        assert len(cpu) == len(whole.manifest.placement[graph]["SM8650"]["cpu_nodes"])
    # the simulator runs the joined graphs as it runs the whole ones
    graphs, spec, seq = open_forwards(chunked, "htp-sim")
    sim = StaticRunner(graphs, spec, seq).feed(ids).numpy()
    graphs, spec, seq = open_forwards(whole, "htp-sim")
    assert compare(sim, StaticRunner(graphs, spec, seq).feed(ids).numpy())["sqnr_db"] > 40
