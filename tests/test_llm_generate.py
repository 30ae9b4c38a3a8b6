"""Sampling rules with exact expectations, and the generation loop on a real tiny Llama through
the pure-torch static decoder (arN prefill chunks + ar1 decode, KV cache updated in place):
greedy output equals Hugging Face `generate`, stop conditions, streaming, chat cache reuse,
context overflow and the sliding window."""
from __future__ import annotations

import math

import pytest
import torch

from llm_tiny import VOCAB, hf_greedy, tiny_llama, tiny_tokenizer
from modelexport.core.errors import InputError
from modelexport.llm import Generator, SamplingConfig, StaticGraphSession
from modelexport.llm.run.generate import _StopMatcher
from modelexport.llm.run.sampling import Sampler, apply_repetition_penalty, filter_top_k, filter_top_p


# -------------------------------------------------------------------------------- sampling
def test_greedy_is_argmax():
    assert Sampler()(torch.tensor([0.1, 3.0, -1.0, 2.9])) == 1
    assert Sampler(SamplingConfig(temperature=0.0, seed=5))(torch.tensor([[1.0, 0.0, 5.0]])) == 2


def test_greedy_fast_path_matches_torch_argmax_and_leaves_torch_threads_alone():
    """Greedy picks with numpy and the other modes run torch on one thread (so ATen's OpenMP pool
    does not wake between two CPU forward passes); both must choose what torch.argmax chooses
    and restore torch's thread count."""
    from modelexport.llm.run.sampling import argmax

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(49152, generator=g).to(dtype)
        assert argmax(x) == int(torch.argmax(x)) == Sampler()(x.reshape(1, -1))
    ties = torch.tensor([1.0, 5.0, 5.0, 2.0])
    assert argmax(ties) == int(torch.argmax(ties)) == 1           # the first of equal maxima
    nan = torch.tensor([1.0, float("nan"), 7.0])
    assert argmax(nan) == int(torch.argmax(nan)) == 1             # NaN counts as the largest
    before = torch.get_num_threads()
    Sampler(SamplingConfig(temperature=0.8, top_p=0.9, seed=1))(torch.randn(1000, generator=g))
    Sampler(SamplingConfig(repetition_penalty=1.2))(torch.randn(1000, generator=g), history=[1, 2])
    assert torch.get_num_threads() == before


def test_repetition_penalty_follows_transformers():
    x = torch.tensor([2.0, -2.0, 1.0, 0.5])
    out = apply_repetition_penalty(x, [0, 1, 1], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]
    assert x.tolist() == [2.0, -2.0, 1.0, 0.5]           # the input is left alone
    # greedy with a penalty moves off the repeated token
    assert Sampler(SamplingConfig(repetition_penalty=3.0))(torch.tensor([3.0, 2.0]), history=[0]) == 1
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    ref = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([[0, 2, 2]]), torch.tensor([[1.5, -0.5, 0.7, -2.0]]))
    assert torch.equal(apply_repetition_penalty(torch.tensor([1.5, -0.5, 0.7, -2.0]), [0, 2, 2], 1.3), ref[0])


def test_top_k_and_top_p_filters():
    x = torch.tensor([1.0, 4.0, 3.0, 2.0])
    assert torch.isinf(filter_top_k(x, 2)).tolist() == [True, False, False, True]
    assert filter_top_k(x, 0) is x
    # probabilities 0.5, 0.3, 0.2: top-p 0.8 keeps the first two, 0.81 all three, 0.5 one
    logits = torch.log(torch.tensor([0.2, 0.5, 0.3]))
    assert torch.isinf(filter_top_p(logits, 0.8)).tolist() == [True, False, False]
    assert torch.isinf(filter_top_p(logits, 0.81)).tolist() == [False, False, False]
    assert torch.isinf(filter_top_p(logits, 0.5)).tolist() == [True, False, True]


def test_distribution_is_exact():
    logits = torch.tensor([0.0, math.log(2.0), math.log(3.0), math.log(4.0)])
    s = Sampler(SamplingConfig(temperature=1.0, seed=0))
    assert torch.allclose(s.distribution(logits), torch.tensor([0.1, 0.2, 0.3, 0.4]))
    s = Sampler(SamplingConfig(temperature=1.0, top_k=2, seed=0))
    assert torch.allclose(s.distribution(logits), torch.tensor([0.0, 0.0, 3 / 7, 4 / 7]))
    s = Sampler(SamplingConfig(temperature=1.0, top_p=0.65, seed=0))        # 0.4 + 0.3 >= 0.65
    assert torch.allclose(s.distribution(logits), torch.tensor([0.0, 0.0, 3 / 7, 4 / 7]))
    s = Sampler(SamplingConfig(temperature=0.5, seed=0))                    # p ∝ p0^2
    assert torch.allclose(s.distribution(logits), torch.tensor([1, 4, 9, 16]) / 30.0)
    s = Sampler(SamplingConfig(temperature=0.0))
    assert s.distribution(logits).tolist() == [0.0, 0.0, 0.0, 1.0]


