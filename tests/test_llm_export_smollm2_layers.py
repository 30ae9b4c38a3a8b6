"""The real SmolLM2-135M weights, cut to their first 2 layers (an HF folder the test saves from the
GGUF), compiled as the full model is (16a4w_block, SM8650, ar1 + ar32, here max-seq-len 128) in
about a minute: part of `make test`, where the full model's compile (4-5 min) and simulator
generation are not (`make test-heavy`). Checks the simulator against the QDQ graph on real text
(25.5 dB before the RoPE lookup fix, ~45 dB after) and the weight-shared binary."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.smollm2, pytest.mark.slow]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory, smollm2_gguf):
    import modelexport
    from llm_tiny import save_real_layers

    folder = save_real_layers(smollm2_gguf, tmp_path_factory.mktemp("smol2") / "hf", 2)
    # module-scoped fixtures run before the function-scoped cache isolation: isolate here too
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MODELEXPORT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "modelexport-cache"))
        return modelexport.compile(str(folder), output=folder.parent / "bundle", target="SM8650",
                                   variants="ar1,ar32", max_seq_len=128)


def test_simulator_runs_what_the_qdq_graph_says(bundle):
    from modelexport.runtime.evaluate import evaluate
    res = evaluate(bundle.path, stages=["float", "fake-quant", "htp-sim"], window=128, max_tokens=128,
                   sim_window=64, sim_tokens=64)
    sqnr = {k: v["sqnr_db"] for k, v in res["sqnr"].items()}
    assert sqnr["fake-quant vs htp-sim"] > 40, sqnr
    # quantization, not the simulator, is what separates the compiled graph from float
    assert abs(sqnr["float vs htp-sim"] - sqnr["float vs fake-quant"]) < 2, sqnr


def test_weight_shared_binary_holds_both_graphs(bundle):
    ws = bundle.manifest.llm.weight_sharing["SM8650/1"]
    assert len(ws.graphs) == 2 and ws.weights_stored_once
    assert ws.bytes < ws.unshared_twins_bytes * 0.75
    placement = bundle.manifest.placement
    assert set(placement) == {"prompt_ar32_cl128_1_of_1", "token_ar1_cl128_1_of_1"}
    for graph in placement.values():
        # only the float graph inputs' and outputs' Q/DQ at the boundary stay on the CPU
        assert all(n.startswith(("attention_mask", "past_", "new_", "logits")) for n in graph["SM8650"]["cpu_nodes"])


def test_genie_runs_the_bundle_as_our_loop_does(bundle):
    """Real weights give varied tokens: Genie's own dialog (libGenie.so on the host twins) and our
    loop over the same binaries agree token for token, greedy: the prompt graph, then 4 decode
    steps, each reading the cache the one before wrote (every token is a simulator run of the
    whole graph, seconds each: 8 tokens were ~45% of this file's wall time)."""
    import modelexport.llm as llm
    prompt = "The capital of France is"
    ours = llm.load(bundle.path, backend="htp-sim").generate(prompt, max_new_tokens=5)
    genie = llm.load(bundle.path, backend="genie").generate(prompt, max_new_tokens=5)
    assert len(set(ours.token_ids)) >= 2, ours.token_ids     # not one token repeated
    assert genie.token_ids == ours.token_ids
    assert bundle.manifest.llm.genie["SM8650"].dialog_created
