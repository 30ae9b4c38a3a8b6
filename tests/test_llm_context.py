"""Several context lengths over one copy of the weights (`compile --context-lengths`), on a tiny
Llama: one weight-shared binary holding every (N, C) graph, our loop moving from the short graphs to
the long ones as a dialog grows (logits held against the float model on both sides of the boundary,
the same as the long graphs alone), a reset then a long prompt giving a fresh run's tokens, and
Genie's own dialog on the host twins giving our loop's tokens across the boundary and after a reset.
The same on a tiny Gemma 3, whose local layers slide an 8-token window over the cache."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import assert_clean_error  # noqa: E402
from llm_tiny import tiny_llama, tiny_llm_work, tiny_tokenizer  # noqa: E402
from llm_tiny_families import save_tiny_family_folder  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHORT, LONG = 32, 64
TEXT = "Markets rose on Tuesday as investors weighed the outlook. " * 3


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    with tiny_llm_work(tmp_path_factory, "llm_context") as root:
        save_tiny_family_folder("gemma3_text", root / "gemma3_text", seed=1)   # a sliding-window family
        yield root


@pytest.fixture(scope="module", params=["tiny_hf", "gemma3_text"])
def bundle(work, request):
    import modelexport
    folder = request.param
    return modelexport.compile(str(work / folder), output=work / f"bundle_{folder}", target="SM8650", precision="16a8w",
                               variants="ar1,ar4", context_lengths=f"{SHORT},{LONG}", calibration=str(work / "calib.txt"),
                               calibration_samples=4, rounding="nearest")


def _runner(bundle, lengths: set[int] | None = None):
    """Our loop over the bundle's simulator graphs (only those of `lengths`, when given)."""
    from modelexport.backends.llm_qnn.session import open_forwards
    from modelexport.llm.run.static_runner import StaticRunner
    graphs, spec, seq = open_forwards(bundle, "htp-sim")
    if lengths is not None:
        graphs = {k: g for k, g in graphs.items() if (k[1] if isinstance(k, tuple) else seq) in lengths}
    return StaticRunner(graphs, spec, seq)


def test_one_binary_holds_every_length_with_the_weights_once(bundle):
    m = bundle.manifest
    assert m.llm.context_lengths == [SHORT, LONG] and m.llm.max_seq_len == LONG
    assert sorted((g.name, g.context_len) for g in m.graphs) == [
        (f"prompt_ar4_cl{SHORT}_1_of_1", SHORT), (f"prompt_ar4_cl{LONG}_1_of_1", LONG),
        (f"token_ar1_cl{SHORT}_1_of_1", SHORT), (f"token_ar1_cl{LONG}_1_of_1", LONG)]
    ws = next(iter(m.llm.weight_sharing.values()))
    assert len(ws.graphs) == 4 and ws.weights_stored_once and ws.bytes < ws.unshared_twins_bytes
    assert m.llm.genie["SM8650"].dialog_created
    short = [g for g in m.graphs if g.context_len == SHORT]
    for g in short:                                # caches of C - N entries: keys [.., head_dim, C-N], values [.., C-N, head_dim]
        shapes = {i.name: i.shape for i in g.inputs}
        assert shapes["past_key_0_in"][-1] == shapes["past_value_0_in"][-2] == SHORT - g.n_tokens


def test_our_loop_moves_to_the_long_graphs_and_holds_the_float_logits(bundle):
    from transformers import AutoModelForCausalLM

    from modelexport.core.numerics import sqnr_db
    ids = tiny_tokenizer().encode(TEXT)[:LONG - 4]
    with torch.no_grad():
        folder = bundle.manifest.source.path
        ref = AutoModelForCausalLM.from_pretrained(folder).eval()(torch.tensor([ids])).logits[0].numpy()
    both, long_only = _runner(bundle), _runner(bundle, {LONG})
    got = np.concatenate([both.run_chunk([t], 1).numpy() for t in ids])
    alone = np.concatenate([long_only.run_chunk([t], 1).numpy() for t in ids])
    assert set(both.lengths) == {SHORT, LONG} and both.lengths.index(LONG) == SHORT   # moved once the short one was full
    # the precision's usual distance from float is what the long graphs alone give at the same positions
    for a, z in ((SHORT - 8, SHORT), (SHORT, SHORT + 8), (0, len(ids))):
        assert abs(sqnr_db(ref[a:z], got[a:z]) - sqnr_db(ref[a:z], alone[a:z])) < 1.0, (a, z)
    assert sqnr_db(ref, got) > 12                       # far from noise (16a8w on these tiny random models: 15-26 dB)
    assert sqnr_db(alone, got) > 30                     # the short graphs compute what the long ones do
    assert (got.argmax(-1) == alone.argmax(-1)).mean() > 0.95