def test_seed_reproduces_and_draws_follow_the_distribution():
    logits = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    a = Sampler(SamplingConfig(temperature=1.0, seed=1234))
    b = Sampler(SamplingConfig(temperature=1.0, seed=1234))
    da, db = [a(logits) for _ in range(2000)], [b(logits) for _ in range(2000)]
    assert da == db
    freq = torch.bincount(torch.tensor(da), minlength=4).float() / 2000
    assert torch.allclose(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.035)
    c = Sampler(SamplingConfig(temperature=1.0, seed=1235))
    assert [c(logits) for _ in range(2000)] != da
    k = Sampler(SamplingConfig(temperature=1.0, top_k=1, seed=9))
    assert {k(logits) for _ in range(50)} == {3}


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_k=-2), dict(top_p=0.0), dict(top_p=1.5),
                                 dict(repetition_penalty=0.0)])
def test_bad_sampling_options(bad):
    with pytest.raises(InputError):
        SamplingConfig(**bad)


def test_stop_matcher_holds_back_partial_stops():
    m = _StopMatcher(["END", "\n\n"])
    assert m.feed("hello E") == ("hello ", False)
    assert m.feed("N") == ("", False)
    assert m.feed("X more") == ("ENX more", False)
    assert m.feed(" and EN") == (" and ", False)
    assert m.feed("D tail") == ("", True)
    m = _StopMatcher(["\n\n"])
    assert m.feed("a\n") == ("a", False)
    assert m.feed("\nb") == ("", True)


# -------------------------------------------------------------------------------- the loop
@pytest.fixture(scope="module")
def tiny():
    from modelexport.llm.model.static_decoder import StaticDecoder, StaticDecoderConfig

    model = tiny_llama(2)
    tok = tiny_tokenizer()
    decoder = StaticDecoder(model, StaticDecoderConfig(n_tokens=8, max_seq_len=64))
    return model, tok, decoder


def _gen(tiny, n_tokens=(8, 1), **kw):
    model, tok, decoder = tiny
    session = StaticGraphSession.from_decoder(decoder, n_tokens)
    return Generator(session, tok, backend="torch-static", **kw)


def test_greedy_equals_transformers_across_prefill_chunks(tiny):
    model, tok, _ = tiny
    prompt = "The quick brown fox jumps"                 # 26 tokens: chunks 8+8+8+1+1
    ids = tok.encode(prompt)
    want = hf_greedy(model, ids, 20)
    for n_tokens in ((8, 1), (1,), (4, 1)):
        g = _gen(tiny, n_tokens)
        res = g.generate(prompt, max_new_tokens=20, stop_on_eos=False)
        assert res.token_ids == want, n_tokens
        assert res.prompt_ids == ids
        assert res.stats.generated_tokens == 20 and res.stats.stop_reason == "max_new_tokens"
    assert res.text == tok.decode(want, skip_special_tokens=True)


def test_prefill_progress_is_reported_per_chunk(tiny):
    """`on_prefill(done, total)`: before the first chunk and after each, the prompt alone (decode steps and a
    chat turn's reused tokens are not prefill); the tokens are those of a run without it."""
    calls = []
    g = _gen(tiny)
    prompt = "The quick brown fox jumps"                 # 26 tokens: ar8 chunks of 8, 8, 8, 2
    res = g.stream(prompt, max_new_tokens=5, stop_on_eos=False, on_prefill=lambda *a: calls.append(a))
    assert calls == [] and list(res)                      # nothing runs before the stream is read
    assert calls == [(0, 26), (8, 26), (16, 26), (24, 26), (26, 26)]
    assert res.result.token_ids == _gen(tiny).generate(prompt, max_new_tokens=5, stop_on_eos=False).token_ids
    calls.clear()
    ids = tiny[1].encode(prompt)
    turn = g.generate(ids + res.result.token_ids + ids[:3], max_new_tokens=1, reuse_cache=True,
                      on_prefill=lambda *a: calls.append(a))
    run = turn.stats.prefill_tokens                       # only what the cache did not hold
    assert run < len(turn.prompt_ids) and calls[0] == (0, run) and calls[-1] == (run, run)


def test_stream_pieces_and_stats(tiny):
    g = _gen(tiny)
    stream = g.stream("Hello there", max_new_tokens=12, stop_on_eos=False)
    pieces = list(stream)
    res = stream.result
    assert "".join(pieces) == res.text
    s = res.stats
    assert s.prompt_tokens == len(tiny[1].encode("Hello there")) == s.prefill_tokens
    assert s.time_to_first_token_s >= s.prefill_s > 0
    assert s.prefill_tokens_per_s > 0 and s.decode_tokens_per_s > 0 and s.decode_s > 0
    assert s.total_s >= s.time_to_first_token_s
    d = res.to_dict()
    assert d["stats"]["generated_tokens"] == 12 and d["text"] == res.text