def test_a_reset_then_a_long_prompt_gives_a_fresh_runs_tokens(bundle):
    import modelexport.llm as llm
    model = llm.load(bundle.path, backend="htp-sim")
    first = model.generate("The quick brown fox", max_new_tokens=40).token_ids   # past the short length
    long_prompt = tiny_tokenizer().encode(TEXT)[:SHORT + 6]                       # longer than the short length
    again = model.generate(long_prompt, max_new_tokens=12).token_ids
    fresh = llm.load(bundle.path, backend="htp-sim").generate(long_prompt, max_new_tokens=12).token_ids
    assert again == fresh and len(first) == 40


def test_genie_moves_between_lengths_and_resets_like_our_loop(bundle):
    import modelexport.llm as llm
    from modelexport.backends.llm_qnn.genie_dialog import genie_turns, sampler_block
    tok = tiny_tokenizer()
    model = llm.load(bundle.path, backend="htp-sim")
    turns = [(tok.encode("The quick brown fox"), 40), (tok.encode(TEXT)[:SHORT + 6], 12)]
    ours = [model.generate(ids, max_new_tokens=n).token_ids for ids, n in turns]
    genie = genie_turns(bundle, "SM8650", turns, sampler_block())
    assert genie[0][:len(ours[0])] == ours[0] and genie[1] == ours[1], (genie, ours)


def test_the_runner_moves_up_a_length_with_the_same_cache():
    """Pure torch: eager decoders at two lengths give, token by token, the logits of the long one alone."""
    from modelexport.llm.model.static_decoder import StaticDecoderConfig, build_static_decoder
    from modelexport.llm.run.static_runner import StaticRunner
    model = tiny_llama(2, seed=1, tie_word_embeddings=False)

    def graph(n, c):
        dec = build_static_decoder(model, StaticDecoderConfig(n, c))
        return lambda *x: dec(*x)
    graphs = {(n, c): graph(n, c) for n in (1, 4) for c in (SHORT, LONG)}
    ids = tiny_tokenizer().encode(TEXT)[:LONG - 2]
    spec = build_static_decoder(model, StaticDecoderConfig(1, LONG)).spec
    both = StaticRunner(graphs, spec, LONG)
    alone = StaticRunner({n: graphs[(n, LONG)] for n in (1, 4)}, spec, LONG)
    with torch.no_grad():
        got = torch.cat([both.feed(ids[:20]), *[both.run_chunk([t], 1) for t in ids[20:]]])
        ref = torch.cat([alone.feed(ids[:20]), *[alone.run_chunk([t], 1) for t in ids[20:]]])
    assert both.lengths[:5] == [SHORT] * 5 and both.lengths[-1] == LONG and alone.lengths == [LONG] * len(alone.lengths)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert both.fits(4) is None and both.fits(1) == LONG     # 62 cached: only ar1 still fits, at the long length


@pytest.mark.parametrize("flags, needle", [
    (["--context-lengths", "64,32"], "not increasing"),
    (["--context-lengths", "32,abc"], "is not a context length"),
    (["--context-lengths", "32,64", "--max-seq-len", "128"], "differs from the longest"),
    (["--context-lengths", "4,64", "--variants", "ar1,ar4"], "larger than the largest variant"),
    (["--context-lengths", "32,100000", "--variants", "ar1,ar4"], "--context-lengths 100000 is beyond"),
    (["--context-lengths", "32,64", "--executorch-program"], "one context length"),
])
def test_bad_context_lengths_are_refused_before_loading(work, cli_here, flags, needle):
    proc = cli_here("compile", str(work / "tiny_hf"), "-o", str(work / "refused"), *flags)
    assert_clean_error(proc, needle)
    assert not (work / "refused").exists()