def test_stops_on_eos_and_stop_strings(tiny):
    model, tok, _ = tiny
    ids = tok.encode("abc")
    free = hf_greedy(model, ids, 12)
    g = _gen(tiny)
    # declare a later token of the free run an EOS: the loop stops on its first occurrence
    j = next((i for i in range(1, len(free)) if free[i] not in free[:i]), 0)
    g.eos_ids = frozenset({free[j]})
    res = g.generate(ids, max_new_tokens=12)
    assert res.stats.stop_reason == "eos" and res.token_ids == free[:j + 1]
    assert res.text == tok.decode(free[:j], skip_special_tokens=True)     # the EOS itself is not text
    g = _gen(tiny)
    full = g.generate(ids, max_new_tokens=12, stop_on_eos=False).text
    stop = full[5:7]
    res = g.generate(ids, max_new_tokens=12, stop_on_eos=False, stop_strings=(stop,))
    assert res.stats.stop_reason == "stop_string"
    assert res.text == full[:full.index(stop)] and stop not in res.text


def test_sampling_with_a_seed_is_reproducible(tiny):
    g = _gen(tiny)
    a = g.generate("Once", max_new_tokens=16, temperature=8.0, top_k=50, top_p=0.95, seed=7, stop_on_eos=False)
    b = g.generate("Once", max_new_tokens=16, temperature=8.0, top_k=50, top_p=0.95, seed=7, stop_on_eos=False)
    c = g.generate("Once", max_new_tokens=16, temperature=8.0, top_k=50, top_p=0.95, seed=8, stop_on_eos=False)
    assert a.token_ids == b.token_ids and a.stats.seed == 7
    assert a.token_ids != c.token_ids


def test_context_overflow(tiny):
    g = _gen(tiny)                                          # max_seq_len 64
    with pytest.raises(InputError, match="context"):
        g.generate("x" * 80, max_new_tokens=4)
    with pytest.raises(InputError, match="empty"):
        g.generate("   ", max_new_tokens=4)
    res = g.generate("y" * 50, max_new_tokens=40, stop_on_eos=False)
    assert res.stats.stop_reason == "context_full"
    assert len(res.prompt_ids) + res.stats.generated_tokens == 65   # the last token needs no room
    res = g.generate("y" * 50, max_new_tokens=40, stop_on_eos=False, sliding_window=True)
    assert res.stats.stop_reason == "max_new_tokens" and res.stats.generated_tokens == 40
    assert res.stats.context_shifts >= 1


def test_attention_sink_keeps_the_first_tokens_when_the_window_slides(tiny):
    """At a slide the cache is rebuilt from the first N tokens and the newest ones: after it, the
    text is what a fresh run on exactly those tokens generates."""
    g = _gen(tiny)                                          # max_seq_len 64: a slide keeps 32 tokens
    seen = []
    slide = g._slide

    def spy(sink=0):
        before = list(g.history)
        logits = slide(sink)
        seen.append((before, list(g.history)))
        return logits
    g._slide = spy
    prompt = "Once upon a time " + "y" * 40
    res = g.generate(prompt, max_new_tokens=30, stop_on_eos=False, sliding_window=True, attention_sink=4)
    assert res.stats.context_shifts == 1 and res.stats.generated_tokens == 30
    (before, kept), = seen
    context = res.prompt_ids + res.token_ids
    assert before == context[:len(before)]
    assert kept == before[:4] + before[-28:]               # the sink (the prompt's first 4 tokens) + the newest
    after = context[len(before):]                            # generated from the slid window on
    fresh = _gen(tiny).generate(kept, max_new_tokens=len(after), stop_on_eos=False)
    assert after and fresh.token_ids == after
    with pytest.raises(InputError, match="--sliding-window"):
        g.generate("hi", max_new_tokens=4, attention_sink=4)


def test_chat_reuses_the_cache_and_matches_a_fresh_run(tiny):
    from modelexport.llm.model.static_decoder import StaticDecoder, StaticDecoderConfig

    model, tok, _ = tiny
    wide = (model, tok, StaticDecoder(model, StaticDecoderConfig(n_tokens=8, max_seq_len=160)))
    g = _gen(wide)
    chat = g.chat(system="be nice")
    r1 = chat.send("hi", max_new_tokens=6, stop_on_eos=False)
    r2 = chat.send("more", max_new_tokens=6, stop_on_eos=False)
    assert r2.stats.prefill_tokens < r2.stats.prompt_tokens     # the first turn stayed in the cache
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "user", "assistant"]
    fresh = _gen(wide).generate(r2.prompt_ids, max_new_tokens=6, stop_on_eos=False)
    assert fresh.token_ids == r2.token_ids


def test_chat_forgets_the_oldest_turns_when_the_context_fills(tiny):
    g = _gen(tiny)                                          # 64 positions, 16 kept for the reply
    chat = g.chat(system="s")
    for text in ("first question", "second question", "third one"):
        r = chat.send(text, max_new_tokens=4, stop_on_eos=False)
        assert r.stats.prompt_tokens <= 48
    assert chat.messages[0] == {"role": "system", "content": "s"}
    assert chat.messages[1]["content"] != "first question"   # dropped
    assert chat.messages[-2] == {"role": "user", "content": "third one"}


def test_token_ids_outside_the_vocabulary_are_rejected(tiny):
    g = _gen(tiny)
    with pytest.raises(InputError, match="vocabulary"):
        g.generate([1, 2, VOCAB + 5], max_new_tokens=2)
